#!/usr/bin/env bash
# gpu-deps: downloads (here, with apt-get download; nothing is installed) the Debian packages that
# scripts/gpu-check.sh's full build needs beyond a CUDA image: GoogleTest, nlohmann-json, CLI11, fmt, OpenBLAS
# with its Fortran runtime, and Open MPI's libraries and headers (no compiler wrappers are used: gpu-check
# points FindMPI at the unpacked files). About 20 MB; they land in .gpudeps/ (git-ignored): name .gpudeps in
# the device tool's `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpudeps
cd .gpudeps
apt-get download nlohmann-json3-dev libgtest-dev libcli11-dev libfmt-dev libfmt9 \
  libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0 libgfortran5 \
  libopenmpi-dev libopenmpi3 openmpi-common libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libpmix2 \
  libfabric1 libucx0 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200 libpsm-infinipath1 libpsm2-2 libnuma1 \
  libmunge2 libxnvctrl0 libltdl7
du -sh .
