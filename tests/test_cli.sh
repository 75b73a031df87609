#!/usr/bin/env bash
# test_cli.sh - end-to-end checks of `cllm run` as a user calls it: text and
# ids out of the real sample models, logits files, and clear errors for bad
# input. Usage: test_cli.sh <cllm binary> <shared dir> <fixtures dir>
set -u
CLLM=$1 SHARED=$2 FIX=$3
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1. Text generation from the llama2.c sample reproduces llama2.c's sample text.
out=$("$CLLM" run "$SHARED/models/stories260K" -p "Zoo" -n 57 --temp 0 2>"$tmp/err")
check '[ $? -eq 0 ]' "run stories260K failed: $(cat "$tmp/err")"
want="Zoo was a little girl named Lily. She loved to play outside in the park."
check '[[ "$out" == "$want"* ]]' "stories260K text: got '$out'"
check 'grep -q "decode:.*tok/s" "$tmp/err"' "no tokens/s report on stderr"

# 2. Ids in, ids out (tinystories-656k, HF format with a tied head).
ids=$("$CLLM" run "$SHARED/models/tinystories-656k" --prompt-ids 1,80,147,201,282,57 -n 8 --temp 0 --print-ids 2>/dev/null)
check '[ "$ids" = "313,598,303,1049,1468,267,628,333" ]' "tinystories ids: got '$ids'"

# 3. Text prompt through tokenizer.json gives the same ids.
ids2=$("$CLLM" run "$SHARED/models/tinystories-656k" -p "Once upon a time" -n 8 --temp 0 --print-ids 2>/dev/null)
check '[ "$ids2" = "$ids" ]' "tinystories -p ids: got '$ids2'"

# 4. --logits-out writes [n_prompt, vocab] float32 rows equal to transformers'.
"$CLLM" run "$SHARED/models/tinystories-656k" --prompt-ids 1,80,147,201,282,57 -n 0 \
    --logits-out "$tmp/l.f32" >/dev/null 2>&1
check '[ "$(stat -c %s "$tmp/l.f32" 2>/dev/null)" = "$((6 * 2048 * 4))" ]' "logits file size"

# 5. Sampling with a seed is reproducible, and different seeds differ.
a=$("$CLLM" run "$SHARED/models/stories260K" -p "Zoo" -n 40 --seed 7 --temp 1 --print-ids 2>/dev/null)
b=$("$CLLM" run "$SHARED/models/stories260K" -p "Zoo" -n 40 --seed 7 --temp 1 --print-ids 2>/dev/null)
c=$("$CLLM" run "$SHARED/models/stories260K" -p "Zoo" -n 40 --seed 8 --temp 1 --print-ids 2>/dev/null)
check '[ -n "$a" ] && [ "$a" = "$b" ]' "same seed differs: '$a' vs '$b'"
check '[ "$a" != "$c" ]' "different seeds gave identical output"

# 6. Bad input: one clear line, non-zero exit, no crash.
expect_err() { # args: pattern, command...
    local pat=$1; shift
    "$@" >"$tmp/o" 2>"$tmp/e"; local rc=$?
    if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q -- "$pat" "$tmp/e"; then ok; else
        bad "expected error /$pat/ (rc $rc) from: $* -> $(cat "$tmp/e")"; fi
}
expect_err "no such file" "$CLLM" run /nonexistent/model -p hi
expect_err "unknown option" "$CLLM" run "$SHARED/models/stories260K" --bogus
expect_err "outside the vocabulary" "$CLLM" run "$SHARED/models/stories260K" --prompt-ids 1,99999 -n 1
expect_err "needs an integer" "$CLLM" run "$SHARED/models/stories260K" -n abc
expect_err "top_p" "$CLLM" run "$SHARED/models/stories260K" -p hi --top-p 2
expect_err "not a model" "$CLLM" run "$SHARED/models/SOURCES.md"
expect_err "unknown command" "$CLLM" frobnicate
head -c 1000 "$SHARED/models/stories260K/stories260K.bin" >"$tmp/cut.bin"
expect_err "cut.bin" "$CLLM" run "$tmp/cut.bin" --prompt-ids 1
printf 'GGUF\3\0\0\0' >"$tmp/bad.gguf"
expect_err "bad.gguf" "$CLLM" run "$tmp/bad.gguf" --prompt-ids 1

echo "test_cli: $pass passed, $fail failed"
[ $fail -eq 0 ]
