#!/usr/bin/env bash
# Builds the GGUF reader fuzzer (libFuzzer + AddressSanitizer + UndefinedBehaviorSanitizer)
# straight from the sources, writes a seed corpus, and fuzzes for SECONDS (default 60).
# Exits non-zero when the fuzzer finds a crash, a sanitizer report, a timeout or an allocation
# over the limit; the input is saved as build-fuzz/crash-* (or leak-*, timeout-*, oom-*).
# Reproduce one: build-fuzz/gguf_fuzz build-fuzz/crash-<hash>
# Usage: scripts/fuzz-gguf.sh [SECONDS]     (works from any directory; needs clang++ >= 14)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
secs="${1:-60}"
out="$root/build-fuzz"
cxx="${CXX_FUZZ:-$(command -v clang++ || command -v clang++-14)}"
mkdir -p "$out/corpus" "$out/seeds"

common=(-std=c++20 -O1 -g -I"$root" -fno-omit-frame-pointer)
lib_srcs=("$root/core/status.cpp" "$root/model/ggml_type.cpp")

echo "[fuzz-gguf] building $out/gguf_fuzz with $cxx" >&2
"$cxx" "${common[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  "${lib_srcs[@]}" "$root/model/gguf.cpp" "$root/model/dequant.cpp" "$root/tools/fuzz/gguf_fuzz.cpp" \
  -o "$out/gguf_fuzz"
"$cxx" "${common[@]}" -fsanitize=address,undefined -fno-sanitize-recover=undefined \
  "${lib_srcs[@]}" "$root/model/gguf_writer.cpp" "$root/tools/fuzz/gguf_fuzz_seeds.cpp" \
  -o "$out/gguf_fuzz_seeds"
"$out/gguf_fuzz_seeds" "$out/seeds"

echo "[fuzz-gguf] fuzzing for ${secs}s (corpus $out/corpus)" >&2
# NOTE: -malloc_limit_mb is far below the default: the reader promises allocations bounded by
# a small multiple of the input size, and inputs are at most -max_len bytes.
"$out/gguf_fuzz" -max_total_time="$secs" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
  -malloc_limit_mb=64 -print_final_stats=1 -artifact_prefix="$out/" "$out/corpus" "$out/seeds"
echo "[fuzz-gguf] no crash in ${secs}s" >&2
