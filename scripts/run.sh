#!/usr/bin/env bash
# The main job on a fresh machine: installs the Debian packages, fetches the default model,
# builds, launches the cluster of examples/cluster-local.yaml (head, target shard and n-gram
# draft worker as separate processes), submits four chat jobs at once through the actor client
# API, prints their completions with acceptance statistics, and stops the cluster.
# Usage: scripts/run.sh [extra `specserve client` flags, e.g. --max-tokens 128 --temperature 0.7]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
"$here/scripts/setup-deps.sh"
"$here/scripts/fetch-model.sh" >/dev/null
"$here/scripts/build.sh"
bin="$here/build/bin/specserve"
config="$here/examples/cluster-local.yaml"
ready="$(mktemp -u /tmp/specserve-ready.XXXXXX)"
"$bin" up "$config" --ready-file "$ready" &
up_pid=$!
trap 'kill -TERM $up_pid 2>/dev/null || true; wait $up_pid 2>/dev/null || true; rm -f "$ready"' EXIT
for _ in $(seq 600); do
  [[ -f "$ready" ]] && break
  kill -0 $up_pid 2>/dev/null || { echo "scripts/run.sh: specserve up failed (see above)" >&2; exit 1; }
  sleep 0.2
done
[[ -f "$ready" ]] || { echo "scripts/run.sh: the cluster was not ready within 120 s" >&2; exit 1; }
set -x
"$bin" client --config "$config" --max-tokens 64 \
  --chat "Explain speculative decoding in two sentences." \
  --chat "Write a haiku about the sea." \
  --chat "List the first five prime numbers and say why each is prime." \
  --chat "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog." \
  "$@"
"$bin" status --config "$config"
