#!/usr/bin/env bash
# test_tokenizer_override.sh - `--tokenizer PATH` (cllm serve, cllm run) and
# CLLM_TOKENIZER on the CPU: a tiny random-weight GGUF from gen_model (no
# tokenizer of its own, the llama3 vocabulary size) served with the shared
# llama3_1 tokenizer and chat template on loopback; chat usage.prompt_tokens
# against `cllm template | cllm tokenize`, /v1/completions with token ids;
# the refusals (a missing path, a directory without tokenizer.json, a
# vocabulary larger than the model's); then bench/serve_load.py against the
# server (skipped, visibly, without python3). Usage: test_tokenizer_override.sh
# <cllm binary> [shared dir, default $CLLM_SHARED_DIR or ../shared] [fixtures dir]
set -u
CLLM=$1
SHARED=${2:-${CLLM_SHARED_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/shared}}
HERE=$(cd "$(dirname "$0")" && pwd)
GEN=$(dirname "$CLLM")/gen_model
TOK=$SHARED/tokenizers/llama3_1
STORIES=$SHARED/models/stories260K
for t in curl jq; do
    command -v $t >/dev/null || { echo "test_tokenizer_override: FAIL: $t is required"; exit 1; }
done
SERVE_FLAGS=(-t 2)
. "$(dirname "$0")/serve_lib.sh"
# call URL JSON: sets $code and $body
call() {
    code=$(curl -s -m 120 -o "$tmp/body" -w '%{http_code}' "$1" \
        -H 'content-type: application/json' --data-binary "$2")
    body=$(cat "$tmp/body")
}

[ -x "$GEN" ] || { echo "test_tokenizer_override: FAIL: $GEN not built"; exit 1; }
[ -f "$TOK/tokenizer.json" ] || { echo "test_tokenizer_override: FAIL: $TOK/tokenizer.json missing"; exit 1; }
M=$tmp/tiny-llama3.gguf
"$GEN" --shape tiny-llama3 --dtype bf16 -o "$M" >"$tmp/gen.log" 2>&1 ||
    { echo "test_tokenizer_override: FAIL: gen_model: $(cat "$tmp/gen.log")"; exit 1; }

# ---- help text ----
check '"$CLLM" serve --help | grep -q -- "--tokenizer PATH" && "$CLLM" serve --help | grep -q CLLM_TOKENIZER' "serve --help lacks --tokenizer / CLLM_TOKENIZER"
check '"$CLLM" run --help | grep -q -- "--tokenizer PATH"' "run --help lacks --tokenizer"

# ---- cllm run ----
"$CLLM" run "$M" -p "Hello" -n 4 --temp 0 -t 2 >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -ne 0 ] && grep -q "no tokenizer" "$tmp/e"' "run without --tokenizer on a tokenizer-less GGUF: rc $rc $(cat "$tmp/e")"
"$CLLM" run "$M" --tokenizer "$TOK" -p "Hello" -n 4 --temp 0 -t 2 >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 0 ] && grep -q "^Hello." "$tmp/o" && grep -q "decode: 4 tokens" "$tmp/e"' "run --tokenizer DIR: rc $rc out '$(cat "$tmp/o")' $(cat "$tmp/e")"
run_dir_out=$(cat "$tmp/o")
"$CLLM" run "$M" --tokenizer "$TOK/tokenizer.json" -p "Hello" -n 4 --temp 0 -t 2 >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 0 ] && [ "$(cat "$tmp/o")" = "$run_dir_out" ]' "run --tokenizer FILE differs from DIR: rc $rc '$(cat "$tmp/o")' vs '$run_dir_out' $(cat "$tmp/e")"
# the prompt ids are the tokenizer's: "Hello" is <|begin_of_text|> Hello = 128000,9906
"$CLLM" run "$M" --tokenizer "$TOK" -p "Hello" -n 1 --temp 0 -t 2 --logits-out "$tmp/l.f32" >/dev/null 2>"$tmp/e"
check '[ "$(stat -c %s "$tmp/l.f32")" = $((2 * 128256 * 4)) ]' "run --tokenizer: prompt is not 2 tokens: $(cat "$tmp/e")"
"$CLLM" run "$M" --tokenizer "$tmp/nope" -p Hi >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 2 ] && grep -q "$tmp/nope" "$tmp/e"' "run --tokenizer missing: rc $rc $(cat "$tmp/e")"
"$CLLM" run "$M" --tokenizer "$SHARED/models" -p Hi >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 2 ] && grep -q "no tokenizer.json" "$tmp/e"' "run --tokenizer dir without tokenizer.json: rc $rc $(cat "$tmp/e")"
"$CLLM" run "$STORIES" --tokenizer "$TOK" -p Hi -n 1 >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -ne 0 ] && grep -q "128256" "$tmp/e" && grep -q "512" "$tmp/e"' "run: tokenizer larger than the model: rc $rc $(cat "$tmp/e")"

# ---- cllm serve: refusals ----
P=$(free_port)
"$CLLM" serve "$M" --port "$P" --tokenizer "$tmp/nope" >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 2 ] && grep -q -- "--tokenizer $tmp/nope" "$tmp/e"' "serve --tokenizer missing: rc $rc $(cat "$tmp/e")"
CLLM_TOKENIZER=$tmp/nope "$CLLM" serve "$M" --port "$P" >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 2 ] && grep -q "$tmp/nope" "$tmp/e"' "CLLM_TOKENIZER missing: rc $rc $(cat "$tmp/e")"
"$CLLM" serve "$M" --port "$P" --tokenizer "$SHARED/models" >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 2 ] && grep -q "no tokenizer.json" "$tmp/e"' "serve --tokenizer dir without tokenizer.json: rc $rc $(cat "$tmp/e")"
"$CLLM" serve "$STORIES" --port "$P" --tokenizer "$TOK" >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -ne 0 ] && grep -q "128256 tokens, more than the model.s vocab_size 512" "$tmp/e"' "serve: tokenizer larger than the model: rc $rc $(cat "$tmp/e")"
"$CLLM" serve "$M" --port "$P" >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -ne 0 ] && grep -q "tokenizer" "$tmp/e"' "serve of a tokenizer-less GGUF without --tokenizer: rc $rc $(cat "$tmp/e")"

# ---- cllm serve --tokenizer DIR ----
B="http://127.0.0.1:$P"
if start S1 "$P" "$M" -- --tokenizer "$TOK"; then
    check '! grep -q "plain \"role: content\" transcript" "$tmp/log.$P"' "the override's chat template was not loaded: $(cat "$tmp/log.$P")"
    printf '[{"role":"user","content":"Hello there"}]' >"$tmp/m.json"
    want=$("$CLLM" template "$TOK" --messages "$tmp/m.json" | "$CLLM" tokenize "$TOK" --no-special --json - | jq '.ids | length')
    call "$B/v1/chat/completions" '{"messages":[{"role":"user","content":"Hello there"}],"max_tokens":3,"temperature":0,"ignore_eos":true}'
    check '[ "$code" = 200 ] && [ "$want" -gt 10 ] && jq -e ".usage.prompt_tokens == $want and .usage.completion_tokens == 3" <<<"$body" >/dev/null' "chat prompt tokens: want $want, $code $body"
    call "$B/v1/completions" '{"prompt":[1000,2000,3000,4000,5000,6000,7000,8000],"max_tokens":4,"temperature":0,"ignore_eos":true}'
    check '[ "$code" = 200 ] && jq -e ".usage.prompt_tokens == 8 and .usage.completion_tokens == 4 and (.choices[0].text | type) == \"string\"" <<<"$body" >/dev/null' "completions with token ids: $code $body"
    call "$B/v1/completions" '{"prompt":"Hello","max_tokens":2,"temperature":0,"ignore_eos":true}'
    check '[ "$code" = 200 ] && jq -e ".usage.prompt_tokens == 2" <<<"$body" >/dev/null' "completions text prompt (<|begin_of_text|> Hello): $code $body"
    call "$B/v1/completions" '{"prompt":[128256],"max_tokens":1}'
    check '[ "$code" = 400 ]' "an id past the model's vocabulary: $code $body"

    # ---- bench/serve_load.py against it ----
    if command -v python3 >/dev/null; then
        python3 "$HERE/../bench/serve_load.py" --url "$B" --streams 1,4 --prompt-tokens 32 --max-tokens 8 >"$tmp/load" 2>&1
        rc=$?
        # agg is "-" when the 4 streams never decoded at the same moment, which on
        # a loaded 2-core CI machine is a matter of timing; the row must still be there
        check '[ $rc -eq 0 ] && grep -Eq "^ +1 +([0-9.]+|-) +[0-9.]+ .* 8 +[0-9.]+$" "$tmp/load" && grep -Eq "^ +4 +([0-9.]+|-) +[0-9.]+ .* 32 +[0-9.]+$" "$tmp/load"' "serve_load.py rows: rc $rc $(cat "$tmp/load")"
        python3 "$HERE/../bench/serve_load.py" --url "$B" --streams 2 --prompt-tokens 16 --max-tokens 4 --api chat >"$tmp/load" 2>&1
        rc=$?
        check '[ $rc -eq 0 ] && grep -Eq "^ +2 +" "$tmp/load"' "serve_load.py --api chat: rc $rc $(cat "$tmp/load")"
        python3 "$HERE/../bench/serve_load.py" --url "$B" --prefix-test 256 >"$tmp/load" 2>&1
        rc=$?
        check '[ $rc -eq 0 ] && grep -Eq "hit  TTFT .*cached_tokens (2[0-9][0-9])\)" "$tmp/load" && grep -q "ratio cold/hit" "$tmp/load"' "serve_load.py --prefix-test: rc $rc $(cat "$tmp/load")"
        # --mixed: a 1,000-token prompt (8 prefill chunks) while a stream decodes:
        # its TTFT and the decoding stream's gaps, one row
        python3 "$HERE/../bench/serve_load.py" --url "$B" --mixed 1000 --prompt-tokens 16 --max-tokens 4000 >"$tmp/load" 2>&1
        rc=$?
        check '[ $rc -eq 0 ] && grep -Eq "^ +1 +[0-9.]+ +[0-9.]+ +[1-9][0-9]* +[0-9.]+ +[0-9.]+$" "$tmp/load"' "serve_load.py --mixed: rc $rc $(cat "$tmp/load")"
        python3 "$HERE/../bench/serve_load.py" --url "$B" --streams 1 --prompt-tokens 9000 --max-tokens 2 >"$tmp/load" 2>&1
        rc=$?
        check '[ $rc -eq 1 ] && grep -q "HTTP 400" "$tmp/load"' "serve_load.py on a failing request: rc $rc $(cat "$tmp/load")"
        P0=$(free_port)
        python3 "$HERE/../bench/serve_load.py" --url "http://127.0.0.1:$P0" --streams 1 >"$tmp/load" 2>&1
        rc=$?
        check '[ $rc -eq 1 ] && grep -q "cannot reach" "$tmp/load"' "serve_load.py on no server: rc $rc $(cat "$tmp/load")"
    else
        skipped+=("bench/serve_load.py checks: python3 not installed")
    fi
    kill -TERM "$S1"
    wait "$S1"
fi

# ---- CLLM_TOKENIZER, a tokenizer.json file ----
P2=$(free_port)
if start S2 "$P2" "$M" CLLM_TOKENIZER="$TOK/tokenizer.json"; then
    call "http://127.0.0.1:$P2/v1/chat/completions" '{"messages":[{"role":"user","content":"Hello there"}],"max_tokens":1}'
    check '[ "$code" = 200 ] && jq -e ".usage.prompt_tokens == $want" <<<"$body" >/dev/null' "CLLM_TOKENIZER=tokenizer.json: want $want, $code $body"
    kill -TERM "$S2"
    wait "$S2"
fi

check_summary test_tokenizer_override
