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
# The progress lines are dropped; ninja's own status decides (with pipefail, `|| true` would
# otherwise reset PIPESTATUS and hide a failed build).
status=(0)
ninja -C "$build" -j "$jobs" | grep -vE "^\[[0-9]+/[0-9]+\] (Building|Linking)" || status=("${PIPESTATUS[@]}")
if [ "${status[0]}" -ne 0 ]; then
  echo "[build] ninja failed (exit ${status[0]})" >&2
  exit "${status[0]}"
fi
