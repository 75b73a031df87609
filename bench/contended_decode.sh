#!/usr/bin/env bash
# contended_decode.sh - decode speed of `cllm run` on a machine that is busy
# with something else: HOGS CPU-bound processes (`yes`) run beside it while
# it decodes the random-weight Q8_0 Qwen3-0.6B-shaped model with all CPUs'
# threads (pinned, the default, and CLLM_PIN_THREADS=0) and with one thread.
# Usage: bench/contended_decode.sh [build dir] [hogs, e.g. "0 1 2"] [reps] [work dir]
set -euo pipefail
BUILD=${1:-build} HOGS=${2:-"0 1 2"} REPS=${3:-3} WORK=${4:-/tmp/cllm-bench}
mkdir -p "$WORK"
f="$WORK/qwen3-0.6b-q8_0.gguf"
[ -f "$f" ] || "$BUILD/gen_model" --shape qwen3-0.6b --dtype q8_0 -o "$f"
ids=$(seq -s, 1000 1063)
nt=$(nproc)
tps() {
    "$BUILD/cllm" run "$f" --prompt-ids "$ids" -n 64 --ignore-eos --temp 0 --print-ids "$@" \
        2>&1 >/dev/null | grep -oE "[0-9.]+ tok/s$" | cut -d' ' -f1
}
pids=
trap '[ -z "$pids" ] || kill $pids 2>/dev/null' EXIT
echo "decode tok/s, 64 tokens after a 64-token prompt, $nt CPUs"
printf '%5s %12s %12s %10s\n' hogs "-t $nt pinned" "-t $nt unpin" "-t 1"
for h in $HOGS; do
    pids=
    for _ in $(seq 1 "$h"); do yes >/dev/null & pids="$pids $!"; done
    for _ in $(seq 1 "$REPS"); do
        printf '%5s %12s %12s %10s\n' "$h" "$(tps -t "$nt")" "$(CLLM_PIN_THREADS=0 tps -t "$nt")" "$(tps -t 1)"
    done
    [ -z "$pids" ] || kill $pids 2>/dev/null
    wait 2>/dev/null || true
    pids=
done
