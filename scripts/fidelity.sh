#!/usr/bin/env bash
# `make fidelity`: every row of every fidelity table (published, simulated, closed form, ratio, band, status,
# source) as docs/fidelity.md and docs/fidelity.json. Takes a few minutes on one core (the 1T and 530B SC'21 rows
# and the 256-GPU MoE rows dominate). Usage: scripts/fidelity.sh BUILD_DIR [OUT_DIR (default docs)]
set -euo pipefail
build=${1:?usage: scripts/fidelity.sh BUILD_DIR [OUT_DIR]}
out=${2:-docs}
report="$build/tests/sim/fidelity_report"
if [ ! -x "$report" ]; then
  echo "fidelity.sh: $report not built; run: cmake --build $build --target fidelity_report" >&2
  exit 2
fi
mkdir -p "$out"
"$report" --md "$out/fidelity.md.tmp" --json "$out/fidelity.json.tmp"
mv "$out/fidelity.md.tmp" "$out/fidelity.md"
mv "$out/fidelity.json.tmp" "$out/fidelity.json"
echo "fidelity.sh: wrote $out/fidelity.md and $out/fidelity.json"
grep -A100 '^## Open gaps' "$out/fidelity.md"
