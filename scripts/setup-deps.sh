#!/usr/bin/env bash
# Installs the Debian packages specserve builds against. Idempotent: installs only what is missing.
# Usage: scripts/setup-deps.sh
set -euo pipefail
pkgs=(build-essential cmake ninja-build ccache pkg-config clang libclang-rt-14-dev
      libcaf-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev
      libopenblas-dev nlohmann-json3-dev libcpp-httplib-dev libssl-dev libcli11-dev libucx-dev ucx-utils
      libgloo-dev libpcre2-dev libxxhash-dev python3-venv curl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup-deps] installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "[setup-deps] all Debian packages present"
fi
