#!/usr/bin/env bash
# Medusa and EAGLE through `specserve generate` (the committed heads in models/heads/): greedy,
# 128 tokens, one thread, plain decoding vs each method on a few chat prompts; decode tokens/s,
# mean accepted length (tokens per target step) and whether the output is byte-identical to
# plain decoding (it must be). Prompts: two like the heads' training corpus (tools/train/
# make_prompts.py) and two from Spec-Bench (../shared/data/spec_bench/question.jsonl).
# Writes bench/results/heads_generate_<date>.md (a table) and prints it.
# Usage: bench/run_heads_generate.sh [MAX_TOKENS]     (--help: this text)
#   METHODS (env): extra --speculative-config JSONs, ';'-separated, replacing the default set.
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
here="$(cd "$(dirname "$0")/.." && pwd)"
max_tokens="${1:-128}"
bin="${SPECSERVE_BIN:-$here/build/bin/specserve}"
medusa="$here/models/heads/medusa-smollm2-135m.gguf"
eagle="$here/models/heads/eagle-smollm2-135m.gguf"
day="$(date +%Y-%m-%d)"
out="$here/bench/results/heads_generate_$day.md"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
prompts=(
  "What are the main advantages and disadvantages of vaccines?"
  "Explain how a refrigerator works, step by step."
  "Imagine you are participating in a race with a group of people. If you have just overtaken the second person, what's your current position? Where is the person you just overtook?"
  "Write a persuasive email to convince your introverted friend, who dislikes public speaking, to volunteer as a guest speaker at a local event."
)
if [ -n "${METHODS:-}" ]; then
  IFS=';' read -r -a configs <<< "$METHODS"
else
  configs=(
    "{\"method\":\"medusa\",\"model\":\"$medusa\",\"num_speculative_tokens\":6}"
    "{\"method\":\"eagle\",\"model\":\"$eagle\",\"num_speculative_tokens\":6}"
    "{\"method\":\"eagle\",\"model\":\"$eagle\",\"num_speculative_tokens\":3,\"speculative_token_tree\":\"[(0,), (0, 0), (0, 0, 0)]\"}"
  )
fi
run() {  # prompt config -> "tok/s accepted_length" (accepted length 1 for plain), output in $tmp/out
  local p="$1" cfg="$2"
  local args=(generate --chat "$p" --max-tokens "$max_tokens" --temperature 0 --threads 1)
  [ -n "$cfg" ] && args+=(--speculative-config "$cfg")
  "$bin" "${args[@]}" > "$tmp/out" 2> "$tmp/err"
  local tps acc
  tps="$(sed -n 's/.*decode: \([0-9.]*\) tokens\/s.*/\1/p' "$tmp/err")"
  acc="$(sed -n 's/.*mean acceptance length \([0-9.]*\).*/\1/p' "$tmp/err")"
  echo "$tps ${acc:-1.00}"
}
{
  echo "# Medusa / EAGLE through specserve generate ($day)"
  echo
  echo "Greedy, $max_tokens tokens, 1 thread, $(nproc) cores ($(uname -m)), load average $(cut -d' ' -f1-3 /proc/loadavg)."
  echo "Command: \`$bin generate --chat PROMPT --max-tokens $max_tokens --temperature 0 --threads 1 [--speculative-config JSON]\`"
  echo
  echo "| prompt | method | decode tok/s | speedup | mean accepted length | identical |"
  echo "|---|---|---|---|---|---|"
} | tee "$out"
for i in "${!prompts[@]}"; do
  p="${prompts[$i]}"
  read -r base _ < <(run "$p" "")
  cp "$tmp/out" "$tmp/plain"
  echo "| $i | plain | $base | 1.00 | 1.00 | - |" | tee -a "$out"
  for cfg in "${configs[@]}"; do
    read -r tps acc < <(run "$p" "$cfg")
    same=no; cmp -s "$tmp/plain" "$tmp/out" && same=yes
    name="$(echo "$cfg" | sed 's#"model":"[^"]*",##; s#"##g')"
    speed="$(awk -v a="$tps" -v b="$base" 'BEGIN { printf "%.2f", a / b }')"
    echo "| $i | $name | $tps | $speed | $acc | $same |" | tee -a "$out"
  done
done
