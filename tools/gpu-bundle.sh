#!/usr/bin/env bash
# Packs binaries built here for a GPU machine that has the NVIDIA driver and CUDA but none of the
# Debian packages specserve links (CAF, yaml-cpp, spdlog, fmt, UCX and its transport modules,
# OpenBLAS, Gloo, PCRE2, xxhash, libgomp, ...), and cannot install them (no network).
#
# The archive holds:
#   bin/specserve, tests/test_gpu_*   stripped copies of BUILD_DIR's binaries;
#   lib/                              every shared library they (and UCX's modules) resolve to
#                                     here, except glibc, libstdc++/libgcc_s (any newer one
#                                     there serves) and the CUDA driver and toolkit libraries
#                                     (libcuda, cudart, cuBLAS, NCCL), which come from there;
#   lib/ucx/                          UCX's transport modules (UCX_MODULE_DIR points here);
#   env.sh                            sets LD_LIBRARY_PATH (lib/, then the machine's CUDA, cuBLAS
#                                     and NCCL, found under /usr/local/cuda* or PyTorch's
#                                     nvidia-* wheels), UCX_MODULE_DIR and
#                                     SPECSERVE_GPU_CHECK_PREBUILT, then runs its arguments.
# On the GPU machine:
#   mkdir -p /tmp/ss && tar -xJf specserve-gpu.tar.xz -C /tmp/ss
#   /tmp/ss/env.sh tools/gpu-check.sh RESULTS_DIR
# Usage: tools/gpu-bundle.sh BUILD_DIR OUT.tar.xz
# Exit: 0 written; 1 a binary is missing or a library does not resolve here; 2 usage.
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: tools/gpu-bundle.sh BUILD_DIR OUT.tar.xz" >&2
  exit 2
fi
build="$(cd "$1" && pwd)"
out="$2"
here="$(cd "$(dirname "$0")/.." && pwd)"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/tests" "$stage/lib/ucx"

bins=("$build/bin/specserve")
for src in "$here"/tests/gpu/*_test.cpp; do bins+=("$build/tests/test_gpu_$(basename "$src" .cpp)"); done
for b in "${bins[@]}"; do
  if [ ! -x "$b" ]; then
    echo "[gpu-bundle] missing $b: build it first (ninja -C $build specserve test_gpu_...)" >&2
    exit 1
  fi
done
strip -o "$stage/bin/specserve" "$build/bin/specserve"
for b in "${bins[@]:1}"; do strip -o "$stage/tests/$(basename "$b")" "$b"; done

# UCX's transport modules live beside libucs in <libdir>/ucx.
ucs="$(ldd "$build/bin/specserve" | awk '/libucs\.so/ {print $3}')"
if [ -n "$ucs" ] && [ -d "$(dirname "$ucs")/ucx" ]; then
  cp -L "$(dirname "$ucs")"/ucx/*.so* "$stage/lib/ucx/" 2>/dev/null || true
fi

# Libraries the GPU machine provides itself: glibc, the C++ runtime, the CUDA driver and toolkit.
system_lib='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|libutil\.so|libstdc\+\+|libgcc_s|libcuda\.so|libcudart|libcublas|libnccl)'
missing=0
while read -r name path; do
  if [ "$path" = "not" ]; then
    echo "[gpu-bundle] $name does not resolve here" >&2
    missing=1
    continue
  fi
  [[ "$name" =~ $system_lib ]] && continue
  [ -f "$stage/lib/$name" ] || cp -L "$path" "$stage/lib/$name"
done < <(for f in "$stage"/bin/* "$stage"/tests/* "$stage"/lib/ucx/*; do
           [ -f "$f" ] && ldd "$f" 2>/dev/null | awk '/=>/ {print $1, $3}'
         done | sort -u)
[ "$missing" = 0 ] || exit 1

cat >"$stage/env.sh" <<'EOF'
#!/usr/bin/env bash
# Runs its arguments with this bundle's libraries and binaries (see tools/gpu-bundle.sh).
d="$(cd "$(dirname "$0")" && pwd)"
cuda_dirs=""
for lib in libcudart.so.13 libcublas.so.13 libnccl.so.2; do
  found=""
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
             /usr/lib/x86_64-linux-gnu /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib \
             /usr/local/lib/python3*/dist-packages/nvidia/*/lib; do
    if [ -e "$dir/$lib" ]; then found="$dir"; break; fi
  done
  if [ -z "$found" ]; then
    echo "[gpu-bundle] $lib not found on this machine (looked in /usr/local/cuda and nvidia-* wheels)" >&2
  else
    case ":$cuda_dirs:" in *":$found:"*) ;; *) cuda_dirs="$cuda_dirs:$found" ;; esac
  fi
done
export LD_LIBRARY_PATH="$d/lib$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULE_DIR="$d/lib/ucx"
export SPECSERVE_GPU_CHECK_PREBUILT="$d"
export PATH="$d/bin:$PATH"
exec "$@"
EOF
chmod +x "$stage/env.sh"
tar -C "$stage" -cf - . | xz -T0 -9 >"$out"
echo "[gpu-bundle] $out: $(du -h "$out" | cut -f1) ($(ls "$stage/lib" | wc -l) libraries, $(ls "$stage/lib/ucx" | wc -l) UCX modules)"
