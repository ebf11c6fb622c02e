#!/usr/bin/env bash
# The committed speculative heads in F16 (models/heads/*-smollm2-135m.gguf) against their Q8_0
# copies (models/heads/*.q8_0.gguf, tools/train/quantize_head.py) on Spec-Bench, batch 1, greedy,
# in one bench-spec run per CPU matmul kernel: the EAGLE 2-token chain, the EAGLE 4x4 tree with
# draft_p_min 0.5 and Medusa k 4 (all with draft_vocab_size 8192), beside n-gram and the baseline;
# the first 2 questions of each task, 64 tokens. Reports speedups, acceptance and, per engine step,
# the time in the proposer, in target passes and in the rest (bench-spec's time table).
# Writes bench/results/heads_q8_ab_b1_<date>-<kernel>[-<TAG>].{md,json,png} for each kernel in
# KERNELS (default "vnni avx512"; a kernel the CPU lacks falls back, as cpu/matmul.h says, and the
# file records the kernel that ran: "cpu_matmul"); TAG (e.g. run1, run2) keeps repeated runs apart.
# Env: QUESTIONS (default: bench-spec's own, the checkout's ../shared/data/spec_bench/question.jsonl).
# Usage: bench/run_head_formats_ab.sh [THREADS] [TAG]     (--help: this text)
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then sed -n "2,12p" "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
here="$(cd "$(dirname "$0")/.." && pwd)"
threads="${1:-$(nproc)}"
if [ -n "${2:-}" ] && ! [[ "$2" =~ ^[A-Za-z0-9._-]+$ ]]; then
  echo "run_head_formats_ab.sh: TAG = '$2': use letters, digits, '.', '_' or '-' (it goes into file names)" >&2; exit 2
fi
tag="${2:+-$2}"
questions="${QUESTIONS:-$here/../shared/data/spec_bench/question.jsonl}"
[ -r "$questions" ] || { echo "run_head_formats_ab.sh: cannot read the Spec-Bench questions $questions (set QUESTIONS)" >&2; exit 2; }
model="$("$here/scripts/fetch-model.sh" | tail -n 1)"
"$here/scripts/build.sh"
py="$("$here/scripts/venv.sh" --with-plot)"
day="$(date +%Y-%m-%d)"
h="$here/models/heads"
chain='"num_speculative_tokens":2,"eagle_topk":1,"eagle_depth":2,"draft_vocab_size":8192'
tree='"num_speculative_tokens":8,"eagle_topk":4,"eagle_depth":4,"draft_vocab_size":8192,"draft_p_min":0.5'
med='"num_speculative_tokens":4,"draft_vocab_size":8192'
specs=(--spec '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":5}')
for pair in "eagle:$chain" "eagle:$tree" "medusa:$med"; do
  method="${pair%%:*}" rest="${pair#*:}"
  for file in "$method-smollm2-135m.gguf" "$method-smollm2-135m.q8_0.gguf"; do
    specs+=(--spec "{\"method\":\"$method\",\"model\":\"$h/$file\",$rest}")
  done
done
for kernel in ${KERNELS:-vnni avx512}; do
  out="$here/bench/results/heads_q8_ab_b1_$day-$kernel$tag"
  # The report goes to a .part file first: a failed run leaves no empty .md behind.
  SPECSERVE_CPU_MATMUL="$kernel" "$here/build/bin/specserve" bench-spec --model "$model" --threads "$threads" \
    --questions "$questions" --per-task 2 --max-tokens 64 --batch-sizes 1 "${specs[@]}" --output "$out.json" | tee "$out.md.part"
  mv "$out.md.part" "$out.md"
  "$py" "$here/bench/plot_spec_bench.py" "$out.json"
done
