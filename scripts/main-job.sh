#!/usr/bin/env bash
# Piper's main job on this machine (the README's first command runs this after building).
set -euo pipefail
BIN=${1:-build/src/cli/piper}
echo "== piper info --model deepseek-v3"
"$BIN" info --model deepseek-v3
echo
echo "== piper info --model tiny-moe"
"$BIN" info --model tiny-moe
echo
echo "== piper info --cluster h800 --nodes 16"
"$BIN" info --cluster h800 --nodes 16
echo
echo "== piper estimate: DeepSeek-V3 on 2048 H800s (pp=16, ep=64, dp=128, DualPipeV; docs/resource_model.md)"
"$BIN" estimate --model deepseek-v3 --cluster h800 --nodes 256 \
  --strategy dp=128,pp=16,ep=64,zero=1,schedule=dualpipev,microbatches=120,recompute=full,a2a=halo
echo
echo "== piper plan: tiny-moe on this machine's 2 cores (docs/planner.md)"
"$BIN" plan --model tiny-moe --cluster local-cpu --nodes 1 --global-batch 8 --seq 128 --top 3
echo
echo "== piper plan --local-ranks 4 --runnable: tiny-moe on 4 ranks of this machine, only what the runtime executes (docs/runtime.md)"
"$BIN" plan --model tiny-moe --local-ranks 4 --global-batch 16 --seq 128 --runnable --top 3
echo
echo "== piper train --ranks 4 --strategy auto: the plan above (#1), 20 steps on 4 MPI ranks; losses, tokens/s, predicted vs measured"
"$BIN" train --model tiny-moe --ranks 4 --strategy auto --global-batch 16 --seq 128 --steps 20 \
  --trace "${PIPER_TRACE:-/tmp/piper-main-job-trace.json}"
