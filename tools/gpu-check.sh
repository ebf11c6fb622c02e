#!/usr/bin/env bash
# Every GPU check of issue 9 on one machine with an NVIDIA GPU, in under 8 minutes, all results
# into OUTDIR:
#   1. detect the GPU (nvidia-smi), stop with a clear message (exit 3) when there is none;
#   2. configure and build (Ninja, all cores) the CLI and the GPU tests; when the configure step
#      fails for missing packages and apt works, install them with scripts/setup-deps.sh;
#   3. `ctest -L gpu`: parity of every CudaBackend op and of whole models with the CPU
#      reference, greedy identity, tree attention, KV export/import; the NCCL communicator and
#      KV channel (tests/gpu/nccl_test.cpp: one GPU; its multi-GPU tests skip on a single-GPU
#      machine); a sequence's KV moving between two GPU workers' data planes, over NCCL with two
#      GPUs and over UCX on one (tests/gpu/kv_nccl_migration_test.cpp) (JUnit XML + verbose log);
#   4. decode tokens/s at batch 1, 8 and 32 for synthetic models shaped like Llama 3.2 1B and
#      Llama 3.1 8B (random bf16 weights built in memory), with the achieved memory bandwidth
#      against the GPU's peak (2 x memory clock x bus width) — `specserve bench-model`; the 1B
#      shape also with --enforce-eager (CUDA graphs off) for the graphs' ratio, with whole logit
#      rows downloaded each step (SPECSERVE_ARGMAX_ON_DEVICE=0) against the GPU's argmax, and at
#      2,048 cached tokens with attention's split over the keys on and off;
#   5. speculative speedup with n-gram and layer_skip on the default model on the GPU, greedy
#      outputs checked against plain decoding — `specserve bench-spec --device cuda:0`, with
#      CUDA graphs and with --enforce-eager;
#   6. OUTDIR/summary.md: each stage's status and time, the parity and benchmark figures.
# Each stage runs under `timeout`; the whole script stops starting stages at 470 s.
# Usage: tools/gpu-check.sh OUTDIR        (env: SPECSERVE_GPU_CHECK_BUDGET seconds, default 470;
#        SPECSERVE_BUILD_DIR, default build-gpu; SPECSERVE_GPU_CHECK_PREBUILT=DIR uses binaries
#        built elsewhere (DIR/bin/specserve, DIR/tests/test_gpu_*) instead of building;
#        SPECSERVE_GPU_CHECK_DRY_RUN=1 goes on without a GPU, to check this script itself: the
#        GPU tests then skip and the benchmarks fail)
# Exit: 0 all stages passed; 1 a stage failed or timed out; 2 usage; 3 no GPU; 4 cannot build.
set -uo pipefail
if [ $# -ne 1 ]; then
  echo "usage: tools/gpu-check.sh OUTDIR" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$1" || exit 2
out="$(cd "$1" && pwd)"
start=$(date +%s)
# The GPU parity tests compare with the CPU backend as the fp32 reference: an int8 or bf16 CPU
# kernel chosen for the whole run would move that reference (scripts/test.sh does the same).
if [ -n "${SPECSERVE_CPU_MATMUL:-}" ]; then
  echo "[gpu-check] SPECSERVE_CPU_MATMUL=$SPECSERVE_CPU_MATMUL unset: the CPU reference is fp32" >&2
  unset SPECSERVE_CPU_MATMUL
fi
budget="${SPECSERVE_GPU_CHECK_BUDGET:-470}"
build="${SPECSERVE_BUILD_DIR:-$here/build-gpu}"
summary="$out/summary.md"
stages="$out/stages.tsv"
: >"$stages"
failed=0

log() { echo "[gpu-check] $*" | tee -a "$out/gpu-check.log" >&2; }
elapsed() { echo $(( $(date +%s) - start )); }

# stage NAME LIMIT_S CMD...: runs CMD under timeout (capped by what is left of the budget), its
# output into OUTDIR/NAME.log; records NAME, status and seconds in stages.tsv.
stage() {
  local name="$1" limit="$2"; shift 2
  local left=$(( budget - $(elapsed) ))
  if [ "$left" -lt 15 ]; then
    log "$name: not started, the ${budget} s budget is spent"
    printf '%s\tnot run (budget spent)\t0\n' "$name" >>"$stages"
    failed=1
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit="$left"
  log "$name: starting (limit ${limit} s)"
  local t0=$(date +%s) rc=0
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1 || rc=$?
  local dt=$(( $(date +%s) - t0 )) status="ok"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    status="timed out after ${limit} s"
  elif [ "$rc" -ne 0 ]; then
    status="failed (exit $rc)"
  fi
  [ "$status" = "ok" ] || failed=1
  printf '%s\t%s\t%s\n' "$name" "$status" "$dt" >>"$stages"
  log "$name: $status in ${dt} s (log: $out/$name.log)"
  [ "$status" = "ok" ]
}

write_summary() {
  {
    echo "# GPU check $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "- commit: $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- GPU: $(head -n 1 "$out/nvidia-smi.txt" 2>/dev/null || echo none)"
    echo "- total time: $(elapsed) s (budget ${budget} s)"
    echo
    echo "| stage | status | seconds |"
    echo "|---|---|---|"
    while IFS=$'\t' read -r n s t; do echo "| $n | $s | $t |"; done <"$stages"
    if [ -f "$out/ctest.log" ]; then
      echo
      echo "## GPU tests (ctest -L gpu; JUnit: ctest-junit.xml)"
      echo
      echo '```'
      grep -E "^ *[0-9]+/[0-9]+ Test|tests passed|tests failed|^\[ +(OK|FAILED|SKIPPED|PASSED) +\]" "$out/ctest.log" | tail -n 40
      echo '```'
      echo
      echo "Parity figures and cuBLAS determinism (printed by the tests):"
      echo
      echo '```'
      grep -oE "\[ info \].*" "$out/ctest.log" | sort -u | head -n 40
      grep -m 1 -oE "no CUDA device: .*" "$out/ctest.log" || true
      echo '```'
    fi
    for f in "$out"/bench_model_*.json; do
      [ -f "$f" ] || continue
      echo
      echo "## $(basename "$f" .json)"
      echo
      python3 - "$f" <<'PY' 2>/dev/null || cat "$f"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"model {r.get('model')} on {r.get('device')} ({r.get('gpu', '')}); decode after {r.get('decode_context', 64)} cached tokens; bandwidth peak {r.get('bandwidth_gb_s', 0):.0f} GB/s ({r.get('bandwidth_source', '')})")
print()
print("greedy tokens: " + ("argmax on the GPU (argmax_rows)" if r.get("argmax_on_device", False) else "whole logit rows to the host (SPECSERVE_ARGMAX_ON_DEVICE=0)"))
g = r.get("cuda_graphs")
if g:
    print()
    print(f"CUDA graphs {'on' if g['enabled'] else 'off (--enforce-eager)'}: {g['replays']} replays, {g['captures']} captures, {g['eager_segments']} eager segments, {g['failed_captures']} failed captures")
print()
print("| batch | tokens/s | ms/step | GB/s achieved | % of peak |")
print("|---|---|---|---|---|")
for b, d in sorted(r.get("decode", {}).items(), key=lambda kv: int(kv[0])):
    print(f"| {b} | {d['tokens_per_s']:.1f} | {d['ms_per_step']:.2f} | {d['achieved_gb_s']:.0f} | {100 * d['fraction_of_bandwidth']:.0f}% |")
PY
    done
    for name in bench_spec bench_spec_eager bench_spec_no_split; do
      [ -f "$out/$name.log" ] || continue
      echo
      case "$name" in
        bench_spec) echo "## Speculative decoding on the GPU, CUDA graphs on (bench-spec; bench_spec.json)" ;;
        bench_spec_eager) echo "## The same, --enforce-eager (bench_spec_eager.json)" ;;
        *) echo "## The same (n-gram only), SPECSERVE_CUDA_ATTENTION_SPLIT=0 (bench_spec_no_split.json)" ;;
      esac
      echo
      echo '```'
      grep -vE "^\[bench-spec\]|questions$" "$out/$name.log" | tail -n 40
      echo '```'
    done
  } >"$summary"
}

# ---- 1. the GPU
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >"$out/nvidia-smi.txt" 2>&1 && grep -q "^GPU" "$out/nvidia-smi.txt"; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.memory --format=csv >>"$out/nvidia-smi.txt" 2>&1 || true
  log "GPU: $(head -n 1 "$out/nvidia-smi.txt")"
elif [ "${SPECSERVE_GPU_CHECK_DRY_RUN:-0}" = "1" ]; then
  log "no NVIDIA GPU; dry run (SPECSERVE_GPU_CHECK_DRY_RUN=1): going on to check the script"
  echo "none (dry run)" >"$out/nvidia-smi.txt"
else
  log "no NVIDIA GPU on this machine (nvidia-smi missing or lists no GPU): nothing to check here."
  log "the GPU tests skip visibly without a device; run this script on a machine with a GPU."
  printf 'gpu\tno GPU: stopped\t0\n' >>"$stages"
  write_summary
  exit 3
fi
if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null 2>&1; then
  log "a GPU but no nvcc (expected /usr/local/cuda/bin/nvcc): cannot build the CUDA backend"
  printf 'nvcc\tmissing: stopped\t0\n' >>"$stages"
  write_summary
  exit 4
fi

# ---- 2. build (or binaries built elsewhere: SPECSERVE_GPU_CHECK_PREBUILT=DIR holding
# bin/specserve and tests/test_gpu_*; they still need this machine's shared libraries)
prebuilt="${SPECSERVE_GPU_CHECK_PREBUILT:-}"
if [ -n "$prebuilt" ]; then
  build="$(cd "$prebuilt" && pwd)"
  log "using the prebuilt binaries in $build (no build)"
  printf 'build\tskipped: prebuilt binaries\t0\n' >>"$stages"
else
configure=(cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPECSERVE_CUDA=ON)
configured=0
if stage configure 60 "${configure[@]}"; then
  configured=1
elif command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || command -v sudo >/dev/null 2>&1; }; then
  log "configure failed (packages missing?); installing the build's packages with scripts/setup-deps.sh"
  stage setup_deps 150 "$here/scripts/setup-deps.sh" && stage configure_again 60 "${configure[@]}" && configured=1
fi
if [ "$configured" != 1 ] || ! grep -q "CUDA backend ON" "$out"/configure*.log 2>/dev/null; then
  log "the build could not be configured with the CUDA backend; see configure*.log and setup_deps.log"
  write_summary
  exit 4
fi
# Every tests/gpu/*_test.cpp binary (ctest -L gpu runs them all; one not built would be "Not Run").
test_bins=()
for src in "$here"/tests/gpu/*_test.cpp; do test_bins+=("test_gpu_$(basename "$src" .cpp)"); done
if ! stage build 240 ninja -C "$build" -j "$(nproc)" specserve "${test_bins[@]}"; then
  log "build failed; see build.log"
  write_summary
  exit 4
fi
fi

# The default model (98 MB): $SPECSERVE_MODEL, models/, a shared/ folder in or beside the
# checkout, or the cache; else fetched when the network allows; without it the default-model
# tests and bench-spec are reported as not run.
model=""
name="SmolLM2-135M-Instruct.Q4_1.gguf"
for m in "${SPECSERVE_MODEL:-}" "$here/models/$name" "$here/shared/models/$name" "$here/../shared/models/$name" \
         "$HOME/.cache/specserve/models/$name"; do
  [ -n "$m" ] && [ -f "$m" ] && model="$m" && break
done
if [ -z "$model" ]; then
  stage fetch_model 60 "$here/scripts/fetch-model.sh" && model="$here/models/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
[ -n "$model" ] && export SPECSERVE_MODEL="$model"

# ---- 3. GPU tests
exclude=()
if [ -z "$model" ]; then
  log "no default model: its tests (CudaDefaultModel.*, CudaGraphs.*DefaultModel*, GpuMemoryPlanOnDevice.*, KvNcclMigration.*, TpActorsCuda.*) are excluded and reported as not run"
  printf 'default-model tests\tnot run (model absent)\t0\n' >>"$stages"
  exclude=(-E "CudaDefaultModel|DefaultModel|GpuMemoryPlanOnDevice|KvNcclMigration|TpActorsCuda")
fi
if [ -z "$prebuilt" ]; then
  stage ctest 150 ctest --test-dir "$build" -L gpu -V --timeout 140 --output-junit "$out/ctest-junit.xml" "${exclude[@]}"
else
  # No CTest files that fit this checkout: the GoogleTest binaries directly (JUnit-like XML).
  filter="*"
  [ -z "$model" ] && filter="-CudaDefaultModel.*:*DefaultModel*:GpuMemoryPlanOnDevice.*:KvNcclMigration.*:TpActorsCuda.*"
  run_gpu_tests() {
    local rc=0
    for t in "$build"/tests/test_gpu_*; do
      [ -f "$t" ] && [ -x "$t" ] || continue  # not gtest_discover_tests' *.cmake files
      "$t" --gtest_filter="$filter" --gtest_output="xml:$out/$(basename "$t").xml" || rc=1
    done
    return $rc
  }
  export -f run_gpu_tests
  export build out filter
  stage ctest 150 bash -c run_gpu_tests
fi

# ---- 4. decode benchmark: synthetic 1B and 8B Llama shapes, batch 1, 8, 32
bin="$build/bin/specserve"
# CUDA graphs (gpu/cuda_graphs.h) against eager launches (--enforce-eager) on the same model: the
# first decode step of a shape runs eagerly and the second is captured, so 3 repeats (median).
stage bench_model_llama-1b 75 "$bin" bench-model --device cuda:0 --synthetic llama-1b --decode-batches 1 8 32 \
  --repeats 3 --decode-tokens 32 --prompt-lengths 256 --output "$out/bench_model_llama-1b.json"
stage bench_model_llama-1b_eager 75 "$bin" bench-model --device cuda:0 --synthetic llama-1b --decode-batches 1 8 32 \
  --repeats 3 --decode-tokens 32 --prompt-lengths 256 --enforce-eager --output "$out/bench_model_llama-1b_eager.json"
# Greedy steps that download whole logit rows (SPECSERVE_ARGMAX_ON_DEVICE=0) against the default,
# where the GPU reduces each row to its argmax (Backend::argmax_rows): the same decode otherwise.
stage bench_model_llama-1b_full_logits 75 env SPECSERVE_ARGMAX_ON_DEVICE=0 "$bin" bench-model --device cuda:0 \
  --synthetic llama-1b --decode-batches 1 8 32 --repeats 3 --decode-tokens 32 --prompt-lengths 256 \
  --output "$out/bench_model_llama-1b_full_logits.json"
# Attention split over the keys (flash-decoding) where it matters: 2,048 cached tokens per
# sequence, split on (the default) and off.
stage bench_model_llama-1b_ctx2048 60 "$bin" bench-model --device cuda:0 --synthetic llama-1b --decode-batches 1 8 \
  --repeats 3 --decode-tokens 32 --decode-context 2048 --prompt-lengths 256 --output "$out/bench_model_llama-1b_ctx2048.json"
stage bench_model_llama-1b_ctx2048_no_split 60 env SPECSERVE_CUDA_ATTENTION_SPLIT=0 "$bin" bench-model --device cuda:0 \
  --synthetic llama-1b --decode-batches 1 8 --repeats 3 --decode-tokens 32 --decode-context 2048 --prompt-lengths 256 \
  --output "$out/bench_model_llama-1b_ctx2048_no_split.json"
stage bench_model_llama-8b 150 "$bin" bench-model --device cuda:0 --synthetic llama-8b --decode-batches 1 8 32 \
  --repeats 1 --decode-tokens 16 --prompt-lengths 256 --output "$out/bench_model_llama-8b.json"
stage bench_model_llama-1b_batch_invariant 60 env SPECSERVE_CUDA_MATMUL=batch_invariant "$bin" bench-model --device cuda:0 \
  --synthetic llama-1b --decode-batches 1 8 32 --repeats 1 --decode-tokens 32 --prompt-lengths 256 \
  --output "$out/bench_model_llama-1b_batch_invariant.json"

# ---- 5. speculative speedup on the default model
if [ -n "$model" ]; then
  questions="$here/../shared/data/spec_bench/question.jsonl"
  [ -f "$questions" ] || questions="$here/shared/data/spec_bench/question.jsonl"
  if [ ! -f "$questions" ]; then
    # Spec-Bench is not on this machine: one question per task in its format (first turn only).
    questions="$out/questions.jsonl"
    cat >"$questions" <<'EOF'
{"question_id": 1, "category": "writing", "turns": ["Write a short story about a robot who learns to paint. Repeat the robot's name, Arto, often."]}
{"question_id": 2, "category": "translation", "turns": ["Translate to German: The weather is nice today and we are going to the park."]}
{"question_id": 3, "category": "summarization", "turns": ["Summarize: The city council met on Monday to discuss the new park. The council agreed that the park will open in May. The park will have a playground, a pond and a garden."]}
{"question_id": 4, "category": "qa", "turns": ["What is the capital of France, and what is it famous for?"]}
{"question_id": 5, "category": "math_reasoning", "turns": ["Tom has 3 apples and buys 5 more. He gives 2 to Anna. How many apples does Tom have? Explain step by step."]}
{"question_id": 6, "category": "rag", "turns": ["Document: The Eiffel Tower is 330 metres tall and was completed in 1889. Question: How tall is the Eiffel Tower and when was it completed?"]}
EOF
    log "Spec-Bench questions not found; using 6 built-in questions ($questions)"
  fi
  stage bench_spec 120 "$bin" bench-spec --device cuda:0 --model "$model" --questions "$questions" --per-task 1 \
    --max-tokens 64 --batch-sizes 1 \
    --spec '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":5}' \
    --spec '{"method":"layer_skip","num_speculative_tokens":3,"num_layers":24}' \
    --output "$out/bench_spec.json"
  stage bench_spec_eager 120 "$bin" bench-spec --device cuda:0 --model "$model" --questions "$questions" --per-task 1 \
    --max-tokens 64 --batch-sizes 1 --enforce-eager \
    --spec '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":5}' \
    --spec '{"method":"layer_skip","num_speculative_tokens":3,"num_layers":24}' \
    --output "$out/bench_spec_eager.json"
  stage bench_spec_no_split 120 env SPECSERVE_CUDA_ATTENTION_SPLIT=0 "$bin" bench-spec --device cuda:0 --model "$model" \
    --questions "$questions" --per-task 1 --max-tokens 64 --batch-sizes 1 \
    --spec '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":5}' \
    --output "$out/bench_spec_no_split.json"
else
  printf 'bench_spec\tnot run (model absent)\t0\n' >>"$stages"
fi

write_summary
log "done in $(elapsed) s; summary: $summary"
gpu_slug="$(head -n 1 "$out/nvidia-smi.txt" | sed -E 's/^GPU [0-9]+: //; s/ \(UUID.*//; s/[^A-Za-z0-9]+/-/g; s/-+$//' | tr 'A-Z' 'a-z')"
log "to record this run: cp $summary bench/results/gpu_check_$(date +%Y-%m-%d)_${gpu_slug:-gpu}.md (and the JSON files beside it)"
exit "$failed"
