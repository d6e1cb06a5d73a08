#!/usr/bin/env bash
# Installs the Debian packages Piper needs, only those missing (idempotent; run as root or with sudo).
# Usage: scripts/setup.sh [fuzz]
set -euo pipefail

PACKAGES=(
  cmake ninja-build g++ pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev
  libopenmpi-dev openmpi-bin
  libopenblas-dev libdnnl-dev
  coinor-libcbc-dev
  fortunes fortunes-min
  python3-dev pybind11-dev python3-pybind11 python3-pytest python3-matplotlib  # the Python module (docs/python.md)
)
# `scripts/setup.sh fuzz` (make fuzz, scripts/ci-fuzz.sh): also clang 14 with libFuzzer and the sanitizer runtimes
# (libclang-rt-14-dev), llvm-symbolizer (llvm-14) for readable crash stacks, and GNU time (each target's CPU time).
if [ "${1:-}" = "fuzz" ]; then
  PACKAGES+=(clang-14 libclang-rt-14-dev llvm-14 time)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "setup: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
