#!/usr/bin/env bash
# The CPU matmul kernels A/B (cpu/matmul.h): AVX2 (8 lanes) against AVX-512 (16 lanes, 8 x rows x
# 3 weight rows per tile), in one session, interleaved, on the default model: bench-model decode
# step time at 1, 3, 5, 9 and 16 rows per step and Spec-Bench batch 1 for baseline, n-gram, EAGLE
# (tree and chain) and Medusa, one round per kernel. Since 2026-12-03 this is
# `bench/run_cpu_ab.sh SPECSERVE_CPU_MATMUL avx2 avx512` (result files
# bench/results/cpu_matmul_avx2_vs_avx512_<date>.*; bench/results/cpu_matmul_ab_2026-12-03.* came
# from the earlier version of this script, which averaged 2 bench-model rounds and ran 3
# Spec-Bench methods).
# Needs a CPU with avx512f.
# Usage: bench/run_matmul_ab.sh [THREADS] [REPEATS]     (--help: this text)
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then sed -n "2,10p" "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
exec "$(dirname "$0")/run_cpu_ab.sh" SPECSERVE_CPU_MATMUL avx2 avx512 "${1:-$(nproc)}" "${2:-5}" 2 1
