#!/usr/bin/env bash
# Creates (once) the Python virtual environment with the reference implementations the
# recording tools and end-to-end tests use: gguf, numpy, tokenizers, openai, llama-cpp-python
# (built from PyPI's source distribution; takes several minutes the first time).
# Prints the venv's python path on stdout. Usage: scripts/venv.sh [--with-llama] [--with-plot]
set -euo pipefail
cache="${SPECSERVE_CACHE:-$HOME/.cache/specserve}"
venv="$cache/venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --upgrade pip >&2
fi
need=(gguf numpy tokenizers openai)
for p in "${need[@]}"; do
  "$venv/bin/python" -c "import $p" 2>/dev/null || "$venv/bin/pip" install -q "$p" >&2
done
for arg in "$@"; do
  case "$arg" in
    --with-llama)
      if ! "$venv/bin/python" -c "import llama_cpp" 2>/dev/null; then
        echo "[venv] building llama-cpp-python from source (several minutes)" >&2
        "$venv/bin/pip" install "llama-cpp-python==0.3.36" >&2
      fi ;;
    --with-plot)
      "$venv/bin/python" -c "import matplotlib" 2>/dev/null || "$venv/bin/pip" install -q matplotlib >&2 ;;
    *) echo "usage: scripts/venv.sh [--with-llama] [--with-plot]" >&2; exit 2 ;;
  esac
done
echo "$venv/bin/python"
