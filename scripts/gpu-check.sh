#!/usr/bin/env bash
# gpu-check: on a machine with an NVIDIA GPU (e.g. the device tool's H200: 16 cores, no internet, no ccache),
# builds Piper with the CUDA backend, runs the GPU tests and the GPU benchmark, and writes one JSON summary.
# Meant to finish well inside 10 minutes.
#
#   scripts/gpu-check.sh [SUMMARY.json]      default: $OUT/gpu-check.json when $OUT is set, else build-gpu/
#   GPU_CHECK_MODE=kernels scripts/gpu-check.sh   only the kernel tests and the benchmark (no full configure)
#
# Modes: "full" (every dependency present: also the --device cuda 20-step loss parity, `piper train --device
# cuda` and the NCCL tests) or, when the full configure fails (no MPI, CLI11 or fmt there), "kernels"
# (-DPIPER_GPU_KERNELS_ONLY=ON: the kernel tests and the benchmark only; the summary says so).
# Missing Debian packages can travel in .gpudeps/ (scripts/gpu-deps.sh fills it here, ~20 MB incl. Open MPI's
# libraries); they are unpacked into /tmp/gpudeps and put on the search paths.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
BUILD=${BUILD_GPU:-build-gpu}
OUTDIR=${OUT:-$BUILD}
SUMMARY=${1:-$OUTDIR/gpu-check.json}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUTDIR" "$BUILD"
LOG="$OUTDIR/gpu-check.log"
: >"$LOG"
log() { echo "[gpu-check +$(($(date +%s) - start))s] $*" | tee -a "$LOG"; }
export PATH="/usr/local/cuda/bin:$PATH"

if compgen -G ".gpudeps/*.deb" >/dev/null; then
  mkdir -p /tmp/gpudeps
  for f in .gpudeps/*.deb; do dpkg -x "$f" /tmp/gpudeps; done
  export CMAKE_PREFIX_PATH="/tmp/gpudeps/usr:/tmp/gpudeps/usr/lib/x86_64-linux-gnu/cmake${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="/tmp/gpudeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CPATH="/tmp/gpudeps/usr/include${CPATH:+:$CPATH}"
  export LIBRARY_PATH="/tmp/gpudeps/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
  # dpkg -x runs no maintainer scripts: point the packages' CMake files at the unpacked tree.
  find /tmp/gpudeps -name "*.cmake" -exec sed -i 's#\([ ("]\)/usr/#\1/tmp/gpudeps/usr/#g' {} +
  log "unpacked $(ls .gpudeps/*.deb | wc -l) carried packages into /tmp/gpudeps"
fi
EXTRA=()
blas_cfg=/tmp/gpudeps/usr/lib/x86_64-linux-gnu/openblas-pthread/cmake/openblas
[ -d "$blas_cfg" ] && EXTRA+=(-DOpenBLAS_DIR="$blas_cfg")
mpi_lib=/tmp/gpudeps/usr/lib/x86_64-linux-gnu/libmpi.so.40
if [ -e "$mpi_lib" ] && ! command -v mpicxx >/dev/null; then
  # Carried Open MPI without its wrappers: hand FindMPI the header and the library.
  EXTRA+=(-DMPI_SKIP_COMPILER_WRAPPER=ON -DMPI_CXX_HEADER_DIR=/tmp/gpudeps/usr/lib/x86_64-linux-gnu/openmpi/include
    -DMPI_CXX_LIB_NAMES=mpi -DMPI_mpi_LIBRARY="$mpi_lib")
  export OPAL_PREFIX=/tmp/gpudeps/usr
fi

nvidia-smi -L >>"$LOG" 2>&1 || log "nvidia-smi failed (continuing: the tests say whether CUDA sees a device)"
missing=""
for tool in cmake g++ nvcc; do command -v "$tool" >/dev/null || missing="$missing $tool"; done
if [ -n "$missing" ]; then
  log "missing tools:$missing"
  printf '{"ok": false, "error": "missing tools:%s"}\n' "$missing" >"$SUMMARY"
  exit 2
fi
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
COMMON=(-DCMAKE_BUILD_TYPE=Release -DPIPER_CUDA=ON -DPIPER_WERROR=OFF "${EXTRA[@]}")

MODE=full
if [ "${GPU_CHECK_MODE:-auto}" = kernels ]; then
  log "GPU_CHECK_MODE=kernels: skipping the full configure"
  false
else
  log "configure (full)"
  cmake -S . -B "$BUILD" "${GEN[@]}" "${COMMON[@]}" >>"$LOG" 2>&1
fi
if [ $? -ne 0 ]; then
  MODE=kernels
  log "full configure failed or skipped; configuring kernels only (-DPIPER_GPU_KERNELS_ONLY=ON)"
  rm -rf "$BUILD"
  if ! cmake -S . -B "$BUILD" "${GEN[@]}" "${COMMON[@]}" -DPIPER_GPU_KERNELS_ONLY=ON >>"$LOG" 2>&1; then
    log "kernels-only configure failed too"
    printf '{"ok": false, "error": "configure failed", "log": "%s"}\n' "$LOG" >"$SUMMARY"
    exit 2
  fi
fi
TARGETS=(cuda_host_tests cuda_kernels_tests piper_gpu_bench)
[ "$MODE" = full ] && TARGETS+=(runtime_gpu_tests piper comm_nccl_tests)
log "build ($MODE): ${TARGETS[*]} with -j$JOBS"
bstart=$(date +%s)
if ! cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" >>"$LOG" 2>&1; then
  log "build failed"
  tail -40 "$LOG"
  printf '{"ok": false, "mode": "%s", "error": "build failed"}\n' "$MODE" >"$SUMMARY"
  exit 2
fi
build_s=$(($(date +%s) - bstart))
log "built in ${build_s}s"

declare -A RC
run_gtest() {  # name binary [filter]
  local name=$1 bin=$2
  log "test $name"
  timeout 240 "$bin" --gtest_output="json:$BUILD/$name.json" >>"$LOG" 2>&1
  RC[$name]=$?
  log "test $name rc=${RC[$name]}"
}
run_gtest cuda_host_tests "$BUILD/tests/kernels/cuda_host_tests"
run_gtest cuda_kernels_tests "$BUILD/tests/kernels/cuda_kernels_tests"
if [ "$MODE" = full ]; then
  run_gtest runtime_gpu_tests "$BUILD/tests/runtime/runtime_gpu_tests"
  log "piper train --model tiny-moe --device cuda --steps 20"
  timeout 180 "$BUILD/src/cli/piper" train --model tiny-moe --device cuda --steps 20 --json \
    >"$BUILD/train_cuda.json" 2>>"$LOG"
  RC[train_cuda]=$?
  log "train --device cuda rc=${RC[train_cuda]}"
  timeout 180 "$BUILD/src/cli/piper" train --model tiny-moe --device cpu --steps 20 --json \
    >"$BUILD/train_cpu.json" 2>>"$LOG"
  RC[train_cpu]=$?
  if command -v mpirun >/dev/null; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    log "NCCL tests on 1 rank"
    timeout 120 mpirun -n 1 "$BUILD/tests/comm/comm_nccl_tests" --gtest_output="json:$BUILD/comm_nccl_tests.json" \
      >>"$LOG" 2>&1
    RC[comm_nccl_tests]=$?
  fi
fi
log "benchmark"
timeout 300 "$BUILD/bench/gpu/piper_gpu_bench" "$OUTDIR/gpu-bench.json" >>"$LOG" 2>&1
RC[bench]=$?
log "benchmark rc=${RC[bench]}"

# Summary: mode, device, build time, each test binary's counts and failures, the training runs, the benchmark.
rcs=""
for k in "${!RC[@]}"; do rcs="$rcs$k=${RC[$k]} "; done
python3 - "$SUMMARY" "$BUILD" "$OUTDIR" "$MODE" "$build_s" "$(($(date +%s) - start))" "$rcs" <<'PY'
import json, os, sys
summary, build, outdir, mode, build_s, total_s, rcs = sys.argv[1:8]
rc = dict(kv.split("=") for kv in rcs.split())
out = {"mode": mode, "build_seconds": int(build_s), "total_seconds": int(total_s),
       "exit_codes": {k: int(v) for k, v in rc.items()}, "tests": {}}
if mode != "full":
    why = ("GPU_CHECK_MODE=kernels" if os.environ.get("GPU_CHECK_MODE") == "kernels"
           else "the full configure failed on this machine (MPI/CLI11/fmt missing? see the log)")
    out["not_run"] = "runtime_gpu_tests (20-step loss parity), piper train --device cuda, NCCL tests: " + why
for name in ["cuda_host_tests", "cuda_kernels_tests", "runtime_gpu_tests", "comm_nccl_tests"]:
    p = os.path.join(build, name + ".json")
    if not os.path.exists(p):
        continue
    j = json.load(open(p))
    cases = [c for s in j.get("testsuites", []) for c in s.get("testsuite", [])]
    out["tests"][name] = {
        "tests": j.get("tests"), "failures": j.get("failures"), "errors": j.get("errors"),
        "skipped": [c["classname"] + "." + c["name"] for c in cases if c.get("result") == "SKIPPED"],
        "failed": [c["classname"] + "." + c["name"] for c in cases if c.get("failures")]}
for name in ["train_cuda", "train_cpu"]:
    p = os.path.join(build, name + ".json")
    try:
        j = json.load(open(p))
        out[name] = {"losses": [s["loss"] for s in j.get("steps", [])], "seconds": j.get("seconds")}
    except Exception as e:  # noqa: BLE001
        if os.path.exists(p):
            out[name] = {"error": str(e)}
if "train_cuda" in out and "train_cpu" in out and "losses" in out["train_cuda"] and "losses" in out["train_cpu"]:
    g, c = out["train_cuda"]["losses"], out["train_cpu"]["losses"]
    out["train_max_rel_diff"] = max(abs(a - b) / abs(b) for a, b in zip(g, c)) if g and c else None
try:
    out["bench"] = json.load(open(os.path.join(outdir, "gpu-bench.json")))
except Exception as e:  # noqa: BLE001
    out["bench"] = {"error": str(e)}
bad = [k for k, v in out["exit_codes"].items() if v != 0]
kt = out["tests"].get("cuda_kernels_tests")
if kt and kt["tests"] and len(kt["skipped"]) == kt["tests"]:
    out["note"] = "every CUDA kernel test skipped: CUDA saw no usable device (see the log)"
out["ok"] = not bad and all(t["failures"] == 0 for t in out["tests"].values()) and "note" not in out
json.dump(out, open(summary, "w"), indent=2)
print(json.dumps(out, indent=2))
PY
log "summary: $SUMMARY"
