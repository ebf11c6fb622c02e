#!/usr/bin/env bash
# KV block transfer bandwidth (kv/ucx_transport.h) beside ucx_perftest on the same transport:
# for UCX_TLS in tcp and sm (shared memory + CMA), put and get of 1, 4, 16 and 64 MiB between
# two processes on this host:
#   ours:   specserve bench-kv-transfer (KvEndpoint::get / put, each synchronous, put + flush)
#   UCX's:  ucx_perftest -t ucp_put_bw | ucp_get, server and client on 127.0.0.1, with
#           pre-registered memory (-z) and, where the transports support it, peer error handling
#           (-e) — both as our endpoints have them; overall bandwidth
# Both move the same bytes per point (iterations = max(10, 256 MiB / size)); ours reports the
# best of 3 runs. Waits (up to SPECSERVE_BENCH_WAIT_S, default 600 s) for the 1-minute load
# average to drop to 1.0 or less; the load before and after is recorded.
# Writes bench/results/kv_transfer_<date>.{json,md,png} with the ratio ours / ucx_perftest (the
# issue's aim: >= 0.7).
# Usage: bench/run_kv_transfer_bench.sh [TRANSPORTS...]   (default: tcp sm)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${SPECSERVE_BUILD_DIR:-$here/build}"
transports=("$@")
[ ${#transports[@]} -eq 0 ] && transports=(tcp sm)
sizes_mib=(1 4 16 64)
command -v ucx_perftest >/dev/null || { echo "[bench] ucx_perftest missing: scripts/setup-deps.sh installs ucx-utils" >&2; exit 1; }
# SPECSERVE_NO_BUILD=1: use the binary already in $build.
[ "${SPECSERVE_NO_BUILD:-0}" = 1 ] || SPECSERVE_BUILD_DIR="$build" "$here/scripts/build.sh"
py="$("$here/scripts/venv.sh" --with-plot)"
waits=$(( ${SPECSERVE_BENCH_WAIT_S:-600} / 10 )); [ "$waits" -lt 1 ] && waits=1
for i in $(seq 1 "$waits"); do
  load="$(cut -d' ' -f1 /proc/loadavg)"
  if awk "BEGIN { exit !($load <= 1.0) }"; then break; fi
  if [ "$i" -eq "$waits" ]; then echo "[bench] load $load after 10 minutes; measuring anyway (recorded)" >&2; break; fi
  echo "[bench] 1-minute load average $load > 1.0: waiting 10 s ($i/$waits)" >&2
  sleep 10
done
day="$(date +%Y-%m-%d)"
out="$here/bench/results/kv_transfer_$day"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
before="$(uptime)"
port=$((20000 + RANDOM % 20000))
for tls in "${transports[@]}"; do
  echo "[bench] specserve bench-kv-transfer, UCX_TLS=$tls" >&2
  UCX_TLS="$tls" "$build/bin/specserve" bench-kv-transfer --transports "$tls" \
    --sizes-mib "${sizes_mib[@]}" --ops put get --min-bytes $((256 << 20)) --output "$tmp/ours_$tls.json" >&2
  # Peer error handling as our endpoints get it: UCX 1.13 refuses it on shared memory alone.
  eflag=(-e)
  info="$(UCX_TLS="$tls" ucx_info -u re -e -P intra 2>&1 || true)"
  case "$info" in *"no active messages transport"*) eflag=() ;; esac
  for op in put get; do
    test_name=ucp_put_bw
    [ "$op" = get ] && test_name=ucp_get
    for mib in "${sizes_mib[@]}"; do
      bytes=$((mib << 20))
      iters=$(( (256 << 20) / bytes )); [ "$iters" -lt 10 ] && iters=10
      port=$((port + 1))
      args=(-t "$test_name" -s "$bytes" -n "$iters" -w 2 "${eflag[@]}" -z -f -p "$port")
      UCX_TLS="$tls" timeout 300 ucx_perftest "${args[@]}" >"$tmp/server.log" 2>&1 &
      server=$!
      sleep 0.5
      line="$(UCX_TLS="$tls" timeout 300 ucx_perftest 127.0.0.1 "${args[@]}" 2>&1 | awk 'NF == 8 && $1 ~ /^[0-9]+$/ { last = $0 } END { print last }' || true)"
      wait "$server" || true
      [ -n "$line" ] || { echo "[bench] ucx_perftest $tls $op $mib MiB gave no result" >&2; cat "$tmp/server.log" >&2; exit 1; }
      echo "$tls $op $bytes $line" >> "$tmp/perftest.txt"
      echo "$tls $op $bytes ucx_perftest ${args[*]}" >> "$tmp/perftest_commands.txt"
      echo "[bench] ucx_perftest UCX_TLS=$tls $test_name $mib MiB: $line" >&2
    done
  done
done
after="$(uptime)"
"$py" "$here/bench/plot_kv_transfer.py" --ours "$tmp"/ours_*.json --perftest "$tmp/perftest.txt" \
  --before "$before" --after "$after" --command "bench/run_kv_transfer_bench.sh${*:+ $*}" \
  --perftest-commands "$tmp/perftest_commands.txt" --out "$out"
cat "$out.md"
