#!/usr/bin/env bash
# Creates (once) the Python virtual environment with the reference implementations the
# recording tools and end-to-end tests use: gguf, numpy, tokenizers, openai, llama-cpp-python
# (built from PyPI's source distribution; takes several minutes the first time).
# --with-llama-server adds llama.cpp's OpenAI-compatible server (`python -m llama_cpp.server`,
# the `server` extras of llama-cpp-python 0.3.36) for bench/run_http_bench.sh.
# Prints the venv's python path on stdout.
# Usage: scripts/venv.sh [--with-llama] [--with-llama-server] [--with-plot]
set -euo pipefail
cache="${SPECSERVE_CACHE:-$HOME/.cache/specserve}"
venv="$cache/venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --upgrade pip >&2
fi
need=(numpy tokenizers openai)
for p in "${need[@]}"; do
  "$venv/bin/python" -c "import $p" 2>/dev/null || "$venv/bin/pip" install -q "$p" >&2
done
# gguf pinned: tests/e2e/quantize_head_test.py checks that tools/train/quantize_head.py rewrites the
# committed heads byte for byte, and the writer's layout may change between releases.
gguf_version=0.19.0
"$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('gguf') != '$gguf_version')" 2>/dev/null ||
  "$venv/bin/pip" install -q "gguf==$gguf_version" >&2
need_llama() {
  if ! "$venv/bin/python" -c "import llama_cpp" 2>/dev/null; then
    echo "[venv] building llama-cpp-python from source (several minutes)" >&2
    "$venv/bin/pip" install "llama-cpp-python==0.3.36" >&2
  fi
}
for arg in "$@"; do
  case "$arg" in
    --with-llama) need_llama ;;
    --with-llama-server)
      need_llama
      # NOTE: the extras' requirements (llama-cpp-python 0.3.36's METADATA, extra == "server") are
      # installed by name: `pip install llama-cpp-python[server]` could decide to rebuild the wheel.
      if ! "$venv/bin/python" -c "import llama_cpp.server.app, uvicorn, fastapi, pydantic_settings, sse_starlette, starlette_context, yaml" 2>/dev/null; then
        "$venv/bin/pip" install -q "uvicorn>=0.22.0" "fastapi>=0.100.0" "pydantic-settings>=2.0.1" "sse-starlette>=1.6.1" \
          "starlette-context>=0.3.6,<0.4" "PyYAML>=5.1" >&2
      fi ;;
    --with-plot)
      "$venv/bin/python" -c "import matplotlib" 2>/dev/null || "$venv/bin/pip" install -q matplotlib >&2 ;;
    *) echo "usage: scripts/venv.sh [--with-llama] [--with-llama-server] [--with-plot]" >&2; exit 2 ;;
  esac
done
echo "$venv/bin/python"
