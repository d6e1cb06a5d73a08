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
