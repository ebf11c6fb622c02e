#!/usr/bin/env bash
# The speculative benchmark of issue 3 on Spec-Bench (../shared/data/spec_bench/question.jsonl):
# for each method and k, per task and overall, the decode speedup over no speculation in the
# same run, tokens/s, acceptance rate and mean accepted tokens per step, greedy; outputs are
# checked token for token against the baseline. Adaptive k is compared with fixed k.
#   batch 1: the first 3 questions of each of the six tasks (first turn, chat template), 128 tokens;
#   batch 8: the first 8 questions of each task, 64 tokens, batches of 8 questions of one task.
# Writes bench/results/spec_bench_b1_<date>.{json,md,png} and spec_bench_b8_<date>.*.
# Usage: bench/run_spec_bench.sh [THREADS]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
threads="${1:-$(nproc)}"
model="$("$here/scripts/fetch-model.sh" | tail -n 1)"
"$here/scripts/build.sh"
py="$("$here/scripts/venv.sh" --with-plot)"
day="$(date +%Y-%m-%d)"
b1="$here/bench/results/spec_bench_b1_$day"
"$here/build/bin/specserve" bench-spec --model "$model" --threads "$threads" --per-task 3 --max-tokens 128 \
  --batch-sizes 1 \
  --spec '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":5}' \
  --spec '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":5,"adaptive_k":false}' \
  --spec '{"method":"ngram","num_speculative_tokens":8,"prompt_lookup_min":1,"prompt_lookup_max":5}' \
  --spec '{"method":"layer_skip","num_speculative_tokens":3,"num_layers":24}' \
  --spec '{"method":"layer_skip","num_speculative_tokens":3,"num_layers":24,"adaptive_k":false}' \
  --output "$b1.json" | tee "$b1.md"
"$py" "$here/bench/plot_spec_bench.py" "$b1.json"
b8="$here/bench/results/spec_bench_b8_$day"
"$here/build/bin/specserve" bench-spec --model "$model" --threads "$threads" --per-task 8 --max-tokens 64 \
  --batch-sizes 8 \
  --spec '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":5}' \
  --spec '{"method":"layer_skip","num_speculative_tokens":3,"num_layers":24}' \
  --output "$b8.json" | tee "$b8.md"
"$py" "$here/bench/plot_spec_bench.py" "$b8.json"
