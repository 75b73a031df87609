#!/usr/bin/env bash
# tests/gpu/perf.sh - the H200 performance pass in one go, for one call on
# the GPU machine:
#   1. bench_gemv (GEMV kernels alone: GB/s per shape, n = 1..8), and when
#      packed bench_gemm_tc (the opt-in tensor-core GEMM against cuBLAS,
#      n = 2..64), bench_persist (the decode GEMV chain, one launch per
#      matrix against one persistent launch) and bench_handoff (what one
#      tagged hand-off between blocks costs alone),
#   2. `cllm bench` on random-weight Qwen3-0.6B and Llama-3.1-8B shapes
#      (prefill pp512, decode tg128, batched decode at 1/8/32/64 streams),
#   3. ncu per-kernel GPU time of one 8B prefill (512 tokens) when NCU=1,
#      and of one decode step of each shape when NCU_DECODE=1.
# Usage: tests/gpu/perf.sh BIN_DIR [SHAPES]
#   BIN_DIR: cllm, gen_model, libcllm_cuda.so (and the benches when built);
#   SHAPES: gen_model shapes (default "qwen3-0.6b llama3-8b");
#   BATCH: the --batch list (default 1,8,32,64); OUT: where ncu csv goes;
#   KEEP=1 keeps the generated models in $WORK.
set -uo pipefail
BIN=${1:?BIN_DIR} SHAPES=${2:-qwen3-0.6b llama3-8b}
WORK=${WORK:-/tmp/cllm-gpu} OUT=${OUT:-$WORK}
. "$(dirname "$0")/lib.sh" # gpu_model
mkdir -p "$WORK" "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true

if [ -x "$BIN/bench_gemv" ] && [ "${GEMV:-1}" = 1 ]; then
    echo "== bench_gemv"
    timeout 120 "$BIN/bench_gemv" || echo "bench_gemv: FAILED (rc $?)"
fi
for b in bench_gemm_tc bench_persist bench_handoff; do
    if [ -x "$BIN/$b" ] && [ "${GEMV:-1}" = 1 ]; then
        echo "== $b"
        timeout 180 "$BIN/$b" || echo "$b: FAILED (rc $?)"
    fi
done

for shape in $SHAPES; do
    f=$(gpu_model "$shape") || { echo "gen_model $shape failed"; continue; }
    echo "== cllm bench $shape"
    timeout 400 "$BIN/cllm" bench "$f" --device cuda -p 512 -n 128 --batch "${BATCH:-1,8,32,64}" 2>&1 | grep -v "loading weights"
    if [ "${NCU:-0}" = 1 ] && [ "$shape" = llama3-8b ] && command -v ncu >/dev/null; then
        echo "== ncu $shape: one 512-token prefill, eager"
        CLLM_COMPILED_DECODE=0 timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
            --log-file "$OUT/ncu_prefill_$shape.csv" "$BIN/cllm" run "$f" --device cuda \
            --prompt-ids "$(seq -s, 1000 1511)" -n 1 --temp 0 --batch 512 >/dev/null 2>&1
        python3 - "$OUT/ncu_prefill_$shape.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; rows = rows[1:]
ki, vi, ui = hdr.index("Kernel Name"), hdr.index("Metric Value"), hdr.index("Metric Unit")
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1, "usecond": 1, "ms": 1e3, "msecond": 1e3}
agg = collections.defaultdict(lambda: [0, 0.0])
for r in rows:
    a = agg[r[ki].split("(")[0][:80]]; a[0] += 1; a[1] += float(r[vi].replace(",", "")) * scale.get(r[ui], 1)
tot = sum(t for _, t in agg.values())
print(f"all kernels: {sum(n for n, _ in agg.values())}, {tot/1e3:.2f} ms of kernel time")
for k, (n, t) in sorted(agg.items(), key=lambda x: -x[1][1])[:25]:
    print(f"{t/1e3:9.3f} ms {n:5d}x  {t/n:8.1f} us/each  {k}")
PY
    fi
    if [ "${NCU_DECODE:-0}" = 1 ] && command -v ncu >/dev/null; then
        echo "== ncu $shape: one eager decode step after a 5-token prompt"
        CLLM_COMPILED_DECODE=0 timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
            --log-file "$OUT/ncu_decode_$shape.csv" "$BIN/cllm" run "$f" --device cuda \
            --prompt-ids 1000,1001,1002,1003,1004 -n 3 --temp 0 --ignore-eos >/dev/null 2>&1
        python3 - "$OUT/ncu_decode_$shape.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; rows = rows[1:]
ki, vi, ui = hdr.index("Kernel Name"), hdr.index("Metric Value"), hdr.index("Metric Unit")
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1, "usecond": 1, "ms": 1e3, "msecond": 1e3}
ks = [(r[ki], float(r[vi].replace(",", "")) * scale.get(r[ui], 1)) for r in rows]
last = ks[[i for i, (k, _) in enumerate(ks) if "embed" in k][-1]:]
agg = collections.defaultdict(lambda: [0, 0.0])
for k, t in last:
    a = agg[k.split("(")[0][:80]]; a[0] += 1; a[1] += t
print(f"last decode step: {len(last)} kernels, {sum(t for _, t in last):.1f} us of kernel time")
for k, (n, t) in sorted(agg.items(), key=lambda x: -x[1][1])[:20]:
    print(f"{t:9.1f} us {n:5d}x  {t/n:7.2f} us/each  {k}")
PY
    fi
    [ "${KEEP:-0}" = 1 ] || rm -f "$f"
done
