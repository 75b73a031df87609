#!/usr/bin/env bash
# tests/gpu/profile.sh - where a batch-1 decode step's time goes on the GPU:
# CLLM_CUDA_TIMING=1 (GPU time of the step, logits copy, host time between
# steps) on the bench shapes, with CUDA graphs and fused launches, without
# fused launches (CLLM_CUDA_FUSE=0) and without graphs, then per-kernel GPU times of one eager decode
# step from ncu (gpu__time_duration), summed by kernel.
# Usage: tests/gpu/profile.sh BIN_DIR [SHAPES]
#   OUT: folder for the ncu csv; NCU_SHAPES: shapes to run ncu on (default
#   qwen3-0.6b); KEEP=1 keeps the generated models in $WORK (run.sh reuses them).
set -uo pipefail
BIN=${1:?BIN_DIR} SHAPES=${2:-qwen3-0.6b}
WORK=${WORK:-/tmp/cllm-gpu} OUT=${OUT:-$WORK}
. "$(dirname "$0")/lib.sh" # gpu_model
mkdir -p "$WORK" "$OUT"
ids512=$(seq -s, 1000 1511)
for shape in $SHAPES; do
    f=$(GEN_TIMEOUT=240 gpu_model "$shape") || continue
    for v in "1 1" "1 0" "0 1"; do
        set -- $v; cd=$1 fuse=$2
        echo "== $shape compiled_decode=$cd fuse=$fuse"
        CLLM_CUDA_TIMING=1 CLLM_CUDA_FUSE=$fuse CLLM_COMPILED_DECODE=$cd timeout 180 "$BIN/cllm" run "$f" --device cuda --warmup \
            --prompt-ids "$ids512" -n 128 --temp 0 --ignore-eos --print-ids --batch 512 2>&1 >/dev/null | grep -E "^prompt:|timing"
    done
    if [[ " ${NCU_SHAPES-qwen3-0.6b} " == *" $shape "* ]] && command -v ncu >/dev/null; then
        echo "== ncu $shape, eager, 5-token prompt + 2 decode steps"
        CLLM_COMPILED_DECODE=0 timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
            --log-file "$OUT/ncu_$shape.csv" "$BIN/cllm" run "$f" --device cuda --prompt-ids 1000,1001,1002,1003,1004 \
            -n 3 --temp 0 --ignore-eos --print-ids >/dev/null 2>&1
        python3 - "$OUT/ncu_$shape.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; rows = rows[1:]
ki, vi, ui = hdr.index("Kernel Name"), hdr.index("Metric Value"), hdr.index("Metric Unit")
ks = [(r[ki], float(r[vi].replace(",", "")) * {"ns": 1e-3, "nsecond": 1e-3, "us": 1, "usecond": 1, "ms": 1e3, "msecond": 1e3}.get(r[ui], 1)) for r in rows]
starts = [i for i, (k, _) in enumerate(ks) if "embed" in k]
last = ks[starts[-1]:]
agg = collections.defaultdict(lambda: [0, 0.0])
for k, t in last:
    a = agg[k.split("(")[0][:70]]; a[0] += 1; a[1] += t
tot = sum(t for _, t in last)
print(f"last decode step: {len(last)} kernels, {tot:.1f} us of kernel time")
for k, (n, t) in sorted(agg.items(), key=lambda x: -x[1][1]):
    print(f"{t:9.1f} us {n:5d}x  {t/n:7.2f} us/each  {k}")
PY
    fi
    [ "${KEEP:-0}" = 1 ] || rm -f "$f"
done
