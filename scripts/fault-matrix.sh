#!/usr/bin/env bash
# The whole kill-at-point matrix (docs/reliability.md, "Faults"): every row of tests/runtime/fault_matrix_test.cc
# (5 points x 2 strategies x kill and stop, 4 ranks of tiny-moe), printed as a Markdown table. Each row arms
# PIPER_FAULT, measures how long the surviving ranks take to exit after the fault fires, checks the launcher's
# summary names the faulty rank, that no process is left, and that --resume is bitwise.
#
#   scripts/fault-matrix.sh [BUILD_DIR]        (default build; builds the test binary and piper first)
#
# Exit status: non-zero when any row failed. Takes about 4-6 minutes on 2 cores.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
cmake --build "$BUILD" --target piper runtime_fault_matrix_tests >/dev/null
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
PIPER_FAULT_MATRIX=full "$BUILD/tests/runtime/runtime_fault_matrix_tests" --gtest_filter='Rows/FaultMatrix.*' >"$log" 2>&1
rc=$?
set -e
echo "| point | strategy (4 ranks) | action | rank@step | exit after fault (s) | launcher names | survivors whose heartbeat named it | survivors that printed their error | resumed from | losses after resume |"
echo "|---|---|---|---|---|---|---|---|---|---|"
grep '^| ' "$log" || true
grep -E '^\[  (FAILED|PASSED) ' "$log" | sed 's/^/# /'
[ $rc -eq 0 ] || { echo "# failures:"; grep -B2 -A12 'Failure' "$log" | head -80; }
exit $rc
