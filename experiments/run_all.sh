#!/usr/bin/env bash
# `make experiments`: every experiment script in turn, then the summary page docs/experiments.md. Each script runs
# `piper` (the binary named by $PIPER, default build/src/cli/piper) and writes its tables and plots under
# docs/experiments/. Stops at the first failing script, naming it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIPER=$(readlink -f "${PIPER:-build/src/cli/piper}")
# Debian's matplotlib is installed for /usr/bin/python3 (scripts/setup.sh); a pyenv or venv python3 earlier on PATH
# may lack it.
PY=python3
if ! python3 -c "import matplotlib" 2>/dev/null && [ -x /usr/bin/python3 ]; then PY=/usr/bin/python3; fi
for s in disaggregation af_model schedules hpc_scaling migration halo_measured; do
  echo "experiments: $s" >&2
  $PY "experiments/$s.py" || { echo "experiments: $s.py failed" >&2; exit 1; }
done
$PY experiments/report.py
echo "experiments: docs/experiments.md and docs/experiments/ written" >&2
