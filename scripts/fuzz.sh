#!/usr/bin/env bash
# Runs the libFuzzer targets of fuzz/ (built in build-fuzz by scripts/ci-fuzz.sh or `make fuzz`), each for
# SECONDS with its seed corpus and dictionary, and fails if any of them finds a crash, a leak, a sanitizer report
# or a timeout. New corpus entries and crash inputs go to a scratch directory (FUZZ_WORK, default a new
# /tmp/piper-fuzz.XXXXXX), never into the repository's fuzz/corpus.
#
#   scripts/fuzz.sh SECONDS [TARGET...]     default: every target in build-fuzz/fuzz
# Environment: FUZZ_BUILD (build-fuzz), FUZZ_JOBS (targets run at once, default 1), FUZZ_WORK, FUZZ_NICE (0),
# FUZZ_FORK=1 (long campaigns: libFuzzer's fork mode keeps going after a crash and counts the crashes; each crash
# input is still saved and the target still fails).
# Prints one line per target: wall seconds, CPU seconds (user + system, fork mode's children included: on a shared
# machine the CPU time, not the wall time, is what the target really ran), execs, corpus entries, crashes and the
# result; the logs stay in FUZZ_WORK.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:?usage: scripts/fuzz.sh SECONDS [TARGET...]}
shift
build=${FUZZ_BUILD:-build-fuzz}
jobs=${FUZZ_JOBS:-1}
work=${FUZZ_WORK:-$(mktemp -d /tmp/piper-fuzz.XXXXXX)}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for t in "$build"/fuzz/*_fuzz; do targets+=("$(basename "$t" _fuzz)"); done
fi
[ ${#targets[@]} -gt 0 ] || { echo "fuzz: no targets in $build/fuzz; build them first (make fuzz)" >&2; exit 1; }

run_one() {
  local t=$1 dir="$work/$1"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  local dict=()
  [ -f "fuzz/dict/$t.dict" ] && dict=(-dict="fuzz/dict/$t.dict")
  # The first corpus directory receives new entries; fuzz/corpus/$t is only read.
  local mode=(-print_final_stats=1)
  [ "${FUZZ_FORK:-0}" = 1 ] && mode=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  local rc=0
  /usr/bin/time -f '%U %S' -o "$dir/cpu" nice -n "${FUZZ_NICE:-0}" "$build/fuzz/${t}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    "${mode[@]}" "${dict[@]}" -artifact_prefix="$dir/artifacts/" "$dir/corpus" "fuzz/corpus/$t" \
    >"$dir/log" 2>&1 || rc=$?
  local execs corpus crashes cpu
  cpu=$(awk 'END { printf "%d", $1 + $2 }' "$dir/cpu" 2>/dev/null || echo '?')
  crashes=$(find "$dir/artifacts" -type f | wc -l)
  if [ "${FUZZ_FORK:-0}" = 1 ]; then  # fork mode's status lines: "#EXECS: cov: C ft: F corp: N exec/s ..."
    execs=$(grep -oE '^#[0-9]+: cov' "$dir/log" | tail -1 | tr -dc '0-9')
    corpus=$(grep -oE 'corp: [0-9]+' "$dir/log" | tail -1 | cut -d' ' -f2)
  else
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
    corpus=$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' "$dir/log" | tail -1 | cut -d' ' -f2)
  fi
  if [ "$rc" -eq 0 ] && [ "$crashes" -eq 0 ]; then
    printf '%-20s %5ss  cpu %6ss  execs %-10s corpus %-12s crashes 0  ok\n' "$t" "$seconds" "$cpu" "${execs:-?}" \
      "${corpus:-?}"
  else
    printf '%-20s %5ss  cpu %6ss  execs %-10s corpus %-12s crashes %s  FAILED (exit %s): %s\n' "$t" "$seconds" \
      "$cpu" "${execs:-?}" "${corpus:-?}" "$crashes" "$rc" "$(grep -m1 -E 'SUMMARY|ERROR|invariant' "$dir/log" || true)"
    grep -m1 -E 'Test unit written to' "$dir/log" || true
    return 1
  fi
}

echo "fuzz: ${#targets[@]} targets x ${seconds}s, $jobs at a time; logs and new inputs in $work"
failed=0
pids=()
for t in "${targets[@]}"; do
  [ -x "$build/fuzz/${t}_fuzz" ] || { echo "fuzz: no target $build/fuzz/${t}_fuzz" >&2; exit 1; }
  run_one "$t" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
if [ "$failed" -ne 0 ]; then
  echo "fuzz: FAILED; the crashing inputs are in $work/<target>/artifacts (add each to fuzz/corpus/<target>/ once fixed)" >&2
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets ran ${seconds}s without a crash, leak or sanitizer report"
