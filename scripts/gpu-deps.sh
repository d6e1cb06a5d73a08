#!/usr/bin/env bash
# gpu-deps: downloads (here, with apt-get download; nothing is installed) the Debian packages that
# scripts/gpu-check.sh's kernels-only build needs beyond a CUDA image: GoogleTest, nlohmann-json, OpenBLAS and
# its Fortran runtime. They land in .gpudeps/ (git-ignored); name .gpudeps in the device tool's `carry`.
# MPI is not carried (its dependency chain is ~170 packages): without MPI on the GPU machine gpu-check runs in
# kernels-only mode.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpudeps
cd .gpudeps
apt-get download nlohmann-json3-dev libgtest-dev libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread \
  libopenblas0 libgfortran5 libfmt-dev libfmt9 libcli11-dev
du -sh .
