#!/usr/bin/env bash
# test_bench.sh - `cllm bench` end to end on the CPU with the llama2.c sample
# model: the prefill, decode and --batch rows carry positive speeds and
# floors, the FLOPs a prefill token costs match the model worked by hand
# (and --peak-tflops's prefill floor), sampled decoding (--temp) is
# reported as such, the CPU backend's
# bandwidth measurement runs when --bandwidth is absent, and bad input gives
# one line naming the flag and exit 2. Speeds are
# not compared with anything (the host is shared). Usage: test_bench.sh
# <cllm binary> [shared dir, default $CLLM_SHARED_DIR or ../shared] [fixtures dir]
set -u
CLLM=$1
SHARED=${2:-${CLLM_SHARED_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/shared}}
MODEL=$SHARED/models/stories260K
. "$(dirname "$0")/check_lib.sh"
num='[0-9]+\.[0-9]+'
# positive: a number with a non-zero digit
pos() { [[ "$1" =~ [1-9] ]]; }
# A batch row's aggregate is positive: its window (N - 1 steps of all S
# streams decoding, after the warm-up steps) exists whatever the timing,
# since every stream may generate past N until the window closes.
agg_ok() { pos "$1"; }
field() { # args: line pattern, sed expression -> the number it captures
    grep -E "$1" "$tmp/out" | head -1 | sed -E "$2"
}
# bench_ok WHAT ARGS...: cllm bench on the model with ARGS into $tmp/out
# (stderr $tmp/err), which must succeed.
bench_ok() {
    local what=$1 rc
    shift
    "$CLLM" bench "$MODEL" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    check '[ $rc -eq 0 ]' "bench $what failed: $(cat "$tmp/err")"
}

# 1. Prefill, decode and two batch rows with the floor from --bandwidth.
bench_ok "--batch 1,4" -p 32 -n 16 --batch 1,4 -t 2 --bandwidth 20
check 'grep -q "^bandwidth: *20.0 GB/s (--bandwidth)" "$tmp/out"' "no --bandwidth line: $(cat "$tmp/out")"
check 'grep -q "prefill_chunk 32, batch_tokens max(2048, C+S)" "$tmp/out"' "engine settings not in the header"
check '! grep -q "^prefill:" "$tmp/out"' "a chunk line without --prefill-chunk"
v=$(field "^prefill p32 " "s/^prefill p32 +($num) tok\/s.*/\1/")
check 'pos "$v"' "prefill row: '$(grep prefill "$tmp/out")'"
v=$(field "^decode  tg16 " "s/^decode  tg16 +($num) tok\/s.*/\1/")
check 'pos "$v"' "decode row: '$(grep ^decode "$tmp/out")'"
v=$(field "^decode  tg16 " "s/.*floor +($num) tok\/s +$num%$/\1/")
check 'pos "$v"' "decode floor: '$(grep ^decode "$tmp/out")'"
for s in 1 4; do
    row=$(grep -E "^batch +$s " "$tmp/out")
    agg=$(sed -E "s/.* agg +($num) tok\/s .*/\1/" <<<"$row")
    flo=$(sed -E "s/.*floor +($num) tok\/s +$num%$/\1/" <<<"$row")
    ttft=$(sed -E "s/.*ttft p50\/p99 +($num) \/ *$num ms.*/\1/" <<<"$row")
    check 'agg_ok "$agg" $s && [[ "$agg" =~ ^$num$ ]]' "batch $s aggregate: '$row'"
    check 'pos "$flo" && [[ "$flo" =~ ^$num$ ]]' "batch $s floor: '$row'"
    check '[[ "$ttft" =~ ^$num$ ]]' "batch $s ttft: '$row'"
done
# The floor for 4 streams is higher than for 1: the weights are read once per step.
f1=$(grep -E "^batch +1 " "$tmp/out" | sed -E "s/.*floor +($num) tok\/s.*/\1/")
f4=$(grep -E "^batch +4 " "$tmp/out" | sed -E "s/.*floor +($num) tok\/s.*/\1/")
check 'awk -v a="$f1" -v b="$f4" "BEGIN { exit !(b > a) }"' "floor 4 ($f4) not above floor 1 ($f1)"

# 1b. The window exists where the first streams would end before the last
#     prompt went in: 16 prompts of 200 tokens, ten in the first step
#     (2,048 batch tokens), the rest one a step beside the decodes, 4
#     tokens a stream. Every stream runs on until the one whose prompt went
#     last has its window; the rest are then cancelled, not reported as
#     errors.
bench_ok "--batch 16 -p 200" -p 200 -n 4 --batch 16 -t 2 --bandwidth 20
check 'grep -q "agg = tokens a second over 3 steps" "$tmp/out"' "window not in the header: $(grep -A3 '^batch:' "$tmp/out")"
row=$(grep -E "^batch +16 " "$tmp/out")
agg=$(sed -E "s/.* agg +($num) tok\/s .*/\1/" <<<"$row")
check 'pos "$agg" && [[ "$agg" =~ ^$num$ ]]' "batch 16 of 200-token prompts: '$row'"
check '! grep -q "no window" "$tmp/out"' "no window: $(cat "$tmp/out")"

# 2. Without --bandwidth the CPU backend measures it.
bench_ok "(measured bandwidth)" -p 16 -n 8 -t 2
v=$(field "^bandwidth:" "s/^bandwidth: +($num) GB\/s \(measured\)$/\1/")
check 'pos "$v" && [[ "$v" =~ ^$num$ ]]' "measured bandwidth: '$(grep ^bandwidth "$tmp/out")'"
check '! grep -q "^batch" "$tmp/out"' "batch rows without --batch"
check 'grep -qE "^decode  tg8 .*floor +$num tok/s" "$tmp/out"' "decode floor with measured bandwidth"

# 2b. Prefill compute: stories260K (dim 64, 5 layers, 8 heads of 8, 4 KV
#     heads, hidden 172, vocab 512) at 32 tokens: per layer q, k, v, o
#     64x64 + 2x32x64 + 64x64 and gate, up, down 3x172x64 = 45,312 weights,
#     x 5 layers x 2 = 453,120 FLOPs; the LM head 2x512x64 / 32 = 2,048;
#     attention 4 x 5 layers x 8 heads x 8 dims x (32 x 33 / 2 keys) / 32 =
#     21,120: 476,288 a token, 95.6 % matrices. --peak-tflops 0.001 (1e9
#     FLOP/s) makes the prefill floor 1e9 / 476,288 = 2099.6 tok/s.
bench_ok "--peak-tflops" -p 32 -n 4 -t 2 --bandwidth 20 --peak-tflops 0.001
check 'grep -q "^compute:    0.476 MFLOP a prefill token (matrices 95.6%, attention 4.4%); prefill floor = 0.001 TFLOP/s (--peak-tflops) / that$" "$tmp/out"' \
    "compute line: '$(grep ^compute "$tmp/out")'"
v=$(field "^prefill p32 " "s/^prefill p32 +$num tok\/s +($num) TFLOP\/s.*/\1/")
check '[[ "$v" =~ ^$num$ ]]' "prefill TFLOP/s: '$(grep ^prefill "$tmp/out")'"
v=$(field "^prefill p32 " "s/.*floor +($num) tok\/s +$num%$/\1/")
check '[ "$v" = 2099.6 ]' "prefill floor: '$(grep ^prefill "$tmp/out")'"

# 2c. --prefill-chunk: the prompt in passes of C tokens, said in the header
#     (the engine's too); a chunk past the prompt is the prompt.
bench_ok "--prefill-chunk" -p 40 -n 4 -t 2 --bandwidth 20 --prefill-chunk 16 --batch 2
check 'grep -q "^prefill:    in passes of 16 tokens (--prefill-chunk)$" "$tmp/out"' "chunk line: $(cat "$tmp/out")"
check 'grep -q "prefill_chunk 16, batch_tokens" "$tmp/out"' "engine chunk: $(grep ^batch: "$tmp/out")"
v=$(field "^prefill p40 " "s/^prefill p40 +($num) tok\/s.*/\1/")
check 'pos "$v"' "chunked prefill row: '$(grep ^prefill "$tmp/out")'"
bench_ok "--prefill-chunk 64" -p 16 -n 4 -t 2 --bandwidth 20 --prefill-chunk 64
check '! grep -q "^prefill:" "$tmp/out"' "a chunk past the prompt: $(cat "$tmp/out")"

# 3. Sampled decoding (--temp): the header says so, the rows carry speeds;
#    without it the header says greedy (the run above's output).
check 'grep -q "^decoding:   greedy$" "$tmp/out"' "no 'decoding: greedy' line"
# the CPU's greedy steps and top-k draws may read the head's int8 copy:
# the header says the floor still counts the whole head
check 'grep -q "^head:       one stream.s steps (a greedy pick or a top-k draw) read the LM head.s int8" "$tmp/out"' "no 'head:' line for greedy: $(cat "$tmp/out")"
bench_ok "--temp" -p 16 -n 16 -t 2 --bandwidth 20 --temp 0.8 --top-p 0.9 --top-k 40 --seed 7 \
    --batch 2
check 'grep -q "^decoding:   sampled: temperature 0.8, top-k 40, top-p 0.9, min-p 0, seed 7$" "$tmp/out"' \
    "sampled header: '$(grep ^decoding "$tmp/out")'"
check 'grep -q "^head:" "$tmp/out"' "no 'head:' line for a top-k 40 draw"
v=$(field "^decode  tg16 " "s/^decode  tg16 +($num) tok\/s.*/\1/")
check 'pos "$v"' "sampled decode row: '$(grep ^decode "$tmp/out")'"
v=$(grep -E "^batch +2 " "$tmp/out" | sed -E "s/.* agg +($num) tok\/s .*/\1/")
check 'agg_ok "$v" 2' "sampled batch row: '$(grep ^batch "$tmp/out")'"

# 4. Bad input: one line naming the problem, exit 2.
expect_err() { # args: pattern, command...
    local pat=$1; shift
    "$@" >"$tmp/o" 2>"$tmp/e"; local rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <"$tmp/e")" -eq 1 ] && grep -q -- "$pat" "$tmp/e" &&
        grep -q "^cllm bench: " "$tmp/e"; then ok; else
        bad "expected exit 2 and /$pat/ from: $* -> rc $rc: $(cat "$tmp/e")"; fi
}
expect_err "--batch" "$CLLM" bench "$MODEL" --batch 0
expect_err "--batch" "$CLLM" bench "$MODEL" --batch x
expect_err "--batch" "$CLLM" bench "$MODEL" --batch 1,,4
expect_err "--batch" "$CLLM" bench "$MODEL" --batch 1,
expect_err "--batch" "$CLLM" bench "$MODEL" --batch " 4"
expect_err "-p" "$CLLM" bench "$MODEL" -p 0
expect_err "-n" "$CLLM" bench "$MODEL" -n abc
expect_err "--prefill-chunk" "$CLLM" bench "$MODEL" --prefill-chunk 0
expect_err "--compiled-decode needs on or off" "$CLLM" bench "$MODEL" --compiled-decode
expect_err "--bandwidth" "$CLLM" bench "$MODEL" --bandwidth -3
expect_err "--peak-tflops" "$CLLM" bench "$MODEL" --peak-tflops 0
expect_err "--peak-tflops" "$CLLM" bench "$MODEL" --peak-tflops x
expect_err "/nonexistent/model" "$CLLM" bench /nonexistent/model
expect_err "exceeds the model's context" "$CLLM" bench "$MODEL" -p 500 -n 100
expect_err "unknown option --bogus" "$CLLM" bench "$MODEL" --bogus
expect_err "no model" "$CLLM" bench
expect_err "temperature must be >= 0" "$CLLM" bench "$MODEL" --temp -1
expect_err "top_p must be in" "$CLLM" bench "$MODEL" --top-p 2
expect_err "--temp needs a number" "$CLLM" bench "$MODEL" --temp abc
expect_err "--top-p needs a number" "$CLLM" bench "$MODEL" --top-p 1e50
"$CLLM" bench --help >"$tmp/o" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "usage: cllm bench" "$tmp/o"' "bench --help"

check_summary test_bench
