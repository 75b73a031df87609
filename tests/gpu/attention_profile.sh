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
#   report and the csv (default $WORK); TOP: instructions listed (30).
set -uo pipefail
BIN=${1:?BIN_DIR} SHAPE=${2:-qwen3-0.6b}
WORK=${WORK:-/tmp/cllm-gpu} OUT=${OUT:-$WORK}
. "$(dirname "$0")/lib.sh" # gpu_model
mkdir -p "$WORK" "$OUT"
f=$(gpu_model "$SHAPE") || exit 1
command -v ncu >/dev/null || { echo "no ncu"; exit 1; }
rep="$OUT/attention_$SHAPE"
# a decode launch well into the run (prefill uses other kernels)
ncu --clock-control none --kernel-name regex:k_attention_dec --launch-skip 200 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --section Occupancy \
    -f -o "$rep" "$BIN/cllm" bench "$f" --device cuda -p 512 -n 16 >/dev/null 2>&1
[ -f "$rep.ncu-rep" ] || { echo "ncu wrote no report"; exit 1; }
ncu -i "$rep.ncu-rep" --page details --section SpeedOfLight --section WarpStateStats \
    --section Occupancy 2>&1 | grep -v "^==PROF==" | sed -n '1,80p'
ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>/dev/null
python3 - "$rep.sass.csv" "${TOP:-30}" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr_i = next((i for i, r in enumerate(rows) if any("Warp Stall Sampling" in c for c in r)), None)
if hdr_i is None:
    sys.exit("no warp stall sampling column in " + sys.argv[1])
hdr, body = rows[hdr_i], rows[hdr_i + 1:]
col = next(i for i, c in enumerate(hdr) if c.startswith("Warp Stall Sampling (All"))
src = next((i for i, c in enumerate(hdr) if c == "Source"), 1)
addr = next((i for i, c in enumerate(hdr) if c == "Address"), 0)
def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0
tot = sum(num(r[col]) for r in body if len(r) > col) or 1.0
print(f"\n{len(body)} SASS instructions, {tot:.0f} warp stall samples; the top {sys.argv[2]}:")
for r in sorted((r for r in body if len(r) > col), key=lambda r: -num(r[col]))[: int(sys.argv[2])]:
    print(f"{num(r[col]):7.0f} {100 * num(r[col]) / tot:5.1f}%  {r[addr]:>8}  {r[src][:90]}")
PY
