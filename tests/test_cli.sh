#!/usr/bin/env bash
# test_cli.sh - end-to-end checks of `cllm run`, `cllm tokenize` and
# `cllm template` as a user calls them: text and ids out of the real sample models and
# tokenizers, logits files, and clear errors for bad input. Usage: test_cli.sh <cllm binary> <shared dir> <fixtures dir>
set -u
CLLM=$1 SHARED=$2 FIX=$3
. "$(dirname "$0")/check_lib.sh"

# 1. Text generation from the llama2.c sample reproduces llama2.c's sample text.
out=$("$CLLM" run "$SHARED/models/stories260K" -p "Zoo" -n 57 --temp 0 2>"$tmp/err")
rc=$?
check '[ $rc -eq 0 ]' "run stories260K failed: $(cat "$tmp/err")"
want="Zoo was a little girl named Lily. She loved to play outside in the park."
check '[[ "$out" == "$want"* ]]' "stories260K text: got '$out'"
check 'grep -q "decode:.*tok/s" "$tmp/err"' "no tokens/s report on stderr"

# 2. Ids in, ids out (tinystories-656k, HF format with a tied head).
ids=$("$CLLM" run "$SHARED/models/tinystories-656k" --prompt-ids 1,80,147,201,282,57 -n 8 --temp 0 --print-ids 2>/dev/null)
check '[ "$ids" = "313,598,303,1049,1468,267,628,333" ]' "tinystories ids: got '$ids'"

# 2b. A step's head screened by its int8 copy (head_pick) for a greedy pick
# or a top-k draw: the same ids as the full head, on a bf16 model with
# Qwen3's 151,936-row head and on the tied f32 one above
"$(dirname "$CLLM")/gen_model" --shape tiny-qwen3 --dtype bf16 -o "$tmp/tq3.gguf" >"$tmp/o" 2>&1
check '[ -s "$tmp/tq3.gguf" ]' "gen_model tiny-qwen3: $(cat "$tmp/o")"
for m in "$tmp/tq3.gguf" "$SHARED/models/tinystories-656k"; do
    on=$("$CLLM" run "$m" --prompt-ids 1,80,147,201,282,57 -n 40 --temp 0 --ignore-eos --print-ids 2>/dev/null)
    off=$(CLLM_HEAD_SCREEN=0 "$CLLM" run "$m" --prompt-ids 1,80,147,201,282,57 -n 40 --temp 0 --ignore-eos --print-ids 2>/dev/null)
    check '[ "$(tr "," "\n" <<<"$on" | grep -c .)" = 40 ] && [ "$on" = "$off" ]' "head_pick ids on $(basename "$m"): '$on' vs '$off'"
    # a top-k draw needs the k largest logits only: the same tokens for a seed
    on=$("$CLLM" run "$m" --prompt-ids 1,80,147 -n 40 --temp 0.9 --top-k 20 --top-p 0.95 --seed 3 --ignore-eos --print-ids 2>/dev/null)
    off=$(CLLM_HEAD_SCREEN=0 "$CLLM" run "$m" --prompt-ids 1,80,147 -n 40 --temp 0.9 --top-k 20 --top-p 0.95 --seed 3 --ignore-eos --print-ids 2>/dev/null)
    check '[ "$(tr "," "\n" <<<"$on" | grep -c .)" = 40 ] && [ "$on" = "$off" ]' "head_pick top-k draws on $(basename "$m"): '$on' vs '$off'"
done

# 3. Text prompt through tokenizer.json gives the same ids.
# a bf16 K/V cache: a greedy continuation of the same length; an element
# type the cache cannot take is refused, naming the allowed ones
ids_bf=$(CLLM_KV_DTYPE=bf16 "$CLLM" run "$SHARED/models/tinystories-656k" --prompt-ids 1,80,147,201,282,57 -n 8 --temp 0 --print-ids 2>"$tmp/err")
rc=$?
check '[ $rc -eq 0 ] && [ "$(tr "," "\n" <<<"$ids_bf" | grep -c .)" = 8 ]' "CLLM_KV_DTYPE=bf16 run: '$ids_bf' $(cat "$tmp/err")"
CLLM_KV_DTYPE=f16 "$CLLM" run "$SHARED/models/tinystories-656k" --prompt-ids 1,80 -n 2 >/dev/null 2>"$tmp/err"
rc=$?
check '[ $rc -ne 0 ] && grep -q "CLLM_KV_DTYPE=f16: .* f32 or bf16" "$tmp/err"' "CLLM_KV_DTYPE=f16: $(cat "$tmp/err")"
# a CPU kernel ISA it does not know is refused, naming the known ones
CLLM_ISA=avx-512 "$CLLM" run "$SHARED/models/tinystories-656k" --prompt-ids 1,80 -n 2 >/dev/null 2>"$tmp/err"
rc=$?
check '[ $rc -ne 0 ] && grep -q "CLLM_ISA=\"avx-512\": needs scalar, avx2 or avx512" "$tmp/err"' "CLLM_ISA=avx-512: $(cat "$tmp/err")"
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
d=$("$CLLM" run "$SHARED/models/stories260K" -p "Zoo" -n 40 --seed 7 --temp 1 --print-ids --compiled-decode off 2>/dev/null)
check '[ "$a" = "$d" ]' "--compiled-decode off changed the output: '$a' vs '$d'"

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
expect_err "--temp needs a number" "$CLLM" run "$SHARED/models/stories260K" --temp nan
expect_err "--compiled-decode needs on or off" "$CLLM" run "$SHARED/models/stories260K" --compiled-decode yes
expect_err "top_p" "$CLLM" run "$SHARED/models/stories260K" -p hi --top-p 2
expect_err "not a model" "$CLLM" run "$SHARED/models/SOURCES.md"
expect_err "unknown command" "$CLLM" frobnicate
head -c 1000 "$SHARED/models/stories260K/stories260K.bin" >"$tmp/cut.bin"
expect_err "cut.bin" "$CLLM" run "$tmp/cut.bin" --prompt-ids 1
printf 'GGUF\3\0\0\0' >"$tmp/bad.gguf"
expect_err "bad.gguf" "$CLLM" run "$tmp/bad.gguf" --prompt-ids 1

# 6b. Structured output: a schema's answer parses with exactly its keys and
# stops by itself; a grammar file; greedy and sampled; refusals name the flag.
S='{"type":"object","properties":{"mood":{"enum":["happy","sad"]},"n":{"type":"integer"}},"required":["mood","n"],"additionalProperties":false}'
for temp in 0 1; do
    out=$("$CLLM" run "$SHARED/models/stories260K" --prompt-ids 1 -n 300 --temp $temp --seed 3 --json-schema "$S" 2>"$tmp/err")
    check '[ $? -eq 0 ] && jq -e "keys == [\"mood\",\"n\"] and (.mood == \"happy\" or .mood == \"sad\") and (.n | type == \"number\")" <<<"$out" >/dev/null' "--json-schema at temp $temp: '$out' $(cat "$tmp/err")"
    check '! grep -q "decode: 300 tokens" "$tmp/err"' "--json-schema at temp $temp did not stop by itself: $(cat "$tmp/err")"
done
printf '%s' "$S" >"$tmp/s.json"
out=$("$CLLM" run "$SHARED/models/stories260K" --prompt-ids 1 -n 300 --temp 0 --json-schema-file "$tmp/s.json" 2>/dev/null)
check 'jq -e ".mood" <<<"$out" >/dev/null' "--json-schema-file: '$out'"
printf 'root ::= " there was a " animal "."\nanimal ::= "cat" | "dog"  # either\n' >"$tmp/g.gbnf"
out=$("$CLLM" run "$SHARED/models/stories260K" -p "Once upon a time," -n 40 --temp 0 --grammar-file "$tmp/g.gbnf" 2>/dev/null)
check '[ "$out" = "Once upon a time, there was a cat." ] || [ "$out" = "Once upon a time, there was a dog." ]' "--grammar-file: '$out'"
expect_err "pattern: regular expression, at offset 0: lookaround" "$CLLM" run "$SHARED/models/stories260K" -p hi --json-schema '{"type":"string","pattern":"(?=a)"}'
out=$("$CLLM" run "$SHARED/models/stories260K" --prompt-ids 1 -n 40 --temp 0.8 --seed 3 --json-schema '{"type":"string","pattern":"^[a-z]{3}-[0-9]{2}$"}' 2>/dev/null)
check 'jq -e "test(\"^[a-z]{3}-[0-9]{2}$\")" <<<"$out" >/dev/null' "--json-schema with a pattern: '$out'"
expect_err "--json-schema: not JSON" "$CLLM" run "$SHARED/models/stories260K" -p hi --json-schema '{"type":'
expect_err "--grammar-file $tmp/g2.gbnf: grammar: line 1: rule 'x' is used but not defined" bash -c "printf 'root ::= x' >$tmp/g2.gbnf; \"$CLLM\" run \"$SHARED/models/stories260K\" -p hi --grammar-file $tmp/g2.gbnf"
expect_err "give one of" "$CLLM" run "$SHARED/models/stories260K" -p hi --json-schema '{}' --grammar-file "$tmp/g.gbnf"
expect_err "allows no token" "$CLLM" run "$SHARED/models/tinystories-656k" -p hi -n 50 --json-schema '{"type":"object"}'

# 7. cllm tokenize: ids and pieces, JSON, decode, no BOS, every real tokenizer.
TOK=$SHARED/tokenizers
out=$("$CLLM" tokenize "$TOK/llama3_1" "Hello world" 2>"$tmp/err")
check '[ "$out" = "$(printf "128000\t<|begin_of_text|>\n9906\tHello\n1917\t\xc4\xa0world")" ]' \
    "tokenize llama3_1: got '$out' $(cat "$tmp/err")"
out=$("$CLLM" tokenize "$TOK/qwen3" "Hello world" --json 2>&1)
want=$(printf '{"ids": [9707, 1879], "pieces": ["Hello", "\xc4\xa0world"]}')
check '[ "$out" = "$want" ]' \
    "tokenize --json qwen3: got '$out'"
out=$("$CLLM" tokenize "$TOK/llama3_1" --decode 128000,9906 2>&1)
check '[ "$out" = "<|begin_of_text|>Hello" ]' "tokenize --decode: got '$out'"
out=$("$CLLM" tokenize "$TOK/llama3_1" --decode 128000,9906 --skip-special 2>&1)
check '[ "$out" = "Hello" ]' "tokenize --decode --skip-special: got '$out'"
out=$("$CLLM" tokenize "$TOK/mistral" --no-special "Hello world" 2>&1 | cut -f1 | tr '\n' ,)
check '[ "$out" = "22557,1526," ]' "tokenize --no-special mistral: got '$out'"
text='Grüße, 世界! 😀 x² — "quoted"	tab  two'
for d in "$TOK"/*/; do
    ids=$("$CLLM" tokenize "$d" --no-special "$text" 2>"$tmp/err" | cut -f1 | paste -sd, -)
    check '[ -n "$ids" ]' "tokenize $d: $(cat "$tmp/err")"
    back=$("$CLLM" tokenize "$d" --decode "$ids" 2>&1)
    check '[ "$back" = "$text" ]' "tokenize round trip $d: got '$back'"
done
out=$("$CLLM" tokenize "$TOK/gemma3/tokenizer.json" --no-special "Hello" 2>&1 | cut -f1)
check '[ "$out" = "9259" ]' "tokenize tokenizer.json path: got '$out'"
out=$(printf 'Hello world' | "$CLLM" tokenize "$TOK/qwen3" - 2>&1 | cut -f1 | paste -sd, -)
check '[ "$out" = "9707,1879" ]' "tokenize from stdin: got '$out'"
out=$("$CLLM" tokenize "$SHARED/testdata/tokenizer-vectors/ggml-vocab-gpt-2.gguf" "Hello world" 2>&1 | cut -f1 | paste -sd, -)
check '[ "$out" = "15496,995" ]' "tokenize gpt-2 gguf: got '$out'"
out=$("$CLLM" tokenize "$SHARED/models/stories260K" "Zoo" 2>&1 | cut -f1 | paste -sd, -)
check '[ "$out" = "1,410,469,347" ]' "tokenize llama2.c: got '$out'"
expect_err "outside the vocabulary" "$CLLM" tokenize "$TOK/qwen3" --decode 1,99999999
expect_err "not a comma-separated list" "$CLLM" tokenize "$TOK/qwen3" --decode 1,x
expect_err "no text given" "$CLLM" tokenize "$TOK/qwen3"
expect_err "unknown option" "$CLLM" tokenize "$TOK/qwen3" hi --bogus
expect_err "either TEXT or --decode" "$CLLM" tokenize "$TOK/qwen3" hi --decode 1
expect_err "No such file" "$CLLM" tokenize /nonexistent/tok "hi"
expect_err "no tokenizer found" "$CLLM" tokenize "$tmp" "hi"

# 8. cllm template: the prompt exactly as the model's chat template renders it.
printf '[{"role": "user", "content": "Hello!"}]' >"$tmp/chat.json"
"$CLLM" template "$TOK/qwen3" --messages "$tmp/chat.json" >"$tmp/out" 2>"$tmp/err"
printf '<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n' >"$tmp/want"
check 'cmp -s "$tmp/out" "$tmp/want"' "template qwen3: got '$(cat "$tmp/out")' $(cat "$tmp/err")"
"$CLLM" template "$TOK/qwen3" --messages "$tmp/chat.json" --thinking off >"$tmp/out" 2>&1
printf '<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n' >"$tmp/want"
check 'cmp -s "$tmp/out" "$tmp/want"' "template --thinking off: got '$(cat "$tmp/out")'"
"$CLLM" template "$TOK/qwen3" --messages "$tmp/chat.json" --kwargs '{"enable_thinking": false}' >"$tmp/out2" 2>&1
check 'cmp -s "$tmp/out2" "$tmp/want"' "template --kwargs: got '$(cat "$tmp/out2")'"
# the switch's other words, as serve's --thinking takes them
"$CLLM" template "$TOK/qwen3" --messages "$tmp/chat.json" --thinking false >"$tmp/out3" 2>&1
check 'cmp -s "$tmp/out3" "$tmp/want"' "template --thinking false: got '$(cat "$tmp/out3")'"
"$CLLM" template "$TOK/llama3_1" --messages "$tmp/chat.json" --no-generation-prompt >"$tmp/out" 2>&1
printf '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>' >"$tmp/want"
check 'cmp -s "$tmp/out" "$tmp/want"' "template --no-generation-prompt: got '$(cat "$tmp/out")'"
printf '{"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}' >"$tmp/chat2.json"
out=$("$CLLM" template "$TOK/qwen3" --messages "$tmp/chat2.json" 2>&1)
check '[[ "$out" == *"<tools>"*'"'"'{"type": "function", "function": {"name": "f", "parameters": {}}}'"'"'* ]]' \
    "template with tools: got '$out'"
out=$("$CLLM" template "$TOK/gemma3" --messages - <"$tmp/chat.json" 2>&1)
check '[ "$out" = "$(printf "<bos><start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model")" ]' \
    "template from stdin: got '$out'"
out=$("$CLLM" template "$SHARED/testdata/tokenizer-vectors/ggml-vocab-phi-3.gguf" --messages "$tmp/chat.json" 2>&1)
check '[ "$out" = "$(printf "<s><|user|>\nHello!<|end|>\n<|assistant|>")" ]' "template gguf: got '$out'"
printf '[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]' >"$tmp/bad_chat.json"
expect_err "template line 19: Conversation roles must alternate" "$CLLM" template "$TOK/gemma3" --messages "$tmp/bad_chat.json"
expect_err "no chat template" "$CLLM" template "$TOK/mistral" --messages "$tmp/chat.json"
expect_err "--messages is required" "$CLLM" template "$TOK/qwen3"
expect_err "unknown option" "$CLLM" template "$TOK/qwen3" --messages "$tmp/chat.json" --bogus
expect_err "on or off" "$CLLM" template "$TOK/qwen3" --messages "$tmp/chat.json" --thinking maybe
expect_err "needs a JSON object" "$CLLM" template "$TOK/qwen3" --messages "$tmp/chat.json" --kwargs '[1]'
printf '{"messages": ' >"$tmp/cut.json"
expect_err "cut.json" "$CLLM" template "$TOK/qwen3" --messages "$tmp/cut.json"
expect_err "no such file" "$CLLM" template /nonexistent/model --messages "$tmp/chat.json"

check_summary test_cli
