#!/usr/bin/env bash
# disable_by_goodput (spec/goodput.h) on Spec-Bench (../shared/data/spec_bench/question.jsonl):
# n-gram, Medusa and the EAGLE tree (8 nodes; also pruned with draft_p_min 0.5), each without and
# with disable_by_goodput, beside plain decoding in one run; per task and overall the decode
# speedup, tokens per target step and acceptance; greedy outputs checked against the baseline.
#   batch 1: the first 2 questions of each of the six tasks, 64 tokens;
#   batch 8: the first 8 questions of each task, 32 tokens (without the two configurations that
#            run at a quarter of plain decoding's speed there: the unpruned EAGLE tree and Medusa
#            without goodput; bench/results/spec_trees_b8_2026-12-05.md has them).
# Writes bench/results/spec_goodput_b1_<date>.{json,md,png} and spec_goodput_b8_<date>.*.
# Usage: bench/run_goodput_bench.sh [THREADS]     (--help: this text)
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then sed -n "2,11p" "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
here="$(cd "$(dirname "$0")/.." && pwd)"
threads="${1:-$(nproc)}"
model="$("$here/scripts/fetch-model.sh" | tail -n 1)"
"$here/scripts/build.sh"
py="$("$here/scripts/venv.sh" --with-plot)"
day="$(date +%Y-%m-%d)"
medusa="$here/models/heads/medusa-smollm2-135m.gguf"
eagle="$here/models/heads/eagle-smollm2-135m.gguf"
ngram='"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":5'
med="\"method\":\"medusa\",\"model\":\"$medusa\",\"num_speculative_tokens\":4,\"draft_vocab_size\":8192"
tree="\"method\":\"eagle\",\"model\":\"$eagle\",\"num_speculative_tokens\":8,\"eagle_topk\":4,\"eagle_depth\":4,\"draft_vocab_size\":8192"
pruned="$tree,\"draft_p_min\":0.5"
gp=',"disable_by_goodput":true'
b1="$here/bench/results/spec_goodput_b1_$day"
"$here/build/bin/specserve" bench-spec --model "$model" --threads "$threads" --per-task 2 --max-tokens 64 --batch-sizes 1 \
  --spec "{$ngram}" --spec "{$ngram$gp}" --spec "{$med}" --spec "{$med$gp}" \
  --spec "{$tree}" --spec "{$tree$gp}" --spec "{$pruned}" --spec "{$pruned$gp}" \
  --output "$b1.json" | tee "$b1.md"
"$py" "$here/bench/plot_spec_bench.py" "$b1.json"
b8="$here/bench/results/spec_goodput_b8_$day"
"$here/build/bin/specserve" bench-spec --model "$model" --threads "$threads" --per-task 8 --max-tokens 32 --batch-sizes 8 \
  --spec "{$ngram}" --spec "{$ngram$gp}" --spec "{$med$gp}" --spec "{$tree$gp}" --spec "{$pruned}" --spec "{$pruned$gp}" \
  --output "$b8.json" | tee "$b8.md"
"$py" "$here/bench/plot_spec_bench.py" "$b8.json"
