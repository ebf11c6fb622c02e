#!/usr/bin/env bash
# Batch-1 Spec-Bench comparison of head configurations (issue 6): the committed tree configurations
# of bench/run_tree_bench.sh against small chains (each verified node costs a share of a step on
# the CPU), for the committed heads and, optionally, another pair of heads (e.g. the previous
# ones) in the same run against the same baseline. Greedy; outputs checked against the baseline.
# Writes bench/results/head_configs_b1_<date>.{json,md,png}.
# Usage: bench/run_head_configs_bench.sh [THREADS] [OLD_HEADS_DIR]     (--help: this text)
#   OLD_HEADS_DIR: a folder with medusa-smollm2-135m.gguf and eagle-smollm2-135m.gguf to compare
#   (their committed configurations only). Env: PER_TASK (default 2), MAX_TOKENS (default 64),
#   QUESTIONS (default: bench-spec's own, ../shared/data/spec_bench/question.jsonl).
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then sed -n "2,12p" "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
here="$(cd "$(dirname "$0")/.." && pwd)"
threads="${1:-$(nproc)}"
old="${2:-}"
model="$("$here/scripts/fetch-model.sh" | tail -n 1)"
"$here/scripts/build.sh"
py="$("$here/scripts/venv.sh" --with-plot)"
day="$(date +%Y-%m-%d)"
medusa="$here/models/heads/medusa-smollm2-135m.gguf"
eagle="$here/models/heads/eagle-smollm2-135m.gguf"
specs=(
  --spec "{\"method\":\"eagle\",\"model\":\"$eagle\",\"num_speculative_tokens\":8,\"eagle_topk\":4,\"eagle_depth\":4,\"draft_vocab_size\":8192}"
  --spec "{\"method\":\"eagle\",\"model\":\"$eagle\",\"num_speculative_tokens\":2,\"eagle_topk\":1,\"eagle_depth\":2,\"draft_vocab_size\":8192}"
  --spec "{\"method\":\"eagle\",\"model\":\"$eagle\",\"num_speculative_tokens\":3,\"eagle_topk\":1,\"eagle_depth\":3,\"draft_vocab_size\":8192}"
  --spec "{\"method\":\"medusa\",\"model\":\"$medusa\",\"num_speculative_tokens\":4,\"draft_vocab_size\":8192}"
  --spec "{\"method\":\"medusa\",\"model\":\"$medusa\",\"num_speculative_tokens\":2,\"speculative_token_tree\":\"[(0,), (0, 0)]\",\"draft_vocab_size\":8192}"
)
if [ -n "$old" ]; then
  specs+=(
    --spec "{\"method\":\"eagle\",\"model\":\"$old/eagle-smollm2-135m.gguf\",\"num_speculative_tokens\":8,\"eagle_topk\":4,\"eagle_depth\":4,\"draft_vocab_size\":8192}"
    --spec "{\"method\":\"medusa\",\"model\":\"$old/medusa-smollm2-135m.gguf\",\"num_speculative_tokens\":4,\"draft_vocab_size\":8192}"
  )
fi
q=()
[ -n "${QUESTIONS:-}" ] && q=(--questions "$QUESTIONS")
out="$here/bench/results/head_configs_b1_$day"
"$here/build/bin/specserve" bench-spec --model "$model" --threads "$threads" --per-task "${PER_TASK:-2}" \
  --max-tokens "${MAX_TOKENS:-64}" --batch-sizes 1 ${q[@]+"${q[@]}"} "${specs[@]}" --output "$out.json" | tee "$out.md"
"$py" "$here/bench/plot_spec_bench.py" "$out.json"
