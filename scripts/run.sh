#!/usr/bin/env bash
# The main job on a fresh machine: installs the Debian packages, fetches the default model,
# builds, and generates a chat answer with the default model (greedy, n-gram speculation, k = 4).
# Usage: scripts/run.sh [extra `specserve generate` flags]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
"$here/scripts/setup-deps.sh"
model="$("$here/scripts/fetch-model.sh" | tail -n 1)"
"$here/scripts/build.sh"
set -x
"$here/build/bin/specserve" generate --model "$model" \
  --chat "Explain speculative decoding in two sentences." --max-tokens 96 --num-speculative-tokens 4 "$@"
