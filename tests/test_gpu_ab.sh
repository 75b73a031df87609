#!/usr/bin/env bash
# test_gpu_ab.sh - tests/gpu/ab.sh (the one-call A/B of CUDA builds) on
# stand-ins for cllm and gen_model, so it runs without a GPU: each variant
# runs with its own module or environment, runs alternate per round, the
# means are per variant and shape, a failed run shows as FAILED, SHOW
# passes further lines through, a dir: variant runs its own cllm and
# module, DTYPE picks the weights' format, and bad variants are refused
# with exit 2.
# Usage: test_gpu_ab.sh [ignored: ctest passes the cllm binary and dirs]
set -u
. "$(dirname "$0")/check_lib.sh"
AB=$(cd "$(dirname "$0")/gpu" && pwd)/ab.sh
mkdir -p "$tmp/bin"
# cllm stand-in: its decode speed is the number in the module beside it
# plus $BUMP; FAIL=1 prints no decode line
cat >"$tmp/bin/cllm" <<'EOS'
#!/usr/bin/env bash
here=$(cd "$(dirname "$0")" && pwd)
v=$(cat "$here/libcllm_cuda.so")
v=$((v + ${BUMP:-0}))
echo "bench args: $*" >&2
[ "${FAIL:-0}" = 1 ] && exit 1
echo "prefill p512 1000.0 tok/s"
echo "decode  tg64            $v.5 tok/s      floor 200.0 tok/s  50.0%"
echo "batch   8     agg     $((v * 5)).0 tok/s  per-stream 1.0"
echo "probe: a report line"
EOS
cat >"$tmp/bin/gen_model" <<'EOS'
#!/usr/bin/env bash
all="$*"
while [ $# -gt 0 ]; do [ "$1" = -o ] && echo "$all" >"$2"; shift; done
EOS
chmod +x "$tmp/bin/cllm" "$tmp/bin/gen_model"
echo 100 >"$tmp/bin/libcllm_cuda.so"
echo 150 >"$tmp/old.so"
gzip -c "$tmp/old.so" >"$tmp/old.so.gz"
# another build's directory: its own cllm (here a marked copy) and module
mkdir -p "$tmp/other"
sed 's/^v=\$((v + \${BUMP:-0}))$/v=$((v + ${BUMP:-0} + 1000))/' "$tmp/bin/cllm" >"$tmp/other/cllm"
chmod +x "$tmp/other/cllm"
echo 200 | gzip -c >"$tmp/other/libcllm_cuda.so.gz"

WORK=$tmp/w SHAPES="s1 s2" ROUNDS=2 ARGS="-n 8 --batch 8" SHOW='^probe' \
    bash "$AB" "$tmp/bin" new=env:BUMP=0 bump=env:BUMP=7,FAIL=0 old="$tmp/old.so.gz" \
    bad=env:FAIL=1 other=dir:"$tmp/other" >"$tmp/out" 2>"$tmp/err"
rc=$?
check '[ $rc -eq 0 ]' "ab.sh failed: $(cat "$tmp/err")"
check '[ "$(grep -c "^s1 " "$tmp/out")" -eq 10 ] && [ "$(grep -c "^s2 " "$tmp/out")" -eq 10 ]' \
    "not 5 variants x 2 rounds per shape: $(cat "$tmp/out")"
check '[ "$(grep "^s1 " "$tmp/out" | head -5 | cut -d" " -f2 | tr "\n" " ")" = "new bump old bad other " ]' \
    "runs do not alternate in the order given: $(grep "^s1 " "$tmp/out")"
check 'grep -q "^s1 new decode 100.5 | batch 8 500.0$" "$tmp/out"' "new's run line wrong"
check 'grep -q "^s2 bump decode 107.5 | batch 8 535.0$" "$tmp/out"' "env variant not applied"
check 'grep -q "^s1 old decode 150.5 | batch 8 750.0$" "$tmp/out"' "the gzipped module was not used"
check 'grep -q "^s1 bad decode FAILED$" "$tmp/out"' "a failed run is not shown as FAILED"
check 'grep -q "^s2 other decode 1200.5 | batch 8 6000.0$" "$tmp/out"' \
    "the dir variant's own cllm and module were not used: $(grep "^s2 other" "$tmp/out")"
check '[ "$(grep -c "^probe: a report line$" "$tmp/out")" -eq 16 ]' "SHOW lines not passed through"
check 'grep -q "^s1: new 100.5 bump 107.5 old 150.5 bad FAILED other 1200.5$" "$tmp/out"' \
    "s1 means wrong: $(grep "^s1:" "$tmp/out")"
check 'grep -q "^s2: new 100.5 bump 107.5 old 150.5 bad FAILED other 1200.5$" "$tmp/out"' "s2 means wrong"
check '[ -f "$tmp/w/s1-bf16.gguf" ] && grep -q -- "--shape s1 --dtype bf16" "$tmp/w/s1-bf16.gguf"' \
    "the model file was not made with gen_model --shape"

# DTYPE: the weights' format, a file of its own
WORK=$tmp/w SHAPES="s1" ROUNDS=1 DTYPE=q4_k bash "$AB" "$tmp/bin" new=env:BUMP=0 >"$tmp/out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "^s1: new 100.5$" "$tmp/out"' "DTYPE run failed: $(cat "$tmp/out")"
check '[ -f "$tmp/w/s1-q4_k.gguf" ] && grep -q -- "--shape s1 --dtype q4_k" "$tmp/w/s1-q4_k.gguf"' \
    "DTYPE=q4_k did not make the model with gen_model --dtype q4_k"

bash "$AB" "$tmp/bin" noequals >"$tmp/out" 2>&1
rc=$?
check '[ $rc -eq 2 ] && grep -q "is not NAME=SPEC" "$tmp/out"' "a variant without = accepted"
bash "$AB" "$tmp/bin" x="$tmp/none.so" >"$tmp/out" 2>&1
rc=$?
check '[ $rc -eq 2 ] && grep -q "no module" "$tmp/out"' "a missing module accepted"
bash "$AB" "$tmp/bin" x=dir:"$tmp/bin/none" >"$tmp/out" 2>&1
rc=$?
check '[ $rc -eq 2 ] && grep -q "has no cllm" "$tmp/out"' "a dir variant without binaries accepted"
bash "$AB" "$tmp/bin" >"$tmp/out" 2>&1
rc=$?
check '[ $rc -eq 2 ] && grep -q usage "$tmp/out"' "no variants accepted"
check_summary test_gpu_ab
