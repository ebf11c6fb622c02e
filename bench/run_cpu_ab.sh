#!/usr/bin/env bash
# A/B of two settings of one CPU kernel variable, in one session, interleaved, on the default
# model: SPECSERVE_CPU_WEIGHTS (f32 | blocks: Q4_1/Q8_0 weights dequantised at load or kept as
# blocks, cpu/cpu_backend.h), SPECSERVE_CPU_ATTENTION (rowwise | tiled, cpu/attention.h) or
# SPECSERVE_CPU_MATMUL (avx2 | avx512 | amx | vnni, cpu/matmul.h) or SPECSERVE_CPU_FUSED_DEQUANT (1 | 0:
# block weights dequantised in registers for few rows, or through a buffer, cpu/matmul.h); A and B
# are two of those settings. All but SPECSERVE_CPU_MATMUL give the same bits both ways (under the
# fp32 matmul kernels).
#   1. bench-model decode step time (after its fixed 64-token prompt) at 1, 3, 5, 9 and 16 rows per step, REPEATS runs each, ROUNDS
#      times per setting in the order A, B, A, B...; the mean over rounds is reported;
#   2. bench-spec on Spec-Bench, batch 1, greedy (PER_TASK questions per task, 64 tokens):
#      baseline, n-gram, the committed EAGLE head as tree (with and without draft_p_min 0.5) and chain, the Medusa heads; ROUNDS times
#      per setting, interleaved.
# Writes bench/results/cpu_<variable>_<A>_vs_<B>_<date>.{json,md,png} (variable lower-cased, without the
# SPECSERVE_CPU_ prefix).
# Usage: bench/run_cpu_ab.sh VARIABLE A B [THREADS] [REPEATS] [PER_TASK] [ROUNDS]   (--help: this text)
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then sed -n "2,15p" "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
if [ $# -lt 3 ]; then sed -n "2,15p" "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; fi
var="$1"
# The binary reads the values trimmed and in any case; the JSON records them lower-case.
va="$(echo "$2" | tr -d ' \t' | tr '[:upper:]' '[:lower:]')"; vb="$(echo "$3" | tr -d ' \t' | tr '[:upper:]' '[:lower:]')"
case "$var" in
  SPECSERVE_CPU_WEIGHTS) key=cpu_weights ;;
  SPECSERVE_CPU_ATTENTION) key=cpu_attention ;;
  SPECSERVE_CPU_MATMUL) key=cpu_matmul ;;
  SPECSERVE_CPU_FUSED_DEQUANT) key=cpu_fused_dequant ;;
  *) echo "bench/run_cpu_ab.sh: VARIABLE = '$var': expected SPECSERVE_CPU_WEIGHTS, SPECSERVE_CPU_ATTENTION, SPECSERVE_CPU_MATMUL or SPECSERVE_CPU_FUSED_DEQUANT" >&2; exit 2 ;;
esac
case "$key" in
  cpu_weights) allowed="f32 blocks" ;;
  cpu_attention) allowed="rowwise tiled" ;;
  cpu_matmul) allowed="avx2 avx512 amx vnni" ;;
  cpu_fused_dequant) allowed="1 0" ;;
esac
for v in "$va" "$vb"; do
  case " $allowed " in
    *" $v "*) ;;
    *) echo "bench/run_cpu_ab.sh: $var = '$v': expected one of $allowed" >&2; exit 2 ;;
  esac
done
[ "$va" != "$vb" ] || { echo "bench/run_cpu_ab.sh: A and B are both '$va': nothing to compare" >&2; exit 2; }
if [ "$key" != cpu_weights ] && [ "$key" != cpu_fused_dequant ] && ! grep -q avx512f /proc/cpuinfo; then
  echo "bench/run_cpu_ab.sh: this CPU has no avx512f: $var has only one setting here" >&2; exit 2
fi
if [ "$va" = vnni ] || [ "$vb" = vnni ]; then
  grep -q avx512_vnni /proc/cpuinfo || { echo "bench/run_cpu_ab.sh: this CPU has no avx512_vnni: SPECSERVE_CPU_MATMUL=vnni cannot run here" >&2; exit 2; }
fi
if [ "$va" = amx ] || [ "$vb" = amx ]; then
  grep -q amx_bf16 /proc/cpuinfo || { echo "bench/run_cpu_ab.sh: this CPU has no amx_bf16: SPECSERVE_CPU_MATMUL=amx cannot run here" >&2; exit 2; }
fi
here="$(cd "$(dirname "$0")/.." && pwd)"
threads="${4:-$(nproc)}"
repeats="${5:-3}"
per_task="${6:-2}"
rounds="${7:-1}"
model="$("$here/scripts/fetch-model.sh" | tail -n 1)"
"$here/scripts/build.sh"
py="$("$here/scripts/venv.sh" --with-plot)"
# The binary may refuse a setting (amx where the kernel refuses the tile state): check before the
# runs, from its start-up log line, rather than after them.
if [ "$key" = cpu_matmul ]; then
  for v in "$va" "$vb"; do
    # (The log is read whole first: grep -q would stop reading, and under pipefail the writer's
    # SIGPIPE would fail the check.)
    log="$(env "$var=$v" "$here/build/bin/specserve" generate --model "$model" --prompt hi --max-tokens 1 --threads 1 2>&1)" \
      || { echo "bench/run_cpu_ab.sh: $var=$v: specserve generate failed:" >&2; echo "$log" >&2; exit 2; }
    grep -q "matmul kernel $v " <<< "$log" || { echo "bench/run_cpu_ab.sh: $var=$v: the binary runs another kernel here (see its start-up log line)" >&2; exit 2; }
  done
fi
day="$(date +%Y-%m-%d)"
name="$(echo "${var#SPECSERVE_CPU_}" | tr '[:upper:]' '[:lower:]')"
out="$here/bench/results/cpu_${name}_${va}_vs_${vb}_$day"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
source "$here/bench/ab_specs.sh"  # specs=(...): the bench-spec methods of an A/B
for round in $(seq 1 "$rounds"); do
  for v in "$va" "$vb"; do
    echo "[cpu-ab] bench-model, $var=$v, round $round of $rounds" >&2
    env "$var=$v" "$here/build/bin/specserve" bench-model --model "$model" --threads "$threads" \
      --decode-batches 1 3 5 9 16 --prompt-lengths 128 --decode-tokens 32 --repeats "$repeats" \
      --output "$tmp/model_${v}_$round.json" >/dev/null
    echo "[cpu-ab] bench-spec (Spec-Bench, batch 1), $var=$v, round $round of $rounds" >&2
    env "$var=$v" "$here/build/bin/specserve" bench-spec --model "$model" --threads "$threads" --per-task "$per_task" \
      --max-tokens 64 --batch-sizes 1 "${specs[@]}" --output "$tmp/spec_${v}_$round.json" > "$tmp/spec_${v}_$round.md"
  done
done
"$py" "$here/bench/ab_report.py" "$tmp" "$out" "CPU A/B: $var = $va against $vb" \
  "bench/run_cpu_ab.sh $var $va $vb $threads $repeats $per_task $rounds" "$va" "$vb" "$threads" "$repeats" "$per_task" "$rounds" 64 "$key"
