#!/usr/bin/env bash
# Elastic serving on loopback: `specserve up` with min_replicas 1, max_replicas 3, warm_pool 1
# (upscale 1 s, downscale 3 s, 2 ongoing requests per replica) on the default model, a bounded
# burst of streaming requests through the OpenAI-compatible API (bench/autoscale_loadgen.py),
# then idle. Records replicas (ready / standby / starting), queue and TTFT over time, and the
# head's cold-start (process start -> ready) versus promotion (decision -> first token) times.
# Writes bench/results/autoscale_<date>.{json,md,png}.
# Usage: bench/run_autoscale_bench.sh
# Environment (defaults): NUM_REQUESTS (48) CONCURRENCY (12) MAX_TOKENS (32) IDLE_BEFORE (4 s)
#   IDLE_AFTER (15 s) MAX_NUM_SEQS (2; each replica's batch, specserve's default is 64: a burst then
#   runs on one replica and a promotion moves running sequences to the promoted one)
#   BURSTS (1; burst + idle cycles, one promotion sample each) KV_CACHE_BYTES (24MiB: one sequence of 512 tokens; default 1GiB)
#   MAX_MODEL_LEN (512; 0: the model's, the default)
#   SPECSERVE_BUILD_DIR (build) SPECSERVE_NO_BUILD (0) OUT (bench/results/autoscale_<date>)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${SPECSERVE_BUILD_DIR:-$here/build}"
model="$("$here/scripts/fetch-model.sh" | tail -n 1)"
[ "${SPECSERVE_NO_BUILD:-0}" = 1 ] || SPECSERVE_BUILD_DIR="$build" "$here/scripts/build.sh"
py="$("$here/scripts/venv.sh" --with-plot)"
out="${OUT:-$here/bench/results/autoscale_$(date +%F)}"
export SOURCE_COMMIT="${SOURCE_COMMIT:-$(git -C "$here" describe --always --dirty 2>/dev/null || echo unknown)}"
"$py" "$here/bench/autoscale_loadgen.py" --bin "$build/bin/specserve" --model "$model" --out "$out"
"$py" "$here/bench/plot_autoscale_bench.py" "$out.json" -o "$out.png"
