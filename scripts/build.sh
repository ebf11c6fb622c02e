#!/usr/bin/env bash
# Configures and builds specserve (Release-with-debug-info, ccache, Ninja) into build/.
# Usage: scripts/build.sh [extra cmake args]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${SPECSERVE_BUILD_DIR:-$here/build}"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
# Hits across clones in other folders (CI clones afresh): paths relative to the repo, cwd not hashed.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$here}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
cmake -S "$here" -B "$build" -G Ninja "$@" >/dev/null
jobs="${SPECSERVE_BUILD_JOBS:-$(nproc)}"
echo "[build] building with $jobs jobs into $build" >&2
ninja -C "$build" -j "$jobs" | grep -vE "^\[[0-9]+/[0-9]+\] (Building|Linking)" || true
test "${PIPESTATUS[0]}" -eq 0
