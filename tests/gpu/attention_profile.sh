#!/usr/bin/env bash
# tests/gpu/attention_profile.sh - why the single-sequence decode attention
# kernel (k_attention_dec) takes 13-19 us a layer for 2 MB of K/V: ncu's
# warp-state sampling of one of its launches in a decode step, the stall
# reasons over the kernel and the SASS instructions where warps wait most.
# (ncu runs the kernel alone, with its caches flushed: the stalls are the
# kernel's own; bench/trace_steps.py gives its cost in the pipeline, the
# probe build, src/backend/cuda/dec_probe.cuh, its stages.)
# Usage: tests/gpu/attention_profile.sh BIN_DIR [SHAPE]
#   SHAPE: a gen_model shape (default qwen3-0.6b); OUT: folder for the
#   report and the csv (default $WORK); TOP: instructions listed (30);
#   P: the prompt's tokens, so the context decoded over (default 512).
set -uo pipefail
BIN=${1:?BIN_DIR} SHAPE=${2:-qwen3-0.6b}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-/tmp/cllm-gpu} OUT=${OUT:-$WORK}
. "$(dirname "$0")/lib.sh" # gpu_model
mkdir -p "$WORK" "$OUT"
f=$(gpu_model "$SHAPE") || exit 1
command -v ncu >/dev/null || { echo "no ncu"; exit 1; }
rep="$OUT/attention_$SHAPE"
# a decode launch well into the run (prefill uses other kernels)
ncu --clock-control none --kernel-name regex:k_attention_dec --launch-skip 200 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --section Occupancy \
    -f -o "$rep" "$BIN/cllm" bench "$f" --device cuda -p "${P:-512}" -n 16 >/dev/null 2>&1
[ -f "$rep.ncu-rep" ] || { echo "ncu wrote no report"; exit 1; }
ncu -i "$rep.ncu-rep" --page details --section SpeedOfLight --section WarpStateStats \
    --section Occupancy 2>&1 | grep -v "^==PROF==" | sed -n '1,80p'
ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>/dev/null
# the instructions where warps wait most (and the kernel's code counts)
python3 "$ROOT/bench/sass_lines.py" "$rep.sass.csv" --stalls "${TOP:-30}"
