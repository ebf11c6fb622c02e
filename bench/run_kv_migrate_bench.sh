#!/usr/bin/env bash
# The time to migrate a 2,000-token sequence (its KV over UCX, between two processes on this host)
# against re-prefilling it: `specserve bench-migrate` with the default model on the CPU backend
# (context 8192), for UCX_TLS tcp and sm; see tools/cli/bench_migrate.cpp for what is timed.
# Waits (up to SPECSERVE_BENCH_WAIT_S, default 600 s) for the 1-minute load average to drop to
# 1.0 or less; the load before and after is recorded.
# Writes bench/results/kv_migrate_<date>.{json,md,png}.
# Usage: bench/run_kv_migrate_bench.sh [THREADS] [TRANSPORTS...]   (default: 2 tcp sm)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${SPECSERVE_BUILD_DIR:-$here/build}"
threads="${1:-2}"
shift || true
transports=("$@")
[ ${#transports[@]} -eq 0 ] && transports=(tcp sm)
# SPECSERVE_NO_BUILD=1: use the binary already in $build.
[ "${SPECSERVE_NO_BUILD:-0}" = 1 ] || SPECSERVE_BUILD_DIR="$build" "$here/scripts/build.sh"
py="$("$here/scripts/venv.sh" --with-plot)"
waits=$(( ${SPECSERVE_BENCH_WAIT_S:-600} / 10 )); [ "$waits" -lt 1 ] && waits=1
for i in $(seq 1 "$waits"); do
  load="$(cut -d' ' -f1 /proc/loadavg)"
  if awk "BEGIN { exit !($load <= 1.0) }"; then break; fi
  if [ "$i" -eq "$waits" ]; then echo "[bench] load $load after waiting; measuring anyway (recorded)" >&2; break; fi
  echo "[bench] 1-minute load average $load > 1.0: waiting 10 s ($i/$waits)" >&2
  sleep 10
done
day="$(date +%Y-%m-%d)"
out="$here/bench/results/kv_migrate_$day"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
before="$(uptime)"
OMP_NUM_THREADS="$threads" "$build/bin/specserve" bench-migrate --threads "$threads" --prompt-tokens 2000 \
  --max-model-len 8192 --repeats 3 --transports "${transports[@]}" --output "$tmp/migrate.json"
after="$(uptime)"
"$py" "$here/bench/plot_kv_migrate.py" --result "$tmp/migrate.json" --out "$out" \
  --before "$before" --after "$after" --command "bench/run_kv_migrate_bench.sh${*:+ $threads $*}"
cat "$out.md"
