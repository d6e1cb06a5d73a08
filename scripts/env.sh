# Sourced by the Makefile's run/test steps: environment that Piper's processes need on this kind of machine.
# OpenBLAS 0.3.21 does not recognise recent Intel cores and silently falls back to slow SSE3 kernels unless
# OPENBLAS_CORETYPE is set before the process starts (docs/gemm.md). Pick a kernel family from the CPU flags.
if [ -z "${OPENBLAS_CORETYPE+x}" ]; then
  if grep -q avx512f /proc/cpuinfo 2>/dev/null; then
    export OPENBLAS_CORETYPE=Cooperlake
  elif grep -q avx2 /proc/cpuinfo 2>/dev/null; then
    export OPENBLAS_CORETYPE=Haswell
  fi
fi
# OpenMPI as root, more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
