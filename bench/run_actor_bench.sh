#!/usr/bin/env bash
# The actor runtime's control overhead and throughput (specserve bench-actors):
#   1. batch 1, greedy, the same requests through the Engine directly, through the actors in one
#      process, and through `specserve up` (target shard in a worker process, client over
#      loopback), interleaved and repeated; once without speculation, once with n-gram k = 4;
#   2. output tokens/s and time to first token against 1..32 concurrent clients (closed loop,
#      Spec-Bench questions), actor path beside the Engine driven with the same loop.
# Waits (up to 10 minutes) for the 1-minute load average to drop to 1.0 or less: on a shared
# 2-core machine a neighbour's build is the largest error term. The JSON records the load and
# the CPU other processes used during each phase.
# Writes bench/results/actors_<date>.{json,md,png}.
# Usage: bench/run_actor_bench.sh [THREADS] [--processes]   (default: all cores; --processes: the
#        concurrency sweep with the target shard in a worker process, clients over loopback)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
threads="${1:-$(nproc)}"
shift || true
build="${SPECSERVE_BUILD_DIR:-$here/build}"
model="$("$here/scripts/fetch-model.sh" | tail -n 1)"
# SPECSERVE_NO_BUILD=1: use the binary already in $build (e.g. while others keep the cores busy building).
[ "${SPECSERVE_NO_BUILD:-0}" = 1 ] || SPECSERVE_BUILD_DIR="$build" "$here/scripts/build.sh"
py="$("$here/scripts/venv.sh" --with-plot)"
for i in $(seq 1 60); do
  load="$(cut -d' ' -f1 /proc/loadavg)"
  if awk "BEGIN { exit !($load <= 1.0) }"; then break; fi
  if [ "$i" -eq 60 ]; then echo "[bench] load $load after 10 minutes; measuring anyway (recorded)" >&2; break; fi
  echo "[bench] 1-minute load average $load > 1.0: waiting 10 s ($i/60)" >&2
  sleep 10
done
day="$(date +%Y-%m-%d)"
out="$here/bench/results/actors_$day"
before="$(uptime)"
args=(bench-actors --model "$model" --threads "$threads" --mode all
      --max-tokens 128 --repeats 5 --prompts 2 --max-prompt-tokens 256
      --speculative-config '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":5}'
      --concurrency 1,2,4,8,16,32 --sweep-max-tokens 64 --requests-per-client 1 --min-requests 4
      "$@" --out "$out.json")
"$build/bin/specserve" "${args[@]}" > "$out.tables.md"
after="$(uptime)"
{
  echo "# Actor runtime: control overhead and tokens/s vs clients — $(hostname), $threads threads, $day"
  echo
  echo "Command: \`bench/run_actor_bench.sh $threads${*:+ $*}\`, which runs"
  echo "\`specserve ${args[*]}\`"
  echo "(model: SmolLM2-135M-Instruct Q4_1; machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))."
  echo
  echo "Before: \`$before\`; after: \`$after\`."
  cat "$out.tables.md"
} > "$out.md"
rm -f "$out.tables.md"
"$py" "$here/bench/plot_actor_bench.py" "$out.json"
cat "$out.md"
