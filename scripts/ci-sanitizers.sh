#!/usr/bin/env bash
# CI's sanitizer jobs (docs/reliability.md "Sanitizers"):
#   asan  build-asan: ASan + UBSan (-O1), leaks included: the unit tests (ctest -L unit; not the fidelity tables,
#         label fidelity: published tables simulated at scale, minutes each even without ASan), then the MPI tests
#         of ASAN_MPI_TESTS below, one or two per communication path of the runtime (ASAN_MPI=all: every MPI test);
#   tsan  build-tsan: ThreadSanitizer, the executor's tests, whose multi-stream programs run one thread per stream.
# Usage: scripts/ci-sanitizers.sh [asan|tsan|all]   (default all). Fails on any failing test and on any sanitizer
# report, even one from a process whose test passes on its output alone (reports go to files, checked at the end).
# Environment: JOBS (default nproc), ASAN_BUILD / TSAN_BUILD (build folders), ASAN_MPI (ci: the list below,
# all: every MPI test, about 45 min on 2 cores). ccache is used when installed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WHAT=${1:-all}
case "$WHAT" in asan | tsan | all) ;; *)
  echo "ci-sanitizers: '$WHAT' is not a job; use asan, tsan or all (default)" >&2
  exit 2
  ;;
esac
ASAN_MPI=${ASAN_MPI:-ci}
case "$ASAN_MPI" in ci | all) ;; *)
  echo "ci-sanitizers: ASAN_MPI='$ASAN_MPI' is not a set of MPI tests; use ci (default) or all" >&2
  exit 2
  ;;
esac
JOBS=${JOBS:-$(nproc)}
ASAN_BUILD=${ASAN_BUILD:-build-asan}
TSAN_BUILD=${TSAN_BUILD:-build-tsan}
SUPP=$ROOT/scripts/sanitizers
scripts/setup.sh
. scripts/env.sh

# -O1 -g1: the usual sanitizer trade-off (fast enough to compile and run, line numbers in every report); no CUDA
# (not instrumented, and no GPU in CI), no benchmarks, no Python module (an instrumented extension would need the
# ASan runtime preloaded into python3).
CONFIG=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
  -DPIPER_CUDA=OFF -DPIPER_BUILD_BENCH=OFF -DPIPER_PYTHON=OFF)
if command -v ccache >/dev/null; then CONFIG+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

# configure BUILD SANITIZERS [TARGETS...]: configure BUILD with -DPIPER_SANITIZE=SANITIZERS and build TARGETS
# (all of the build when none are named).
build() {
  local dir=$1 sanitizers=$2
  shift 2
  cmake -S . -B "$dir" "${CONFIG[@]}" "-DPIPER_SANITIZE=$sanitizers" >/dev/null
  if [ $# -gt 0 ]; then
    nice cmake --build "$dir" -j"$JOBS" --target "$@"
  else
    nice cmake --build "$dir" -j"$JOBS"
  fi
}

# check_reports DIR LOG NAME: fail when a sanitizer wrote a report file in DIR (log_path below) or a report to the
# tests' output (LOG, ctest's full log): UBSan, linked with ASan, ignores log_path and prints to stderr.
check_reports() {
  local dir=$1 log=$2 name=$3 found=0
  if compgen -G "$dir/*" >/dev/null; then
    echo "ci-sanitizers: $name: sanitizer reports:" >&2
    for f in "$dir"/*; do
      echo "== $f" >&2
      cat "$f" >&2
    done
    found=1
  fi
  if grep -E -n "runtime error:|ERROR: (Address|Leak|UndefinedBehavior)Sanitizer|WARNING: ThreadSanitizer" "$log" >&2; then
    echo "ci-sanitizers: $name: sanitizer reports in the tests' output ($log, lines above)" >&2
    found=1
  fi
  if [ $found = 1 ]; then return 1; fi
  echo "ci-sanitizers: $name: no sanitizer report"
}

# The MPI tests of CI's ASan job. Every MPI test under ASan takes about 45 min on 2 cores (the MPI ranks run with
# fast_unwind_on_malloc=0, below, which costs 3-4x CPU on every allocation), more than CI's budget leaves; these
# run each communication path of the runtime and comm at least once, in about 5 min: the collectives, the
# all-to-all and HALO algorithms and the abort probe (comm); the DataParallel/ZeRO-3, PipelineP2p, TensorParallel
# (with dp and ZeRO), ExpertParallel (HALO, and flat with overlap) and M2n (af-pipe with ZeRO and recomputation)
# handlers; a schedule from emitted directives with pp x ep; a checkpoint resharded on resume; an expert migration
# with ZeRO-sharded state; a hung rank, a rank killed during a save, the checkpoint CLI's refusals, and
# `piper calibrate --ranks` (the link calibration's ranks, measuring beside spinning compute threads).
# docs/reliability.md ("Sanitizers") has the last run of the whole set (ASAN_MPI=all).
ASAN_MPI_TESTS=(
  comm_mpi_tests_np4 comm_algo_mpi_tests_np4 comm_halo_traffic_mpi_tests_np4 comm_abort_probe_np2
  comm_link_calibration_mpi_tests_np3
  runtime_parity_dp2_zero3_np2 runtime_parity_pp2_dualpipev_np2 runtime_parity_dense_dp2_tp2_nosp_zero_np4
  runtime_parity_ep2_halo_np2 runtime_parity_ep2_overlap_np2 runtime_parity_afpipe_2a2f_zero_recompute_np4
  runtime_directives_emitted_dualpipev_ep2_np4 runtime_ckpt_resume_1_to_dp2_zero3_np2
  runtime_migrate_zero_sharded_np4 runtime_hung_rank_dp2_np2 runtime_parity_dp2_tp2_ep2_etp2_np4
  runtime_ckpt_resume_af_pipe_ep2_to_1_np4
  'KilledRank\.DuringSaveLeavesThePreviousCheckpointAndResumeIsBitwise' 'CheckpointCli\..*'
  'CalibrateCliTest\.RanksMeasureTheLinks'
)

status=0

if [ "$WHAT" = asan ] || [ "$WHAT" = all ]; then
  start=$SECONDS
  # Only what this job runs: the unit and MPI test binaries (piper_tests_<label>, cmake/piper.cmake) and the piper
  # binary that the CLI tests in compile_tests, sim_tests and runtime_ckpt_kill_tests (and comm's `piper bench comm`
  # tests) run; not the e2e, fidelity or benchmark binaries, which it does not run.
  build "$ASAN_BUILD" address,undefined piper piper_tests_unit piper_tests_mpi
  built=$SECONDS
  reports=$ROOT/$ASAN_BUILD/sanitizer-reports
  rm -rf "$reports" && mkdir -p "$reports/unit" "$reports/mpi"
  # Reports go to files (log_path) so that none is lost in a passing test's output or a subprocess's discarded
  # stderr. The MPI tests run with fast_unwind_on_malloc=0: OpenMPI's components have no frame pointers and are
  # unloaded at MPI_Finalize, so only a full unwind reaches the frames in libmpi/libopen-pal that the LSan
  # suppressions (scripts/sanitizers/lsan.supp) name. Every variable reaches the MPI ranks: they are forked by
  # the local mpirun, and mca_base_env_list forwards them explicitly as well (as mpirun -x would).
  asan_opts="detect_leaks=1:check_initialization_order=1:strict_init_order=1"
  export ASAN_OPTIONS="log_path=$reports/unit/asan:$asan_opts"
  export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  export OMPI_MCA_mca_base_env_list="ASAN_OPTIONS;LSAN_OPTIONS;UBSAN_OPTIONS"
  log=$ASAN_BUILD/Testing/Temporary/LastTest.log
  (cd "$ASAN_BUILD" && nice ctest -L unit --output-on-failure -j"$JOBS" --timeout 900) || status=1
  check_reports "$reports/unit" "$log" "ASan + UBSan (unit)" || status=1
  unit=$SECONDS
  ASAN_OPTIONS="log_path=$reports/mpi/asan:$asan_opts:fast_unwind_on_malloc=0"
  select=(-L mpi)
  if [ "$ASAN_MPI" = ci ]; then
    select+=(-R "^($(IFS='|'; echo "${ASAN_MPI_TESTS[*]}"))\$")
    # Each entry on its own: a count over the whole list would hide a vanished test behind a pattern matching two.
    for t in "${ASAN_MPI_TESTS[@]}"; do
      if [ "$(cd "$ASAN_BUILD" && ctest -N -L mpi -R "^$t\$" | grep -c 'Test *#')" = 0 ]; then
        echo "ci-sanitizers: ASAN_MPI_TESTS entry '$t' matches no MPI test: a test was renamed or removed;" \
          "update the list in $0" >&2
        status=1
      fi
    done
  fi
  (cd "$ASAN_BUILD" && nice ctest "${select[@]}" --output-on-failure -j"$JOBS" --timeout 900) || status=1
  check_reports "$reports/mpi" "$log" "ASan + UBSan (mpi)" || status=1
  unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS OMPI_MCA_mca_base_env_list
  echo "ci-sanitizers: ASan + UBSan: build $((built - start)) s, unit tests $((unit - built)) s, mpi tests $((SECONDS - unit)) s"
fi

if [ "$WHAT" = tsan ] || [ "$WHAT" = all ]; then
  start=$SECONDS
  build "$TSAN_BUILD" thread runtime_exec_tests
  built=$SECONDS
  reports=$ROOT/$TSAN_BUILD/sanitizer-reports
  rm -rf "$reports" && mkdir -p "$reports"
  # Kernels on one thread (OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1): libgomp and OpenBLAS are not built with
  # TSan, so the barriers that order their workers are invisible to it and every parallel loop would be reported.
  # The threads left are the executor's, one per stream: what this job checks.
  export TSAN_OPTIONS="log_path=$reports/tsan:halt_on_error=0:second_deadlock_stack=1:suppressions=$SUPP/tsan.supp"
  export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
  (cd "$TSAN_BUILD" && nice ctest -R '^(ExecutorTest|TraceTest)\.' --output-on-failure -j"$JOBS" --timeout 900) ||
    status=1
  check_reports "$reports" "$TSAN_BUILD/Testing/Temporary/LastTest.log" "TSan" || status=1
  unset TSAN_OPTIONS OMP_NUM_THREADS OPENBLAS_NUM_THREADS
  echo "ci-sanitizers: TSan: build $((built - start)) s, tests $((SECONDS - built)) s"
fi

exit $status
