#!/usr/bin/env bash
# The test suite on a fresh machine: installs the Debian packages, fetches the default model,
# builds, runs every unit test and the bounded integration set with ctest (the kernel-dependent
# tests a second time under SPECSERVE_CPU_MATMUL=vnni where the CPU has AVX512-VNNI), then fuzzes
# the GGUF reader for a bounded time.
# Usage: scripts/test.sh            (default set: everything but the "slow" label; "gpu" tests run
#                                   and show as "Skipped" with their reason where no GPU is present)
#        SPECSERVE_TEST_ALL=1 scripts/test.sh   (everything, slow ones too)
#        SPECSERVE_FUZZ_SECONDS=N   (fuzzing time, default 60; 0 skips it)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
start=$(date +%s)
"$here/scripts/setup-deps.sh"
"$here/scripts/fetch-model.sh" >/dev/null
"$here/scripts/build.sh"
# The end-to-end tests drive the HTTP API with the official `openai` package from this venv.
"$here/scripts/venv.sh" >/dev/null
cd "$here/build"
# The suite's tolerances are fp32's (llama.cpp parity, tensor parallel against one rank, heads
# against PyTorch); the AMX and vnni kernels' own tests switch to them in-process (cpu/matmul.h),
# and a second pass below runs the kernel-dependent tests under vnni.
kernel="$(echo "${SPECSERVE_CPU_MATMUL:-}" | tr -d ' \t' | tr '[:upper:]' '[:lower:]')"
if [ "$kernel" = amx ] || [ "$kernel" = vnni ]; then
  echo "[test] SPECSERVE_CPU_MATMUL=$kernel unset for the suite: its tolerances are fp32's; the $kernel tests select $kernel themselves" >&2
  unset SPECSERVE_CPU_MATMUL
fi
exclude=(-LE "slow")
[ "${SPECSERVE_TEST_ALL:-0}" = "1" ] && exclude=()
# One thread per test process: ctest runs two at a time on a 2-core machine.
OMP_NUM_THREADS=1 ctest --output-on-failure -j "$(nproc)" --timeout 900 "${exclude[@]}"
# The int8 kernel (SPECSERVE_CPU_MATMUL=vnni: llama.cpp's arithmetic, the fast one on CPUs with
# AVX512-VNNI) under the tests whose results depend on the matmul kernel: the model, the
# speculative engine and heads (greedy identity, distributions), actors serving greedy requests
# as the target alone does, the CLI's error paths. Not again: the tests that pin an fp32 kernel
# (tensor-parallel identity, llama.cpp parity, heads against PyTorch) and the cluster, HTTP,
# autoscaling and transport tests, whose results do not depend on the kernel (the fast unit tests
# of scheduling, parsing and tokenizers run again: seconds).
if grep -qw avx512_vnni /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo; then
  echo "[test] again under SPECSERVE_CPU_MATMUL=vnni: the kernel-dependent tests" >&2
  vnni_labels=(-LE "slow|gpu")
  [ "${SPECSERVE_TEST_ALL:-0}" = "1" ] && vnni_labels=(-LE "gpu")
  SPECSERVE_CPU_MATMUL=vnni OMP_NUM_THREADS=1 ctest --output-on-failure -j "$(nproc)" --timeout 900 "${vnni_labels[@]}" \
    -E '^(Autoscale|ElasticPromotion[.]|ElasticLifecycle|Ucx|Transports/|GlooCommunicator|TokenGate|NodeSupervisor|HttpServerTest|OpenAiApi|TargetShardKv|CliChecks|Cluster|KilledRank|TpActors|LlamaParityTest|TensorParallelSmolLM2|HeadsReference|e2e)'
else
  echo "[test] this CPU has no avx512_vnni: the pass under SPECSERVE_CPU_MATMUL=vnni is skipped (the vnni kernel tests skip, saying so)" >&2
fi
fuzz="${SPECSERVE_FUZZ_SECONDS:-60}"
if [ "$fuzz" != "0" ]; then
  "$here/scripts/fuzz-gguf.sh" "$fuzz"
fi
echo "[test] done in $(( $(date +%s) - start )) s"
