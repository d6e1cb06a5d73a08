#!/usr/bin/env bash
# CI: builds the libFuzzer targets (build-fuzz, clang 14, ASan + UBSan) and runs each for 30 s with its seed corpus,
# as many at once as there are cores; fails on any crash, leak, sanitizer report or timeout (scripts/fuzz.sh).
# About 6 minutes on 2 cores from a cold build (docs/reliability.md, "Fuzzing").
set -euo pipefail
cd "$(dirname "$0")/.."
make fuzz FUZZ_SECONDS="${FUZZ_SECONDS:-30}" FUZZ_JOBS="$(nproc)"
