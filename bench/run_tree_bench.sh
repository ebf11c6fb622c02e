#!/usr/bin/env bash
# The tree-speculation benchmark of issue 6 on Spec-Bench (../shared/data/spec_bench/question.jsonl):
# Medusa and EAGLE (the committed heads in models/heads/; EAGLE as the 8-node tree and as the
# 2-token chain that is fastest on the CPU, bench/results/eagle_sharegpt_2026-12-02.md; both trees
# also with draft_p_min, which drops the nodes the heads are unsure of; the chain and the pruned Medusa
# tree also behind prompt lookup first with earlier requests' outputs) beside ngram (also with those
# outputs), layer_skip and draft_model,
# all in one run against the same baseline; per task and overall the decode speedup, mean accepted
# tokens per step and acceptance by depth; greedy outputs checked token for token against the baseline.
#   batch 1: the first 2 questions of each of the six tasks (first turn, chat template), 64 tokens;
#   batch 8: the first 8 questions of each task, 32 tokens, batches of 8 questions of one task.
# draft_model has no smaller model with SmolLM2's vocabulary to use here: it runs the target itself
# as its draft (acceptance ceiling, cost about 2x), stated as such in the results.
# Writes bench/results/spec_trees_b1_<date>.{json,md,png} and spec_trees_b8_<date>.*; with
# SPECSERVE_CPU_MATMUL set (e.g. amx, cpu/matmul.h) the names end in -<kernel>. The heads are the
# Q8_0 files (models/heads/*.q8_0.gguf) unless HEAD_FORMAT=f16. QUESTIONS: another
# question.jsonl (default: the checkout's ../shared/data/spec_bench/question.jsonl).
# Usage: bench/run_tree_bench.sh [THREADS]     (--help: this text)
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then sed -n "2,18p" "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
here="$(cd "$(dirname "$0")/.." && pwd)"
threads="${1:-$(nproc)}"
# The heads' Q8_0 copies (what serving uses; models/heads/README.md); HEAD_FORMAT=f16 for the
# trainers' F16 files (the runs before 2026-12-06). Checked before anything is fetched or built.
case "$(echo "${HEAD_FORMAT:-q8_0}" | tr '[:upper:]' '[:lower:]')" in
  q8_0) ext=".q8_0.gguf" ;;
  f16) ext=".gguf" ;;
  *) echo "run_tree_bench.sh: HEAD_FORMAT = '$HEAD_FORMAT': expected q8_0 or f16" >&2; exit 2 ;;
esac
questions="${QUESTIONS:-$here/../shared/data/spec_bench/question.jsonl}"
[ -r "$questions" ] || { echo "run_tree_bench.sh: cannot read the Spec-Bench questions $questions (set QUESTIONS)" >&2; exit 2; }
model="$("$here/scripts/fetch-model.sh" | tail -n 1)"
"$here/scripts/build.sh"
py="$("$here/scripts/venv.sh" --with-plot)"
day="$(date +%Y-%m-%d)"
kernel="$(echo "${SPECSERVE_CPU_MATMUL:-}" | tr -d ' \t' | tr '[:upper:]' '[:lower:]')"
[ -z "$kernel" ] || day="$day-$kernel"
medusa="$here/models/heads/medusa-smollm2-135m$ext"
eagle="$here/models/heads/eagle-smollm2-135m$ext"
specs=(
  --spec '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":5}'
  --spec '{"method":"layer_skip","num_speculative_tokens":3,"num_layers":24}'
  --spec "{\"method\":\"draft_model\",\"model\":\"$model\",\"num_speculative_tokens\":4}"
  --spec "{\"method\":\"medusa\",\"model\":\"$medusa\",\"num_speculative_tokens\":4,\"draft_vocab_size\":8192}"
  --spec "{\"method\":\"eagle\",\"model\":\"$eagle\",\"num_speculative_tokens\":8,\"eagle_topk\":4,\"eagle_depth\":4,\"draft_vocab_size\":8192}"
  --spec "{\"method\":\"eagle\",\"model\":\"$eagle\",\"num_speculative_tokens\":2,\"eagle_topk\":1,\"eagle_depth\":2,\"draft_vocab_size\":8192}"
  --spec "{\"method\":\"medusa\",\"model\":\"$medusa\",\"num_speculative_tokens\":8,\"draft_vocab_size\":8192,\"draft_p_min\":0.3}"
  --spec "{\"method\":\"eagle\",\"model\":\"$eagle\",\"num_speculative_tokens\":8,\"eagle_topk\":4,\"eagle_depth\":4,\"draft_vocab_size\":8192,\"draft_p_min\":0.5}"
  # The hybrids: prompt lookup first (spec/lookup_first_proposer.h) and earlier requests' outputs
  # (lookup_cached_requests, spec/lookup_history.h; they grow over the run's questions).
  --spec '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":5,"lookup_cached_requests":1000}'
  --spec "{\"method\":\"eagle\",\"model\":\"$eagle\",\"num_speculative_tokens\":2,\"eagle_topk\":1,\"eagle_depth\":2,\"draft_vocab_size\":8192,\"prompt_lookup_min\":2,\"prompt_lookup_max\":5,\"lookup_cached_requests\":1000}"
  --spec "{\"method\":\"medusa\",\"model\":\"$medusa\",\"num_speculative_tokens\":8,\"draft_vocab_size\":8192,\"draft_p_min\":0.3,\"prompt_lookup_min\":2,\"prompt_lookup_max\":5,\"lookup_cached_requests\":1000}"
)
b1="$here/bench/results/spec_trees_b1_$day"
"$here/build/bin/specserve" bench-spec --model "$model" --threads "$threads" --questions "$questions" --per-task 2 --max-tokens 64 \
  --batch-sizes 1 "${specs[@]}" --output "$b1.json" | tee "$b1.md"
"$py" "$here/bench/plot_spec_bench.py" "$b1.json"
b8="$here/bench/results/spec_trees_b8_$day"
"$here/build/bin/specserve" bench-spec --model "$model" --threads "$threads" --questions "$questions" --per-task 8 --max-tokens 32 \
  --batch-sizes 8 "${specs[@]}" --output "$b8.json" | tee "$b8.md"
"$py" "$here/bench/plot_spec_bench.py" "$b8.json"
