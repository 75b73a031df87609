#!/usr/bin/env bash
# run_decode.sh - prompt and decode speed of `cllm run` on a random-weight
# Qwen3-0.6B-shaped model (speed does not depend on the values), in bf16 and
# Q8_0, with a 128-token prompt and 64 generated tokens.
# Usage: bench/run_decode.sh [build dir] [threads] [work dir]
set -euo pipefail
BUILD=${1:-build} THREADS=${2:-2} WORK=${3:-/tmp/cllm-bench}
mkdir -p "$WORK"
ids=$(seq -s, 1000 1127)
for dt in q8_0 bf16; do
    f="$WORK/qwen3-0.6b-$dt.gguf"
    [ -f "$f" ] || "$BUILD/gen_model" --shape qwen3-0.6b --dtype "$dt" -o "$f"
    for rep in 1 2 3; do
        echo "== $dt run $rep"
        "$BUILD/cllm" run "$f" --prompt-ids "$ids" -n 64 --ignore-eos --temp 0 --print-ids \
            -t "$THREADS" --batch 128 2>&1 >/dev/null | grep -E "prompt:"
    done
done
