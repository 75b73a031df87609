#!/usr/bin/env bash
# test_serve.sh - `cllm serve` end to end on loopback: the real server with
# the llama2.c sample model (no chat template) and a tiny random-weight
# model built here around the real Qwen3 tokenizer and chat template. curl
# checks every endpoint, streaming and not, stop strings split across tokens,
# max_tokens, usage counts against the tokenizer, errors, CORS, keep-alive,
# disconnects, 429, SIGTERM drain, a burst of concurrent clients checked
# against their answers alone (tests/serve/burst.py, python3); the official
# openai and @anthropic-ai/sdk packages, a bounded load run and the tool-call
# and reasoning checks (a scripted fixture, tests/serve/tools.mjs) go through
# node (skipped, visibly, when npm is absent). Usage: test_serve.sh <cllm binary> <shared dir> <fixtures dir>
set -u
CLLM=$1 SHARED=$2
HERE=$(cd "$(dirname "$0")" && pwd)
for t in curl jq; do
    command -v $t >/dev/null || { echo "test_serve: FAIL: $t is required (apt-get install $t)"; exit 1; }
done
SERVE_FLAGS=()
. "$(dirname "$0")/serve_lib.sh"

# call PATH JSON [URL-BASE]: sets $code and $body
call() {
    code=$(curl -s -m 120 -o "$tmp/body" -w '%{http_code}' "${3:-$B}$1" \
        -H 'content-type: application/json' --data-binary "$2")
    body=$(cat "$tmp/body")
}
# stream PATH JSON: the raw SSE text in $body
stream() {
    code=$(curl -sN -m 120 -o "$tmp/body" -w '%{http_code}' "$B$1" \
        -H 'content-type: application/json' --data-binary "$2")
    body=$(cat "$tmp/body")
}
# the JSON payloads of an SSE body, one per line ([DONE] left out)
sse_data() { sed -n 's/^data: //p' <<<"$body" | grep -v '^\[DONE\]$'; }
# wait_stats BASE JQ-EXPR SECONDS: polls /stats until the expression holds
wait_stats() {
    for _ in $(seq 1 $(($3 * 20))); do
        curl -s -m 2 "$1/stats" | jq -e "$2" >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    return 1
}
ntok() { "$CLLM" tokenize "$@" --json | jq '.ids | length'; }

STORIES="$SHARED/models/stories260K"
P1=$(free_port)
B="http://127.0.0.1:$P1"
start S1 "$P1" "$STORIES" CLLM_MAX_BODY_BYTES=65536 -- --no-open --bogus-flag || exit 1

# ---- start-up: flags, pre-flight ----
check 'grep -q "ignoring unknown flag --bogus-flag" "$tmp/log.$P1"' "no warning for an unknown flag"
"$CLLM" serve "$STORIES" --port "$P1" >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 1 ] && grep -q "already serving" "$tmp/e"' "second server on a busy port: $(cat "$tmp/e")"
"$CLLM" serve "$STORIES" --port 80800 >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 2 ] && grep -q -- "--port" "$tmp/e"' "bad --port value: $(cat "$tmp/e")"
CLLM_MAX_QUEUE=lots "$CLLM" serve "$STORIES" --port "$P1" >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 2 ] && grep -q "CLLM_MAX_QUEUE" "$tmp/e"' "bad CLLM_MAX_QUEUE: $(cat "$tmp/e")"

# ---- GET routes ----
check '[ "$(curl -s $B/health | jq -r .status)" = ok ]' "/health"
check '[ "$(curl -s $B/v1/models | jq -r ".data[0].id")" = stories260K ]' "/v1/models"
curl -s "$B/stats" >"$tmp/stats"
check 'jq -e ".running == 0 and .queue.waiting == 0 and .queue.max == 64 and .kv.blocks_total > 0 and .model.vocab_size == 512 and .batch.mode == \"batch\" and .batch.max_running == 8 and .batch.kv_budget_bytes == null and .uptime_s >= 0" "$tmp/stats" >/dev/null' "/stats fields: $(cat "$tmp/stats")"

# /metrics: /stats's numbers in Prometheus's text format, line by line
code=$(curl -s -o "$tmp/metrics" -w '%{http_code} %{content_type}' "$B/metrics")
curl -s "$B/stats" >"$tmp/stats"
check '[ "$code" = "200 text/plain; version=0.0.4" ] && grep -qx "cllm_kv_blocks_total $(jq .kv.blocks_total "$tmp/stats")" "$tmp/metrics" && grep -qx "cllm_prompt_cache_enabled 1" "$tmp/metrics" && ! grep -v "^#" "$tmp/metrics" | grep -vqE "^cllm_[A-Za-z0-9_]+ -?[0-9.e+-]+$"' "/metrics: $code $(head -c 400 "$tmp/metrics")"

# ---- chat completions: greedy, max_tokens -> length, usage = tokenizer counts ----
want_prompt=$(ntok "$STORIES" $'user: Zoo\nassistant:')
call /v1/chat/completions '{"model":"m","messages":[{"role":"user","content":"Zoo"}],"max_tokens":12,"temperature":0}'
chat_text=$(jq -r '.choices[0].message.content' <<<"$body")
check '[ "$code" = 200 ] && jq -e ".object == \"chat.completion\" and .choices[0].finish_reason == \"length\" and .usage.completion_tokens == 12 and .usage.prompt_tokens == $want_prompt and .usage.total_tokens == 12 + $want_prompt and .usage.prompt_tokens_details.cached_tokens == 0 and .model == \"m\" and .usage.lane == \"batched\"" <<<"$body" >/dev/null' "chat non-stream: $code $body (prompt tokens want $want_prompt)"
stream /v1/chat/completions '{"messages":[{"role":"user","content":"Zoo"}],"max_tokens":12,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}'
check '[ "$(sse_data | jq -rj ".choices[0].delta.content // empty")" = "$chat_text" ]' "chat stream text differs from non-stream"
check '[ "$(tail -c 15 <<<"$body" | tr -d "\n")" = "data: [DONE]" ]' "chat stream does not end with [DONE]"
check '[ "$(sse_data | jq -rs "[.[] | .choices[0].finish_reason // empty] | join(\",\")")" = length ]' "chat stream finish_reason"
check 'sse_data | tail -1 | jq -e ".choices == [] and .usage.completion_tokens == 12 and .usage.prompt_tokens == $want_prompt and .usage.lane == \"batched\"" >/dev/null' "chat stream usage chunk"
check '[ "$(sse_data | head -1 | jq -r .choices[0].delta.role)" = assistant ]' "first chunk carries the role"

# ---- prompt cache: a repeated prompt reuses its full KV blocks; greedy text is unchanged ----
pc_req='{"messages":[{"role":"user","content":"Once upon a time there was a little girl named Lily who loved to play in the park with her dog"}],"max_tokens":16,"temperature":0}'
call /v1/chat/completions "$pc_req"
pc_first=$body
call /v1/chat/completions "$pc_req"
check '[ "$code" = 200 ] && jq -e ".usage.prompt_tokens_details.cached_tokens > 0 and .usage.prompt_tokens_details.cached_tokens < .usage.prompt_tokens" <<<"$body" >/dev/null && [ "$(jq -r ".choices[0].message.content" <<<"$body")" = "$(jq -r ".choices[0].message.content" <<<"$pc_first")" ]' "prompt cache: repeated chat: $pc_first / $body"
call /v1/messages '{"model":"m","messages":[{"role":"user","content":"Once upon a time there was a little girl named Lily who loved to play in the park with her dog"}],"max_tokens":16,"temperature":0}'
check '[ "$code" = 200 ] && jq -e ".usage.cache_read_input_tokens > 0" <<<"$body" >/dev/null' "prompt cache: anthropic cache_read_input_tokens: $body"
call /v1/responses '{"model":"m","input":[{"role":"user","content":"Once upon a time there was a little girl named Lily who loved to play in the park with her dog"}],"max_output_tokens":16,"temperature":0}'
check '[ "$code" = 200 ] && jq -e ".usage.input_tokens_details.cached_tokens > 0" <<<"$body" >/dev/null' "prompt cache: responses cached_tokens: $body"
check 'curl -s $B/stats | jq -e ".prompt_cache.enabled and .prompt_cache.hits >= 3 and .prompt_cache.blocks > 0" >/dev/null' "prompt cache /stats: $(curl -s $B/stats | jq -c .prompt_cache)"
# --prompt-cache 0 turns it off (flag over env); a malformed CLLM_PROMPT_CACHE_GB is refused
P4=$(free_port)
if start S4 "$P4" "$STORIES" CLLM_PROMPT_CACHE_GB=2 -- --prompt-cache 0; then
    call /v1/chat/completions "$pc_req" "http://127.0.0.1:$P4"
    call /v1/chat/completions "$pc_req" "http://127.0.0.1:$P4"
    check '[ "$code" = 200 ] && jq -e ".usage.prompt_tokens_details.cached_tokens == 0" <<<"$body" >/dev/null && [ "$(jq -r ".choices[0].message.content" <<<"$body")" = "$(jq -r ".choices[0].message.content" <<<"$pc_first")" ]' "--prompt-cache 0: $body"
    check 'curl -s http://127.0.0.1:$P4/stats | jq -e ".prompt_cache.enabled == false and .prompt_cache.blocks == 0 and .kv.blocks_free == .kv.blocks_total" >/dev/null' "--prompt-cache 0 /stats"
    # default pool without a prompt cache: exactly --batch (8) x --ctx (512 = 32 blocks)
    check 'curl -s http://127.0.0.1:$P4/stats | jq -e ".kv.blocks_total == 256" >/dev/null && grep -q "KV pool 256 blocks of 16 tokens x 20480 bytes = 5.0 MiB (default: 75% of RAM, capped at 8 x 512 tokens + 0 prompt-cache blocks" "$tmp/log.$P4"' "default pool without the prompt cache: $(curl -s http://127.0.0.1:$P4/stats | jq -c .kv) $(cat "$tmp/log.$P4")"
    kill -TERM "$S4"
    wait "$S4"
fi
# --draft-kind ngram: the same greedy text as without it, in fewer steps;
# the flags' errors name the flag
P6=$(free_port)
if start S6 "$P6" "$STORIES" -- --draft-kind ngram --num-draft-tokens 6; then
    call /v1/completions '{"prompt":"Zoo","max_tokens":120,"temperature":0,"ignore_eos":true}' "http://127.0.0.1:$P6"
    spec_text=$(jq -r .choices[0].text <<<"$body")
    call /v1/completions '{"prompt":"Zoo","max_tokens":120,"temperature":0,"ignore_eos":true}'
    check '[ -n "$spec_text" ] && [ "$spec_text" = "$(jq -r .choices[0].text <<<"$body")" ]' "speculative text differs: $spec_text / $body"
    check 'curl -s http://127.0.0.1:$P6/stats | jq -e ".speculation.draft_kind == \"ngram\" and .speculation.num_draft_tokens == 6 and .speculation.steps > 0 and .speculation.accepted > 0 and .batch.steps < 120" >/dev/null' "/stats speculation: $(curl -s http://127.0.0.1:$P6/stats | jq -c '[.speculation, .batch.steps]')"
    kill -TERM "$S6"
    wait "$S6"
fi
# head_pick (CLLM_HEAD_SCREEN): a greedy request and a seeded top-k draw
# through the engine give the same text with the head's int8 copy as
# without it
PH=$(free_port)
if start SH "$PH" "$STORIES" CLLM_HEAD_SCREEN=0; then
    for req in '{"prompt":"Zoo","max_tokens":60,"temperature":0,"ignore_eos":true}' \
               '{"prompt":"Zoo","max_tokens":60,"temperature":0.9,"top_k":20,"top_p":0.95,"seed":5,"ignore_eos":true}'; do
        call /v1/completions "$req" "http://127.0.0.1:$PH"
        off=$(jq -r .choices[0].text <<<"$body")
        call /v1/completions "$req"
        on=$(jq -r .choices[0].text <<<"$body")
        check '[ -n "$on" ] && [ "$on" = "$off" ]' "head_pick through the engine: '$on' vs '$off' for $req"
    done
    kill -TERM "$SH"
    wait "$SH"
fi
# --draft-model: the model's first 4 of 5 layers (gen_model --layers 4: a GGUF with
# no tokenizer, the same 512 ids) drafts; the text is the model's own
"$(dirname "$CLLM")/gen_model" --from-hf "$STORIES" --dtype f32 --layers 4 -o "$tmp/draft1.gguf" >"$tmp/o" 2>&1
check '[ -s "$tmp/draft1.gguf" ]' "gen_model --layers 4: $(cat "$tmp/o")"
P7=$(free_port)
if start S7 "$P7" "$STORIES" -- --draft-model "$tmp/draft1.gguf"; then
    call /v1/completions '{"prompt":"Zoo","max_tokens":120,"temperature":0,"ignore_eos":true}' "http://127.0.0.1:$P7"
    draft_text=$(jq -r .choices[0].text <<<"$body")
    check 'jq -e ".usage.speculation as \$u | \$u.steps > 0 and \$u.accepted > 0 and \$u.accepted < \$u.drafted and \$u.drafted <= 3 * \$u.steps" <<<"$body" >/dev/null' "usage.speculation with a draft model: $body"
    check '[ -n "$draft_text" ] && [ "$draft_text" = "$spec_text" ]' "two-model text differs: $draft_text / $spec_text"
    check 'curl -s http://127.0.0.1:$P7/stats | jq -e ".speculation.draft_kind == \"two-model\" and .speculation.num_draft_tokens == 3 and (.speculation.draft_model | endswith(\"draft1.gguf\")) and .speculation.steps > 0 and .speculation.accepted > 0 and .speculation.accepted < .speculation.drafted and .speculation.last_error == null and .speculation.draft_p_min == 0 and .batch.steps < 120" >/dev/null' "/stats two-model: $(curl -s http://127.0.0.1:$P7/stats | jq -c '[.speculation, .batch.steps]')"
    check 'grep -q "speculation: two-model, draft model .*draft1.gguf, up to 3 drafts" "$tmp/log.$P7" && grep -q "no tokenizer of its own" "$tmp/log.$P7" && grep -q "draft model: [0-9.]* MiB of weights and K/V" "$tmp/log.$P7"' "two-model start-up log: $(cat "$tmp/log.$P7")"
    # streamed and sampled requests go through the drafts too
    stream_text=$(curl -sN "http://127.0.0.1:$P7/v1/completions" -d '{"prompt":"Zoo","max_tokens":120,"temperature":0,"ignore_eos":true,"stream":true}' | sed -n 's/^data: //p' | grep -v DONE | jq -rj '.choices[0].text // empty')
    check '[ "$stream_text" = "$draft_text" ]' "two-model streamed text differs: $stream_text"
    call /v1/completions '{"prompt":"Zoo","max_tokens":60,"temperature":0.8,"seed":5,"ignore_eos":true}' "http://127.0.0.1:$P7"
    check '[ "$code" = 200 ] && jq -e ".usage.completion_tokens == 60" <<<"$body" >/dev/null' "two-model sampled: $body"
    kill -TERM "$S7"
    wait "$S7"
fi
"$CLLM" serve "$STORIES" --port "$P7" --draft-model "$SHARED/models/tinystories-656k" >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 1 ] && grep -q "its tokenizer is not the served model" "$tmp/e"' "draft of another tokenizer: rc $rc $(cat "$tmp/e")"
"$CLLM" serve "$STORIES" --port "$P7" --draft-model "$tmp/nope" >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 1 ] && grep -q -- "--draft-model" "$tmp/e"' "missing draft model: rc $rc $(cat "$tmp/e")"
check 'curl -s $B/stats | jq -e ".speculation == null" >/dev/null' "speculation off by default"
call /v1/completions '{"prompt":"Zoo","max_tokens":4}'
check 'jq -e ".usage | has(\"speculation\") | not" <<<"$body" >/dev/null' "usage.speculation without speculation: $body"
for bad in "--draft-kind eagle:draft-kind eagle" "--draft-kind mtp:are not supported" "--draft-kind two-model:needs a --draft-model" "--draft-kind ngram --draft-model $STORIES:takes no --draft-model" "--num-draft-tokens 0:--num-draft-tokens" "--draft-model $STORIES --draft-p-min 1.5:--draft-p-min" "--ngram-min 3 --ngram-max 2:--ngram-min 3 is more than --ngram-max 2"; do
    # shellcheck disable=SC2086 # the flags split on purpose
    "$CLLM" serve "$STORIES" --port "$P6" ${bad%%:*} >"$tmp/o" 2>"$tmp/e"
    rc=$?
    check '[ $rc -eq 2 ] && grep -q -- "${bad#*:}" "$tmp/e"' "serve ${bad%%:*}: rc $rc $(cat "$tmp/e")"
done
# --ssd-cache: blocks written at shutdown are restored after a restart (the
# same greedy text, the prompt's full blocks cached), counted in /stats
P5=$(free_port)
if start S5 "$P5" "$STORIES" -- --ssd-cache "$tmp/ssd"; then
    call /v1/chat/completions "$pc_req" "http://127.0.0.1:$P5"
    check 'curl -s http://127.0.0.1:$P5/stats | jq -e ".prompt_cache.ssd.dir | startswith(\"$tmp/ssd/\")" >/dev/null' "/stats prompt_cache.ssd: $(curl -s http://127.0.0.1:$P5/stats | jq -c .prompt_cache)"
    kill -TERM "$S5"
    wait "$S5"
fi
if start S5 "$P5" "$STORIES" -- --ssd-cache "$tmp/ssd" --ssd-cache-max 1; then
    call /v1/chat/completions "$pc_req" "http://127.0.0.1:$P5"
    check '[ "$code" = 200 ] && jq -e ".usage.prompt_tokens_details.cached_tokens > 0" <<<"$body" >/dev/null && [ "$(jq -r ".choices[0].message.content" <<<"$body")" = "$(jq -r ".choices[0].message.content" <<<"$pc_first")" ]' "--ssd-cache after a restart: $body"
    check 'curl -s http://127.0.0.1:$P5/stats | jq -e ".prompt_cache.ssd.restored > 0 and .prompt_cache.ssd.max_bytes == 1073741824" >/dev/null' "/stats after restore: $(curl -s http://127.0.0.1:$P5/stats | jq -c .prompt_cache.ssd)"
    check 'grep -q "SSD cache in $tmp/ssd/" "$tmp/log.$P5"' "no SSD cache line at start-up: $(cat "$tmp/log.$P5")"
    kill -TERM "$S5"
    wait "$S5"
fi
"$CLLM" serve "$STORIES" --port "$P5" --ssd-cache /proc/nope >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -ne 0 ] && grep -q -- "--ssd-cache: cannot create /proc/nope" "$tmp/e"' "bad --ssd-cache: rc $rc $(cat "$tmp/e")"
CLLM_PROMPT_CACHE_GB=lots "$CLLM" serve "$STORIES" --port "$P4" >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 2 ] && grep -q "CLLM_PROMPT_CACHE_GB" "$tmp/e"' "bad CLLM_PROMPT_CACHE_GB: $(cat "$tmp/e")"

# ---- memory admission: --kv-budget, --memory-budget, usage.lane ----
# stories260K: 5 layers x 16 tokens x (K + V) x 64 wide x f32 = 20480 bytes a
# block. "Once upon a time" + 100 tokens projects 8 blocks = 163840 bytes, so
# a 200000-byte budget admits one such request at a time.
P5=$(free_port)
B5="http://127.0.0.1:$P5"
if start S5 "$P5" "$STORIES" CLLM_KV_BUDGET_GB=1 -- --kv-budget 0.0002; then
    check 'curl -s $B5/stats | jq -e ".batch.kv_budget_bytes == 200000 and .batch.kv_bytes == 0" >/dev/null' "--kv-budget /stats: $(curl -s $B5/stats | jq -c .batch)"
    check 'grep -q "KV budget 200000 bytes" "$tmp/log.$P5"' "--kv-budget start line: $(cat "$tmp/log.$P5")"
    # no --memory-budget: the default pool (75% of RAM less the weights) is
    # capped at --batch x --ctx (8 x 32 blocks) plus as much again for the
    # prompt cache; the start lines say so and name the device
    check 'curl -s $B5/stats | jq -e ".kv.blocks_total == 512" >/dev/null && grep -q "KV pool 512 blocks of 16 tokens x 20480 bytes = 10.0 MiB (default: 75% of RAM, capped at 8 x 512 tokens + 256 prompt-cache blocks; weights" "$tmp/log.$P5" && grep -q "device cpu, context 512 tokens" "$tmp/log.$P5"' "default KV pool: $(curl -s $B5/stats | jq -c .kv) $(cat "$tmp/log.$P5")"
    # no max_tokens: prompt + the rest of the 512-token context = 32 blocks, over the budget alone
    call /v1/chat/completions '{"messages":[{"role":"user","content":"Zoo"}]}' "$B5"
    check '[ "$code" = 400 ] && jq -e ".error.type == \"memory_admission\" and (.error.message | test(\"655360 bytes\") and test(\"200000 bytes\"))" <<<"$body" >/dev/null' "over-budget request (openai): $code $body"
    call /v1/messages '{"model":"m","messages":[{"role":"user","content":"Zoo"}],"max_tokens":400}' "$B5"
    check '[ "$code" = 400 ] && jq -e ".type == \"error\" and .error.type == \"memory_admission\" and (.error.message | test(\"200000 bytes\") and test(\"blocks of 20480 bytes\"))" <<<"$body" >/dev/null' "over-budget request (anthropic): $code $body"
    # three that fit alone but not together: all succeed, one at a time
    kpids=()
    for i in 1 2 3; do
        curl -s -m 60 -o "$tmp/kvb$i" "$B5/v1/completions" -H 'content-type: application/json' \
            -d '{"prompt":"Once upon a time","max_tokens":100,"temperature":0}' &
        kpids+=($!)
    done
    wait "${kpids[@]}"
    for i in 1 2 3; do
        check 'jq -e ".usage.completion_tokens == 100 and .usage.lane == \"batched\"" "$tmp/kvb$i" >/dev/null' "budgeted request $i: $(head -c 300 "$tmp/kvb$i")"
    done
    check 'curl -s $B5/stats | jq -e ".batch.submitted_rows == 3 and .batch.mean_rows == 1 and .batch.kv_projected_bytes == 0 and .batch.active_rows == 0" >/dev/null' "--kv-budget queued the joiners: $(curl -s $B5/stats | jq -c .batch)"
    kill -TERM "$S5"
    wait "$S5"
fi
CLLM_KV_BUDGET_GB=0 "$CLLM" serve "$STORIES" --port "$P5" >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 2 ] && grep -q "CLLM_KV_BUDGET_GB" "$tmp/e"' "bad CLLM_KV_BUDGET_GB: $(cat "$tmp/e")"
# --device / CLLM_DEVICE: a bad value is refused at start (exit 2)
"$CLLM" serve "$STORIES" --port "$P5" --device gpu0 >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 2 ] && grep -q -- "--device needs cpu, cuda, cuda:N or auto" "$tmp/e"' "bad --device: $rc $(cat "$tmp/e")"
CLLM_DEVICE=cuda:x "$CLLM" serve "$STORIES" --port "$P5" >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 2 ] && grep -q "CLLM_DEVICE" "$tmp/e"' "bad CLLM_DEVICE: $rc $(cat "$tmp/e")"
# --kv-block-size / CLLM_KV_BLOCK_SIZE: a bad value is refused at start (exit 2);
# a good one sets the pool's unit (/stats) and a repeated prompt still hits
"$CLLM" serve "$STORIES" --port "$P5" --kv-block-size 24 >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 2 ] && grep -q -- "--kv-block-size 24: needs a power of two from 8 to 256" "$tmp/e"' "bad --kv-block-size: $rc $(cat "$tmp/e")"
CLLM_KV_BLOCK_SIZE=512 "$CLLM" serve "$STORIES" --port "$P5" >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 2 ] && grep -q "CLLM_KV_BLOCK_SIZE" "$tmp/e"' "bad CLLM_KV_BLOCK_SIZE: $rc $(cat "$tmp/e")"
# --prefill-chunk: a bad value is refused at start (exit 2); a good one is
# the engine's (start line, /stats) and the prompt below goes in 4 passes
"$CLLM" serve "$STORIES" --port "$P5" --prefill-chunk 0 >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 2 ] && grep -q -- "--prefill-chunk needs an integer in \[1, 1048576\]" "$tmp/e"' "bad --prefill-chunk: $rc $(cat "$tmp/e")"
# --compiled-decode: on|off (the spec's flag), anything else exit 2; off is
# said at start (a CPU has no graphs: the same answers either way)
"$CLLM" serve "$STORIES" --port "$P5" --compiled-decode maybe >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 2 ] && grep -q -- "--compiled-decode needs true|false|on|off|1|0 (got \"maybe\")" "$tmp/e"' "bad --compiled-decode: $rc $(cat "$tmp/e")"
if start S5 "$P5" "$STORIES" -- --kv-block-size 32 --prefill-chunk 8 --compiled-decode off; then
    check 'curl -s http://127.0.0.1:$P5/stats | jq -e ".batch.prefill_chunk == 8 and .batch.prefill_chunk_shared == 8" >/dev/null && grep -q "prefill chunk 8 (8 beside decodes)," "$tmp/log.$P5"' "--prefill-chunk 8: $(curl -s http://127.0.0.1:$P5/stats | jq -c .batch)"
    check 'grep -q "compiled decode off" "$tmp/log.$P5" && ! grep -q "unknown flag" "$tmp/log.$P5"' "--compiled-decode off at start: $(cat "$tmp/log.$P5")"
    kb_req='{"messages":[{"role":"user","content":"Once upon a time there was a little girl who liked to play in the park with her friends every day"}],"max_tokens":4,"temperature":0}'
    call /v1/chat/completions "$kb_req" "http://127.0.0.1:$P5"
    call /v1/chat/completions "$kb_req" "http://127.0.0.1:$P5"
    check '[ "$code" = 200 ] && jq -e ".usage.prompt_tokens_details.cached_tokens > 0 and .usage.prompt_tokens_details.cached_tokens % 32 == 0" <<<"$body" >/dev/null' "--kv-block-size 32 prefix hit: $body"
    check 'curl -s http://127.0.0.1:$P5/stats | jq -e ".kv.block_tokens == 32" >/dev/null && grep -q "blocks of 32 tokens" "$tmp/log.$P5"' "--kv-block-size 32 /stats: $(curl -s http://127.0.0.1:$P5/stats | jq -c .kv)"
    kill -TERM "$S5"
    wait "$S5"
fi
# --memory-budget under the weights (about 1 MB) refuses to start; a fitting
# one sizes the pool (2 MB - 1037312 bytes of weights = 47 blocks)
"$CLLM" serve "$STORIES" --port "$P5" --memory-budget 0.0005 >"$tmp/o" 2>"$tmp/e"
rc=$?
check '[ $rc -eq 1 ] && grep -q "not enough for the weights" "$tmp/e" && grep -q "1037312 bytes" "$tmp/e"' "--memory-budget under the weights: $rc $(cat "$tmp/e")"
if start S5 "$P5" "$STORIES" CLLM_MEMORY_BUDGET_GB=0.002 CLLM_DEVICE=cpu -- --batch 1; then
    check 'curl -s $B5/stats | jq -e ".kv.blocks_total == 47 and .batch.mode == \"off\"" >/dev/null' "--memory-budget pool: $(curl -s $B5/stats | jq -c .kv)"
    check 'curl -s $B5/stats | jq -e ".batch.prefill_chunk == 128 and .batch.prefill_chunk_shared == 128" >/dev/null' "the CPU's default prefill chunks: $(curl -s $B5/stats | jq -c .batch)"
    check 'grep -q "KV pool 47 blocks of 16 tokens x 20480 bytes = 0.9 MiB (--memory-budget; weights" "$tmp/log.$P5" && grep -q "cllm serve: device cpu$" "$tmp/log.$P5"' "--memory-budget start line: $(cat "$tmp/log.$P5")"
    call /v1/chat/completions '{"messages":[{"role":"user","content":"Zoo"}],"max_tokens":4}' "$B5"
    check '[ "$code" = 200 ] && jq -e ".usage.lane == \"serial\"" <<<"$body" >/dev/null' "--batch 1 usage.lane: $body"
    call /v1/completions '{"prompt":"Zoo","max_tokens":4}' "$B5"
    check '[ "$code" = 200 ] && jq -e ".usage.lane == \"serial\"" <<<"$body" >/dev/null' "--batch 1 completions usage.lane: $body"
    kill -TERM "$S5"
    wait "$S5"
fi

# content parts and the developer role are accepted
call /v1/chat/completions '{"messages":[{"role":"developer","content":"Be nice."},{"role":"user","content":[{"type":"text","text":"Zo"},{"type":"text","text":"o"}]}],"max_tokens":2,"temperature":0,"unknown_field":{"x":1}}'
check '[ "$code" = 200 ]' "content parts: $code $body"

# ---- completions: served greedy text = cllm run's ----
run_text=$("$CLLM" run "$STORIES" -p Zoo -n 20 --temp 0 2>/dev/null)
call /v1/completions '{"prompt":"Zoo","max_tokens":20,"temperature":0}'
gen=$(jq -r '.choices[0].text' <<<"$body")
check '[ "Zoo$gen" = "$run_text" ]' "completions text 'Zoo$gen' != cllm run '$run_text'"
check 'jq -e ".usage.prompt_tokens == $(ntok "$STORIES" Zoo) and .usage.completion_tokens == 20 and .choices[0].finish_reason == \"length\"" <<<"$body" >/dev/null' "completions usage: $body"
ids=$("$CLLM" tokenize "$STORIES" --json Zoo | jq -c .ids)
call /v1/completions "{\"prompt\":$ids,\"max_tokens\":20,\"temperature\":0}"
check '[ "$(jq -r ".choices[0].text" <<<"$body")" = "$gen" ]' "completions from ids: $body"
stream /v1/completions '{"prompt":"Zoo","max_tokens":20,"temperature":0,"stream":true}'
check '[ "$(sse_data | jq -rj ".choices[0].text")" = "$gen" ]' "completions stream text"

# ---- stop strings split across tokens never leak ----
# Pick a stop string made of the end of one streamed token and the start of
# the next, so it can only be matched across the token boundary.
mapfile -t deltas < <(sse_data | jq -c '.choices[0].text' | head -n -1)
k=$(( ${#deltas[@]} / 2 ))
while [ $k -lt $(( ${#deltas[@]} - 1 )) ] && { [ "${deltas[$k]}" = '""' ] || [ "${deltas[$((k + 1))]}" = '""' ]; }; do k=$((k + 1)); done
stop=$(jq -rn --argjson a "${deltas[$k]}" --argjson b "${deltas[$((k + 1))]}" '($a[-2:]) + ($b[:2])')
want=$(jq -rn --arg g "$gen" --arg s "$stop" '$g[: ($g | index($s))]')
check '[ -n "$stop" ] && [ "${#stop}" -ge 2 ] && [ "$want" != "$gen" ]' "could not pick a stop string from '${deltas[*]}'"
req=$(jq -cn --arg s "$stop" '{prompt:"Zoo",max_tokens:20,temperature:0,stop:[$s,"never-occurs"]}')
call /v1/completions "$req"
check '[ "$(jq -r ".choices[0].text" <<<"$body")" = "$want" ] && [ "$(jq -r ".choices[0].finish_reason" <<<"$body")" = stop ]' "stop '$stop': want '$want', got $body"
stream /v1/completions "$(jq -c '.stream = true' <<<"$req")"
check '[ "$(sse_data | jq -rj ".choices[0].text")" = "$want" ]' "stop '$stop' streamed: got '$(sse_data | jq -rj '.choices[0].text')'"
check '! sse_data | jq -r ".choices[0].text" | grep -qF "${stop:0:1}${stop:1:1}" || [ "$(sse_data | jq -rj ".choices[0].text")" = "$want" ]' "stop leaked into a delta"
req=$(jq -cn --arg s "$stop" '{max_tokens:20,temperature:0,stop_sequences:[$s],messages:[{role:"user",content:"Zoo"}]}')
call /v1/messages "$req"
full=$(curl -s "$B/v1/messages" -d '{"max_tokens":20,"temperature":0,"messages":[{"role":"user","content":"Zoo"}]}' | jq -r '.content[0].text')
if [[ "$full" == *"$stop"* ]]; then
    check 'jq -e ".stop_reason == \"stop_sequence\" and .stop_sequence == \$s" --arg s "$stop" <<<"$body" >/dev/null' "messages stop_sequence: $body"
fi

# ---- Anthropic messages ----
call /v1/messages '{"model":"claude-x","max_tokens":10,"temperature":0,"system":[{"type":"text","text":"Stories."}],"messages":[{"role":"user","content":[{"type":"text","text":"Zoo"}]}]}'
check '[ "$code" = 200 ] && jq -e ".type == \"message\" and .role == \"assistant\" and .model == \"claude-x\" and .content[0].type == \"text\" and .stop_reason == \"max_tokens\" and .usage.output_tokens == 10 and .usage.input_tokens == $(ntok "$STORIES" $'"'"'system: Stories.\nuser: Zoo\nassistant:'"'"')" <<<"$body" >/dev/null' "messages: $body"
stream /v1/messages '{"max_tokens":10,"temperature":0,"stream":true,"messages":[{"role":"user","content":"Zoo"}]}'
events=$(sed -n 's/^event: //p' <<<"$body" | uniq | tr '\n' ' ')
check '[ "$events" = "message_start ping content_block_start content_block_delta content_block_stop message_delta message_stop " ]' "messages event grammar: $events"
check 'sse_data | jq -se "all(.[]; .type != null) and (.[-2].delta.stop_reason == \"max_tokens\") and (.[-2].usage.output_tokens == 10)" >/dev/null' "messages stream message_delta"
msg_text=$(curl -s "$B/v1/messages" -d '{"max_tokens":10,"temperature":0,"messages":[{"role":"user","content":"Zoo"}]}' | jq -r '.content[0].text')
check '[ "$(sse_data | jq -rj "select(.type == \"content_block_delta\") | .delta.text")" = "$msg_text" ]' "messages stream text"
call /v1/messages/count_tokens '{"model":"x","system":"Stories.","messages":[{"role":"user","content":"Zoo"}]}'
check '[ "$code" = 200 ] && [ "$(jq .input_tokens <<<"$body")" = "$(ntok "$STORIES" $'"'"'system: Stories.\nuser: Zoo\nassistant:'"'"')" ]' "count_tokens: $code $body"
# a text document is its title and text; blocks of tools another server
# ran (web search, MCP) are left out, as earlier thinking is
ct() { curl -s "$B/v1/messages/count_tokens" -d "$1" | jq .input_tokens; }
want=$(ct '{"messages":[{"role":"user","content":"Notes\n\nA tale.Zoo"}]}')
got=$(ct '{"messages":[{"role":"user","content":[{"type":"document","title":"Notes","source":{"type":"text","media_type":"text/plain","data":"A tale."}},{"type":"text","text":"Zoo"}]}]}')
got2=$(ct '{"messages":[{"role":"user","content":[{"type":"search_result","title":"Notes","source":"s","content":[{"type":"text","text":"A tale."}]},{"type":"text","text":"Zoo"}]}]}')
check '[ "$want" -gt 3 ] && [ "$got" = "$want" ] && [ "$got2" = "$want" ]' "document / search_result as text: $want, $got, $got2"
want=$(ct '{"messages":[{"role":"user","content":"Zoo"},{"role":"assistant","content":[{"type":"text","text":"Lions."}]},{"role":"user","content":"More"}]}')
got=$(ct '{"messages":[{"role":"user","content":"Zoo"},{"role":"assistant","content":[{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{"query":"zoo"}},{"type":"web_search_tool_result","tool_use_id":"srvtoolu_1","content":[{"type":"web_search_result","url":"http://a","title":"t","encrypted_content":"e"}]},{"type":"mcp_tool_use","id":"m","name":"n","server_name":"s","input":{}},{"type":"text","text":"Lions."}]},{"role":"user","content":"More"}]}')
check '[ "$want" -gt 3 ] && [ "$got" = "$want" ]' "server tool blocks left out: $want, $got"

# ---- Responses ----
call /v1/responses '{"input":"Zoo","instructions":"Stories.","max_output_tokens":8,"temperature":0}'
rid=$(jq -r .id <<<"$body")
check '[ "$code" = 200 ] && jq -e ".object == \"response\" and .status == \"incomplete\" and .incomplete_details.reason == \"max_output_tokens\" and .output[0].content[0].type == \"output_text\" and .output[0].status == \"incomplete\" and .usage.output_tokens == 8" <<<"$body" >/dev/null' "responses: $body"
in1=$(jq .usage.input_tokens <<<"$body")
call /v1/responses "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"More\"}]}],\"previous_response_id\":\"$rid\",\"max_output_tokens\":4,\"temperature\":0}"
check '[ "$code" = 200 ] && [ "$(jq .usage.input_tokens <<<"$body")" -gt "$in1" ]' "previous_response_id: $body"
check '[ "$(curl -s $B/v1/responses/$rid | jq -r .id)" = "$rid" ]' "GET /v1/responses/{id}"
stream /v1/responses '{"input":"Zoo","max_output_tokens":5,"temperature":0,"stream":true}'
events=$(sed -n 's/^event: //p' <<<"$body" | uniq | tr '\n' ' ')
check '[ "$events" = "response.created response.in_progress response.output_item.added response.content_part.added response.output_text.delta response.output_text.done response.content_part.done response.output_item.done response.incomplete " ]' "responses event grammar: $events"
check 'sse_data | jq -se "[.[].sequence_number] == [range(length)] and all(.[]; .type != null)" >/dev/null' "responses sequence_number"
check 'sse_data | jq -se "[.[] | select(.type == \"response.output_item.done\") | .item.status] == [\"incomplete\"] and (.[-1].response.output | map(.status)) == [\"incomplete\"]" >/dev/null' "responses: the cut item is incomplete"
# the items of tools OpenAI's servers ran, and its encrypted compactions,
# are left out, as earlier reasoning is
rin() { curl -s "$B/v1/responses" -d "{\"input\":$1,\"max_output_tokens\":1,\"temperature\":0}" | jq .usage.input_tokens; }
want=$(rin '[{"role":"user","content":"Zoo"},{"role":"assistant","content":"Lions."},{"role":"user","content":"More"}]')
got=$(rin '[{"role":"user","content":"Zoo"},{"type":"web_search_call","id":"ws_1","status":"completed","action":{"type":"search","query":"zoo"}},{"type":"compaction","encrypted_content":"gAAA"},{"type":"mcp_call","id":"mcp_1","name":"n","server_label":"s","arguments":"{}","output":"x"},{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"e"},{"role":"assistant","content":"Lions."},{"type":"image_generation_call","id":"ig_1","status":"completed","result":"AAAA"},{"role":"user","content":"More"}]')
check '[ "$want" -gt 3 ] && [ "$got" = "$want" ]' "responses: items made elsewhere left out: $want, $got"
check '[ "$(sse_data | jq -rj "select(.type == \"response.output_text.delta\") | .delta")" = "$(sse_data | jq -r "select(.type == \"response.output_text.done\") | .text")" ]' "responses deltas != done text"

# ---- errors, in each API's shape ----
err_case() { # path body code jq-check what
    local want=$3 expr=$4
    call "$1" "$2"
    check '[ "$code" = "$want" ] && jq -e "$expr" <<<"$body" >/dev/null' "$5: $code $body"
}
oai='.error.message != null and (.error | has("type") and has("param") and has("code"))'
ant='.type == "error" and .error.type != null and .error.message != null'
err_case /v1/chat/completions '{"messages": [' 400 "$oai" "invalid JSON"
err_case /v1/messages '{"messages": [' 400 "$ant" "invalid JSON (anthropic)"
err_case /v1/chat/completions '[1,2]' 400 "$oai" "non-object body"
err_case /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}' 400 "$oai and .error.param == \"temperature\"" "wrong type"
err_case /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"max_tokens":"9"}' 400 "$oai and .error.param == \"max_tokens\"" "wrong type max_tokens"
err_case /v1/chat/completions '{"messages":"x"}' 400 "$oai and .error.param == \"messages\"" "messages not an array"
err_case /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"n":0}' 400 "$oai and .error.param == \"n\"" "n = 0"
err_case /v1/chat/completions '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}' 400 "$oai" "image part"
err_case /v1/completions '{"prompt":[1,99999]}' 400 "$oai and (.error.message | test(\"vocabulary\"))" "id out of vocabulary"
err_case /v1/messages '{"messages":[{"role":"user","content":"x"}]}' 400 "$ant and (.error.message | test(\"max_tokens\"))" "messages without max_tokens"
err_case /v1/messages '{"max_tokens":3,"messages":[{"role":"robot","content":"x"}]}' 400 "$ant" "messages bad role"
err_case /v1/messages '{"max_tokens":3,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBE"}}]}]}' 400 "$ant and (.error.message | test(\"base64\"))" "a PDF document is refused, named"
err_case /v1/responses '{"input":"x","previous_response_id":"resp_nope"}' 400 "$oai and .error.param == \"previous_response_id\"" "unknown previous_response_id"
err_case /v1/responses '{"input":[{"role":"user","content":"x"},{"type":"custom_tool_call_output","call_id":"c"}]}' 400 "$oai and .error.param == \"input[1]\" and (.error.message | test(\"output\"))" "a tool output without output"
err_case /v1/responses '{"input":[{"type":"local_shell_call","call_id":"c","action":{"type":"exec","command":"ls"}}]}' 400 "$oai and .error.param == \"input[0]\" and (.error.message | test(\"command\"))" "a local_shell_call without a command array"
err_case /v1/responses '{"input":[{"role":"user","content":"x"},{"type":"computer_call","call_id":"c","action":{"type":"click"}}]}' 400 "$oai and .error.param == \"input[1]\" and (.error.message | test(\"computer_call\"))" "an item of a kind not taken"
long=$(jq -cn '{messages:[{role:"user",content:("Zoo " * 300)}]}')
err_case /v1/chat/completions "$long" 400 "$oai and (.error.message | test(\"context is 512 tokens\")) and .error.code == \"context_length_exceeded\"" "prompt longer than the context"
err_case /v1/messages "$(jq -c '.max_tokens = 5' <<<"$long")" 400 "$ant and (.error.message | test(\"512\"))" "long prompt (anthropic)"
head -c 70000 /dev/zero | tr '\0' 'a' >"$tmp/big"
code=$(curl -s -o "$tmp/body" -w '%{http_code}' "$B/v1/chat/completions" --data-binary @"$tmp/big")
check '[ "$code" = 413 ] && jq -e "$oai" "$tmp/body" >/dev/null' "body over the cap (Content-Length): $code"
code=$(curl -s -o "$tmp/body" -w '%{http_code}' -H 'Transfer-Encoding: chunked' "$B/v1/messages" --data-binary @"$tmp/big")
check '[ "$code" = 413 ] && jq -e "$ant" "$tmp/body" >/dev/null' "body over the cap (chunked): $code"
code=$(curl -s -o "$tmp/body" -w '%{http_code}' "$B/v1/nothing")
check '[ "$code" = 404 ] && jq -e "$oai" "$tmp/body" >/dev/null' "unknown route: $code"
code=$(curl -s -o "$tmp/body" -w '%{http_code}' "$B/v1/chat/completions")
check '[ "$code" = 405 ] && jq -e "$oai" "$tmp/body" >/dev/null' "GET on a POST route: $code"
code=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE "$B/stats")
check '[ "$code" = 405 ]' "DELETE /stats: $code"

# ---- structured output: every API's form of a schema, a grammar, refusals ----
# Greedy on stories260K (byte-fallback vocabulary): the answer must parse and
# carry exactly the schema's keys with their types, and end with "stop".
SCHEMA='{"type":"object","properties":{"mood":{"enum":["happy","sad"]},"n":{"type":"integer"},"ok":{"type":"boolean"}},"required":["mood","n","ok"],"additionalProperties":false}'
valid='fromjson | (keys == ["mood","n","ok"]) and (.mood == "happy" or .mood == "sad") and (.n | type == "number" and floor == .) and (.ok | type == "boolean")'
call /v1/chat/completions '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":300,"temperature":0,"response_format":{"type":"json_schema","json_schema":{"name":"s","strict":true,"schema":'"$SCHEMA"'}}}'
so_text=$(jq -r '.choices[0].message.content' <<<"$body")
check '[ "$code" = 200 ] && jq -e ".choices[0].finish_reason == \"stop\"" <<<"$body" >/dev/null && jq -Rse "$valid" <<<"$so_text" >/dev/null' "chat json_schema: $code $body"
stream /v1/chat/completions '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":300,"temperature":0,"stream":true,"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":'"$SCHEMA"'}}}'
check '[ "$(sse_data | jq -rj ".choices[0].delta.content // empty")" = "$so_text" ]' "chat json_schema streamed differs: $body"
call /v1/chat/completions '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":300,"temperature":0.9,"seed":5,"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":'"$SCHEMA"'}}}'
check '[ "$code" = 200 ] && jq -r ".choices[0].message.content" <<<"$body" | jq -Rse "$valid" >/dev/null' "chat json_schema sampled: $code $body"
call /v1/responses '{"input":"Once upon a time","max_output_tokens":300,"temperature":0,"text":{"format":{"type":"json_schema","name":"s","schema":'"$SCHEMA"'}}}'
check '[ "$code" = 200 ] && jq -r ".output[-1].content[0].text" <<<"$body" | jq -Rse "$valid" >/dev/null' "responses text.format: $code $body"
call /v1/messages '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":300,"temperature":0,"output_format":{"type":"json_schema","schema":'"$SCHEMA"'}}'
check '[ "$code" = 200 ] && jq -e ".stop_reason == \"end_turn\"" <<<"$body" >/dev/null && jq -r ".content[0].text" <<<"$body" | jq -Rse "$valid" >/dev/null' "messages output_format: $code $body"
call /v1/completions '{"prompt":"Once upon a time","max_tokens":40,"temperature":0,"guided_grammar":"root ::= \" there was a \" (\"cat\" | \"dog\") \".\""}'
check '[ "$code" = 200 ] && jq -e "(.choices[0].text == \" there was a cat.\" or .choices[0].text == \" there was a dog.\") and .choices[0].finish_reason == \"stop\"" <<<"$body" >/dev/null' "completions guided_grammar: $code $body"
call /v1/chat/completions '{"messages":[{"role":"user","content":"Pick one"}],"max_tokens":20,"temperature":0.9,"seed":3,"guided_choice":["a cat","a dog","\"quoted\" bird"]}'
check '[ "$code" = 200 ] && jq -e "(.choices[0].message.content | IN(\"a cat\", \"a dog\", \"\\\"quoted\\\" bird\")) and .choices[0].finish_reason == \"stop\"" <<<"$body" >/dev/null' "guided_choice: $code $body"
# ---- several choices: a list of prompts, n ----
call /v1/completions '{"prompt":["Once upon a time","The dog",[1,400,300]],"max_tokens":6,"temperature":0}'
multi=$body
singles=""
for p in '"Once upon a time"' '"The dog"' '[1,400,300]'; do
    call /v1/completions '{"prompt":'"$p"',"max_tokens":6,"temperature":0}'
    singles="$singles$(jq -c '[.choices[0].text, .usage.prompt_tokens]' <<<"$body")"
done
check '[ "$(jq -c "[.choices[] | .index]" <<<"$multi")" = "[0,1,2]" ] && [ "$(jq -c ".choices[] | [.text]" <<<"$multi" | tr -d "\n")" = "$(jq -c ".[0:1]" <<<"$singles" | tr -d "\n")" ] && [ "$(jq ".usage.prompt_tokens" <<<"$multi")" = "$(jq -s "map(.[1]) | add" <<<"$singles")" ]' "a list of prompts: each choice is that prompt's answer: $multi / $singles"
call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"temperature":0.9,"seed":11,"n":3}'
n3=$body
call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"temperature":0.9,"seed":11}'
check '[ "$(jq -c "[.choices[].index]" <<<"$n3")" = "[0,1,2]" ] && [ "$(jq -r ".choices[0].message.content" <<<"$n3")" = "$(jq -r ".choices[0].message.content" <<<"$body")" ] && jq -e ".usage.completion_tokens <= 24 and .usage.prompt_tokens == $(jq .usage.prompt_tokens <<<"$body")" <<<"$n3" >/dev/null' "n=3: choice 0 is the seed's answer alone: $n3 / $body"
call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"temperature":0.9,"seed":11,"n":3}'
check '[ "$body" != "" ] && [ "$(jq -c "[.choices[].message.content]" <<<"$body")" = "$(jq -c "[.choices[].message.content]" <<<"$n3")" ]' "n=3 with a seed repeats: $body"
call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"n":2,"stream":true}'
check '[ "$code" = 400 ] && jq -e ".error.param == \"n\"" <<<"$body" >/dev/null' "n > 1 streamed: $code $body"
call /v1/completions '{"prompt":["a","b"],"n":40}'
check '[ "$code" = 400 ] && jq -e ".error.message | test(\"at most 64\")" <<<"$body" >/dev/null' "80 choices: $code $body"
call /v1/completions '{"prompt":["a",7]}'
check '[ "$code" = 400 ] && jq -e ".error.param == \"prompt\"" <<<"$body" >/dev/null' "a bad prompt in a list: $code $body"

# ---- logprobs, logit_bias and penalties ----
call /v1/chat/completions '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":12,"temperature":0,"logprobs":true,"top_logprobs":3}'
lp_chat=$body
check '[ "$code" = 200 ] && jq -e "(.choices[0].logprobs.content | length) == .usage.completion_tokens and ([.choices[0].logprobs.content[] | .logprob <= 0 and (.top_logprobs | length) == 3 and .top_logprobs[0].token == .token and .top_logprobs[0].logprob == .logprob and .top_logprobs[0].logprob >= .top_logprobs[1].logprob and .top_logprobs[1].logprob >= .top_logprobs[2].logprob and (.bytes | length) > 0] | all) and ([.choices[0].logprobs.content[].token] | join(\"\")) == .choices[0].message.content" <<<"$body" >/dev/null' "chat logprobs: $code $body"
stream /v1/chat/completions '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":12,"temperature":0,"logprobs":true,"top_logprobs":3,"stream":true}'
check '[ "$code" = 200 ] && [ "$(sse_data | jq -sc "[.[] | .choices[0].logprobs.content // empty | .[]]")" = "$(jq -c ".choices[0].logprobs.content" <<<"$lp_chat")" ]' "chat stream logprobs differ from non-stream: $body"
call /v1/chat/completions '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":4}'
check '[ "$code" = 200 ] && jq -e ".choices[0].logprobs == null" <<<"$body" >/dev/null' "logprobs null unless asked: $body"
call /v1/completions '{"prompt":"Once upon a time","max_tokens":10,"temperature":0,"logprobs":2}'
check '[ "$code" = 200 ] && jq -e ".choices[0].logprobs as \$l | (\$l.tokens | join(\"\")) == .choices[0].text and (\$l.token_logprobs | length) == .usage.completion_tokens and \$l.text_offset[0] == 0 and ([range(1; \$l.text_offset | length) as \$i | \$l.text_offset[\$i] == \$l.text_offset[\$i-1] + (\$l.tokens[\$i-1] | length)] | all) and ([\$l.top_logprobs[] | length <= 2 and length >= 1] | all)" <<<"$body" >/dev/null' "completions logprobs: $code $body"
call /v1/responses '{"input":"Once upon a time","max_output_tokens":6,"temperature":0,"include":["message.output_text.logprobs"],"top_logprobs":2}'
check '[ "$code" = 200 ] && jq -e ".output[-1].content[0] as \$c | (\$c.logprobs | length) == .usage.output_tokens and ([\$c.logprobs[].token] | join(\"\")) == \$c.text and ([\$c.logprobs[] | (.top_logprobs | length) == 2] | all)" <<<"$body" >/dev/null' "responses logprobs: $code $body"
call /v1/completions '{"prompt":"Once upon a time","max_tokens":3,"temperature":0,"logprobs":1,"echo":true}'
check '[ "$code" = 200 ] && jq -e ".choices[0] as \$c | (\$c.text | startswith(\"Once upon a time\")) and (\$c.logprobs.tokens | length) == .usage.prompt_tokens + .usage.completion_tokens and \$c.logprobs.token_logprobs[0] == null and \$c.logprobs.top_logprobs[0] == null and ([\$c.logprobs.token_logprobs[1:][] | . <= 0] | all) and \$c.logprobs.text_offset[1] == 0" <<<"$body" >/dev/null' "echo with logprobs: $code $body"
# what a generated token was given is what the same token gets as prompt (lm-eval's loglikelihood)
ids=$(jq -c '[1] + .cases[0].generated_ids[0:20]' "$STORIES/expected_greedy.json")
ids25=$(jq -c '[1] + .cases[0].generated_ids[0:25]' "$STORIES/expected_greedy.json")
call /v1/completions '{"prompt":'"$ids"',"max_tokens":5,"temperature":0,"logprobs":0}'
gen_lp=$(jq -c '.choices[0].logprobs.token_logprobs' <<<"$body")
call /v1/completions '{"prompt":'"$ids25"',"max_tokens":1,"temperature":0,"logprobs":0,"echo":true}'
check '[ "$code" = 200 ] && jq -e --argjson g "$gen_lp" "[range(0; 5) as \$i | ((.choices[0].logprobs.token_logprobs[21 + \$i] - \$g[\$i]) | fabs) < 1e-4] | all" <<<"$body" >/dev/null' "echoed prompt logprobs = the same tokens' generated ones: $gen_lp vs $body"
# max_tokens 0 (lm-eval's loglikelihood): the prompt's logprobs alone, the same values as with a token generated
echo25=$body
call /v1/completions '{"prompt":'"$ids25"',"max_tokens":0,"logprobs":0,"echo":true}'
check '[ "$code" = 200 ] && jq -e --argjson w "$echo25" ".choices[0].finish_reason == \"length\" and .usage.completion_tokens == 0 and (.choices[0].logprobs.token_logprobs | length) == 26 and .choices[0].logprobs.token_logprobs == \$w.choices[0].logprobs.token_logprobs[0:26]" <<<"$body" >/dev/null' "max_tokens 0 with echo and logprobs: $code $body"
call /v1/completions '{"prompt":"Once upon a time","max_tokens":0}'
check '[ "$code" = 200 ] && jq -e ".choices[0].text == \"\" and .usage.completion_tokens == 0 and .usage.prompt_tokens > 0" <<<"$body" >/dev/null' "max_tokens 0 alone: $code $body"
call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":0}'
check '[ "$code" = 400 ] && jq -e ".error.param == \"max_tokens\"" <<<"$body" >/dev/null' "chat max_tokens 0 refused: $code $body"
call /v1/completions '{"prompt":"Once upon a time","max_tokens":2,"temperature":0,"echo":true}'
check '[ "$code" = 200 ] && jq -e ".choices[0].text | startswith(\"Once upon a time\")" <<<"$body" >/dev/null' "echo without logprobs: $code $body"
call /v1/completions '{"prompt":"Once upon a time","max_tokens":4,"temperature":0,"logprobs":0,"logit_bias":{"300":100}}'
check '[ "$code" = 200 ] && jq -e ".choices[0].logprobs.tokens | length == 4 and (unique | length) == 1" <<<"$body" >/dev/null' "logit_bias +100 picks that token every step: $code $body"
call /v1/messages '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":8,"temperature":0,"repetition_penalty":1.3,"presence_penalty":0.5,"frequency_penalty":0.5,"repetition_context_size":10}'
check '[ "$code" = 200 ] && jq -e ".usage.output_tokens == 8" <<<"$body" >/dev/null' "penalties through Messages: $code $body"
call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"logit_bias":{"abc":1}}'
check '[ "$code" = 400 ] && jq -e ".error.param == \"logit_bias\"" <<<"$body" >/dev/null' "logit_bias key not an id: $code $body"
call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"logit_bias":{"512":1}}'
check '[ "$code" = 400 ] && jq -e ".error.param == \"logit_bias\" and (.error.message | test(\"0..511\"))" <<<"$body" >/dev/null' "logit_bias id past the vocabulary: $code $body"
call /v1/responses '{"input":"Hi","presence_penalty":2.5}'
check '[ "$code" = 400 ] && jq -e ".error.param == \"presence_penalty\"" <<<"$body" >/dev/null' "presence_penalty out of range: $code $body"
call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"logprobs":true,"top_logprobs":21}'
check '[ "$code" = 400 ] && jq -e ".error.param == \"top_logprobs\"" <<<"$body" >/dev/null' "top_logprobs out of range: $code $body"
call /v1/completions '{"prompt":"x","guided_choice":["a",7]}'
check '[ "$code" = 400 ] && jq -e ".error.param == \"guided_choice\" and (.error.message | test(\"guided_choice\\\\[1\\\\]\"))" <<<"$body" >/dev/null' "guided_choice with a number: $code $body"
call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":300,"temperature":0,"response_format":{"type":"json_object"}}'
check '[ "$code" = 200 ] && { jq -e ".choices[0].finish_reason == \"length\"" <<<"$body" >/dev/null || jq -r ".choices[0].message.content" <<<"$body" | jq -Rse "fromjson | type == \"object\"" >/dev/null; }' "chat json_object: $code $body"
call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":40,"temperature":0,"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","properties":{"id":{"type":"string","pattern":"^[A-Z]{2}-[0-9]{3}$"}},"required":["id"],"additionalProperties":false}}}}'
check '[ "$code" = 200 ] && jq -r ".choices[0].message.content" <<<"$body" | jq -e ".id | test(\"^[A-Z]{2}-[0-9]{3}$\")" >/dev/null' "schema with a pattern: $code $body"
call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"string","pattern":"(?<=a)b"}}}}'
check '[ "$code" = 400 ] && jq -e ".error.param == \"response_format\" and (.error.message | test(\"lookaround\"))" <<<"$body" >/dev/null' "a pattern outside the subset refused: $code $body"
# a refusal quoting a long multi-byte name: the message cut to its buffer
# must stay UTF-8 (it was a 500 once: jansson refused the cut character)
long_name=$(printf '名%.0s' $(seq 300))
call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","properties":{"'"$long_name"'":{"not":{}}}}}}}'
check '[ "$code" = 400 ] && jq -e ".error.param == \"response_format\" and (.error.message | test(\"schema: properties.名名\"))" <<<"$body" >/dev/null' "a refusal quoting a long multi-byte name: $code $body"
call /v1/completions '{"prompt":"Once upon a time","max_tokens":30,"temperature":0.9,"seed":5,"guided_regex":" (there|then) [a-z]+ [0-9]{2}\\."}'
check '[ "$code" = 200 ] && jq -e "(.choices[0].text | test(\"^ (there|then) [a-z]+ [0-9]{2}[.]$\")) and .choices[0].finish_reason == \"stop\"" <<<"$body" >/dev/null' "guided_regex: $code $body"
call /v1/chat/completions '{"messages":[{"role":"user","content":"Pick"}],"max_tokens":20,"structured_outputs":{"choice":["left","right"]}}'
check '[ "$code" = 200 ] && jq -e ".choices[0].message.content | IN(\"left\", \"right\")" <<<"$body" >/dev/null' "structured_outputs.choice: $code $body"
call /v1/completions '{"prompt":"x","structured_outputs":{"regex":"a","json":{}}}'
check '[ "$code" = 400 ] && jq -e ".error.param == \"structured_outputs\"" <<<"$body" >/dev/null' "structured_outputs with two constraints: $code $body"
call /v1/completions '{"prompt":"x","guided_regex":"a","guided_choice":["a"]}'
check '[ "$code" = 400 ] && jq -e ".error.message | test(\"both constrain\")" <<<"$body" >/dev/null' "guided_regex beside guided_choice: $code $body"
call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"response_format":{"type":"text"}}'
check '[ "$code" = 200 ] && jq -e ".usage.completion_tokens == 3" <<<"$body" >/dev/null' "response_format text: $code $body"
call /v1/responses '{"input":"Hi","max_output_tokens":3,"text":{"format":{"name":"no type"}}}'
check '[ "$code" = 200 ]' "text.format without a type (plain text): $code $body"
call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"response_format":{"type":"yaml"}}'
check '[ "$code" = 400 ] && jq -e ".error.param == \"response_format\"" <<<"$body" >/dev/null' "unknown response_format type: $code $body"
call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"x"}}}'
check '[ "$code" = 400 ] && jq -e ".error.message | test(\"schema\")" <<<"$body" >/dev/null' "json_schema without a schema: $code $body"
call /v1/completions '{"prompt":"x","guided_grammar":"root ::= \"a\"\nroot ::= item"}'
check '[ "$code" = 400 ] && jq -e ".error.param == \"guided_grammar\" and (.error.message | test(\"line 2\"))" <<<"$body" >/dev/null' "bad grammar refused with its line: $code $body"
call /v1/completions '{"prompt":"x","guided_grammar":"root ::= \"a\"","response_format":{"type":"json_object"}}'
check '[ "$code" = 400 ] && jq -e ".error.message | test(\"give one\")" <<<"$body" >/dev/null' "two constraints refused: $code $body"
call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"}'
check '[ "$code" = 400 ] && jq -e ".error.param == \"tool_choice\" and (.error.message | test(\"no format\"))" <<<"$body" >/dev/null' "tool_choice required without a tool-call format: $code $body"
call /v1/messages '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":5,"output_format":{"type":"json_schema","schema":{"type":"object","not":{}}}}'
check '[ "$code" = 400 ] && jq -e ".type == \"error\" and (.error.message | test(\"not\"))" <<<"$body" >/dev/null' "messages: unsupported schema keyword: $code $body"

# ---- HTTP: CORS, keep-alive ----
curl -s -i -X OPTIONS "$B/v1/chat/completions" -H 'Origin: http://x' -H 'Access-Control-Request-Method: POST' \
    -H 'Access-Control-Request-Headers: content-type,authorization' | tr -d '\r' >"$tmp/h"
check 'head -1 "$tmp/h" | grep -q " 204" && grep -qi "^access-control-allow-origin: \*" "$tmp/h" && grep -qi "^access-control-allow-headers: content-type,authorization" "$tmp/h"' "CORS preflight: $(cat "$tmp/h")"
check 'curl -s -i "$B/health" | tr -d "\r" | grep -qi "^access-control-allow-origin: \*"' "CORS header on responses"
curl -sv "$B/health" "$B/v1/models" -o /dev/null -o /dev/null 2>"$tmp/v"
check 'grep -qi "re-using existing connection" "$tmp/v"' "no keep-alive"

# ---- a burst of concurrent clients over the four routes, some dropped
# mid-stream: every answer the greedy answer alone (the CPU backend's batch
# invariance), the server back to idle (tests/serve/burst.py; needs python3) ----
if command -v python3 >/dev/null; then
    P6=$(free_port)
    if start S6 "$P6" "$SHARED/models/tinystories-656k" CLLM_DEVICE=cpu; then
        if python3 "$HERE/serve/burst.py" "http://127.0.0.1:$P6" --exact >"$tmp/burst" 2>&1; then ok
        else bad "burst on tinystories-656k: $(cat "$tmp/burst")"; fi
        kill -TERM "$S6"
        wait "$S6"
    fi
else
    skipped+=("burst of concurrent clients: python3 not installed")
fi

# ---- the real-tokenizer fixture model, SDKs and load (need node) ----
have_node=1
command -v node >/dev/null && command -v npm >/dev/null || have_node=0
if [ $have_node = 1 ] && [ ! -d "$HERE/serve/node_modules/openai" ]; then
    (cd "$HERE/serve" && npm install --no-audit --no-fund --no-package-lock >"$tmp/npm.log" 2>&1) ||
        bad "npm install in tests/serve failed: $(tail -5 "$tmp/npm.log")"
fi
if [ $have_node = 0 ]; then
    skipped+=("SDK, load, real-tokenizer model, disconnect, 429, drain and tool-call checks: node/npm not installed")
else
    node "$HERE/serve/sdk.mjs" "$B" stories260K || bad "SDK checks on stories260K"
    node "$HERE/serve/load.mjs" "$B" "$S1" 200 16 || bad "load run"

    Q="$tmp/qwen3-tiny"
    node "$HERE/serve/gen_fixture.mjs" "$SHARED" "$Q" || bad "cannot write the fixture model"
    P2=$(free_port)
    B2="http://127.0.0.1:$P2"
    # --batch 1 (strict serial): the queue-full checks below need one request
    # running while the next waits. The drain at the end waits up to 600 s
    # for its request, as its client does (the default 120 s cancelled it
    # under ASan on a loaded 2-core machine).
    if start S2 "$P2" "$Q" CLLM_MAX_QUEUE=1 CLLM_SHUTDOWN_TIMEOUT_MS=600000 -- --batch 1; then
        node "$HERE/serve/sdk.mjs" "$B2" qwen3-tiny || bad "SDK checks on the qwen3 fixture"
        # prompt tokens = the chat template rendered by cllm template, tokenized
        printf '[{"role":"user","content":"Hello there"}]' >"$tmp/m.json"
        want=$("$CLLM" template "$Q" --messages "$tmp/m.json" | "$CLLM" tokenize "$Q" --no-special --json - | jq '.ids | length')
        call /v1/chat/completions '{"messages":[{"role":"user","content":"Hello there"}],"max_tokens":3}' "$B2"
        check '[ "$code" = 200 ] && [ "$(jq .usage.prompt_tokens <<<"$body")" = "$want" ]' "templated prompt tokens: want $want, $body"
        check 'curl -s $B2/stats | jq -e ".generation_config.temperature == 0.6 and .generation_config.top_k == 20" >/dev/null' "generation_config.json not read"
        # enable_thinking: chat_template_kwargs and reasoning_effort "none" render the same prompt
        call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":1,"chat_template_kwargs":{"enable_thinking":false}}' "$B2"
        off=$(jq .usage.prompt_tokens <<<"$body")
        call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":1,"reasoning_effort":"none"}' "$B2"
        off2=$(jq .usage.prompt_tokens <<<"$body")
        call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":1}' "$B2"
        on=$(jq .usage.prompt_tokens <<<"$body")
        check '[ "$off" = "$off2" ] && [ "$off" != "$on" ]' "enable_thinking precedence: kwargs $off, effort none $off2, default $on"

        # tool_choice forcing a call (the real Qwen3 template's format, a
        # random-weight model): named in each API's shape gives exactly
        # one call of that tool with arguments valid under its schema;
        # "required" with parallel calls off, one call of some tool
        TT='[{"type":"function","function":{"name":"set_mood","parameters":{"type":"object","properties":{"mood":{"enum":["happy","sad"]}},"required":["mood"],"additionalProperties":false}}},{"type":"function","function":{"name":"flag","parameters":{"type":"object","properties":{"x":{"type":"boolean"}},"required":["x"],"additionalProperties":false}}}]'
        NT='{"messages":[{"role":"user","content":"Set the mood"}],"max_tokens":200,"temperature":0,"reasoning_effort":"none","tools":'"$TT"
        call /v1/chat/completions "$NT"',"tool_choice":{"type":"function","function":{"name":"set_mood"}}}' "$B2"
        check '[ "$code" = 200 ] && jq -e ".choices[0].finish_reason == \"tool_calls\" and (.choices[0].message.tool_calls | length == 1) and .choices[0].message.tool_calls[0].function.name == \"set_mood\" and (.choices[0].message.tool_calls[0].function.arguments | fromjson | .mood == \"happy\" or .mood == \"sad\")" <<<"$body" >/dev/null' "chat tool_choice named: $code $body"
        call /v1/chat/completions "$NT"',"tool_choice":"required","parallel_tool_calls":false}' "$B2"
        check '[ "$code" = 200 ] && jq -e ".choices[0].finish_reason == \"tool_calls\" and (.choices[0].message.tool_calls | length == 1) and (.choices[0].message.content == null)" <<<"$body" >/dev/null' "chat tool_choice required, one call: $code $body"
        call /v1/messages '{"messages":[{"role":"user","content":"Set the mood"}],"max_tokens":200,"temperature":0,"thinking":{"type":"disabled"},"tools":[{"name":"flag","input_schema":{"type":"object","properties":{"x":{"type":"boolean"}},"required":["x"],"additionalProperties":false}},{"name":"other","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"flag"}}' "$B2"
        check '[ "$code" = 200 ] && jq -e ".stop_reason == \"tool_use\" and ([.content[] | select(.type == \"tool_use\")] | length == 1) and (.content[] | select(.type == \"tool_use\") | .name == \"flag\" and (.input.x | type == \"boolean\"))" <<<"$body" >/dev/null' "messages tool_choice tool: $code $body"
        call /v1/responses '{"input":"Set the mood","max_output_tokens":200,"temperature":0,"reasoning":{"effort":"none"},"tools":[{"type":"function","name":"set_mood","parameters":{"type":"object","properties":{"mood":{"enum":["happy","sad"]}},"required":["mood"],"additionalProperties":false}}],"tool_choice":{"type":"function","name":"set_mood"}}' "$B2"
        check '[ "$code" = 200 ] && jq -e "[.output[] | select(.type == \"function_call\")] | length == 1 and .[0].name == \"set_mood\"" <<<"$body" >/dev/null' "responses tool_choice function: $code $body"
        call /v1/chat/completions "$NT"',"tool_choice":{"type":"function","function":{"name":"rm"}}}' "$B2"
        check '[ "$code" = 400 ] && jq -e ".error.param == \"tool_choice\" and (.error.message | test(\"no tool named\"))" <<<"$body" >/dev/null' "named tool not in tools: $code $body"
        call /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"tool_choice":"required"}' "$B2"
        check '[ "$code" = 400 ] && jq -e ".error.message | test(\"no .tools.\")" <<<"$body" >/dev/null' "required without tools: $code $body"
        call /v1/chat/completions "$NT"',"tool_choice":"required","response_format":{"type":"json_object"}}' "$B2"
        check '[ "$code" = 400 ] && jq -e ".error.message | test(\"cannot be combined\")" <<<"$body" >/dev/null' "required with response_format: $code $body"

        long='{"messages":[{"role":"user","content":"Hi"}],"max_tokens":7000,"ignore_eos":true,"temperature":0'
        # a client that disconnects mid-stream frees its slot at once
        curl -sN -m 60 "$B2/v1/chat/completions" -d "$long,\"stream\":true}" >"$tmp/cut" 2>/dev/null &
        cpid=$!
        wait_stats "$B2" '.running == 1' 10 && sleep 0.3
        check '[ -s "$tmp/cut" ]' "no stream bytes before the disconnect"
        d0=$(curl -s "$B2/stats" | jq .http.disconnects)
        kill "$cpid" 2>/dev/null; wait "$cpid" 2>/dev/null
        check 'wait_stats "$B2" ".running == 0 and .http.in_flight == 0" 3' "slot not freed after a disconnect: $(curl -s "$B2/stats" | jq -c '{running,http}')"
        check '[ "$(curl -s "$B2/stats" | jq .http.disconnects)" -gt "$d0" ]' "disconnect not counted"
        # the same for a non-streaming request
        curl -s -m 60 "$B2/v1/chat/completions" -d "$long}" >/dev/null 2>&1 &
        cpid=$!
        wait_stats "$B2" '.running == 1' 10 && sleep 0.2
        kill "$cpid" 2>/dev/null; wait "$cpid" 2>/dev/null
        check 'wait_stats "$B2" ".running == 0 and .http.in_flight == 0" 3' "slot not freed after a non-stream disconnect"

        # 429 when the queue (CLLM_MAX_QUEUE=1) is full, before any stream bytes
        curl -s -m 60 "$B2/v1/chat/completions" -d "$long}" >/dev/null 2>&1 &
        c1=$!
        wait_stats "$B2" '.running == 1' 10
        curl -s -m 60 "$B2/v1/chat/completions" -d "$long}" >/dev/null 2>&1 &
        c2=$!
        wait_stats "$B2" '.queue.waiting == 1' 10
        call /v1/chat/completions "$long,\"stream\":true}" "$B2"
        check '[ "$code" = 429 ] && jq -e "$oai and .error.code == \"rate_limit_exceeded\"" <<<"$body" >/dev/null' "queue full (openai): $code $body"
        call /v1/messages '{"max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}' "$B2"
        check '[ "$code" = 429 ] && jq -e "$ant and .error.type == \"rate_limit_error\"" <<<"$body" >/dev/null' "queue full (anthropic): $code $body"
        kill "$c1" "$c2" 2>/dev/null; wait "$c1" "$c2" 2>/dev/null
        check 'wait_stats "$B2" ".running == 0 and .queue.waiting == 0 and .http.in_flight == 0" 5' "queue did not drain after disconnects"

        # SIGTERM: stop accepting, finish the request in flight, exit 0
        # (long enough that the SIGTERM below always finds it running,
        # however slowly a loaded machine polls /stats; curl waits as long
        # as an ASan build on a loaded machine needs for its 3000 tokens,
        # which took it past 60 s)
        curl -s -m 600 -o "$tmp/drain" "$B2/v1/chat/completions" \
            -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":3000,"ignore_eos":true,"temperature":0}' &
        cpid=$!
        wait_stats "$B2" '.running == 1' 10
        kill -TERM "$S2"
        sleep 0.2
        code=$(curl -s -m 2 -o /dev/null -w '%{http_code}' "$B2/health")
        check '[ "$code" != 200 ]' "new connections still accepted while draining ($code)"
        wait "$cpid"
        check 'jq -e ".choices[0].finish_reason == \"length\" and .usage.completion_tokens == 3000" "$tmp/drain" >/dev/null' "in-flight request not finished by the drain: $(head -c 300 "$tmp/drain")"
        wait "$S2"
        rc=$?
        check '[ $rc -eq 0 ] && grep -q "draining 1 in flight" "$tmp/log.$P2"' "SIGTERM exit status $rc: $(tail -3 "$tmp/log.$P2")"
    fi

    # shutdown timeout: what is still running is cancelled, the server exits 0
    P3=$(free_port)
    B3="http://127.0.0.1:$P3"
    if start S3 "$P3" "$Q" CLLM_SHUTDOWN_TIMEOUT_MS=300; then
        curl -sN -m 60 -o "$tmp/cut3" "$B3/v1/chat/completions" -d "$long,\"stream\":true}" &
        cpid=$!
        wait_stats "$B3" '.running == 1' 10
        kill -TERM "$S3"
        wait "$S3"
        rc=$?
        wait "$cpid"
        check '[ $rc -eq 0 ] && grep -q "cancelling 1" "$tmp/log.$P3"' "shutdown timeout exit $rc: $(tail -3 "$tmp/log.$P3")"
        check 'grep -q "shutting down" "$tmp/cut3" && ! grep -q "DONE" "$tmp/cut3"' "cancelled stream does not end in an error event: $(tail -c 300 "$tmp/cut3")"
    fi

    # tool calls and reasoning: a fixture that always writes one known turn
    # (tools.mjs), its ids from the real tokenizer; the first is the
    # generation prompt's last
    turn='<think>Checking.</think>Sure!<tool_call>{"name":"get_weather","arguments":{"days":3}}</tool_call><|im_end|>'
    printf '[{"role":"user","content":"Weather?"}]' >"$tmp/w.json"
    last=$("$CLLM" template "$Q" --messages "$tmp/w.json" | "$CLLM" tokenize "$Q" --no-special --json - | jq '.ids[-1]')
    ids=$(printf '%s' "$turn" | "$CLLM" tokenize "$Q" --no-special --json - | jq -r '.ids | join(",")')
    QS="$tmp/qwen3-script"
    if node "$HERE/serve/gen_fixture.mjs" "$SHARED" "$QS" --script "$last,$ids" >"$tmp/gen.log" 2>&1; then
        P4=$(free_port)
        B4="http://127.0.0.1:$P4"
        if start S4 "$P4" "$QS"; then
            node "$HERE/serve/tools.mjs" "$B4" || bad "tool-call and reasoning checks"
            # curl: the streamed chat deltas, in order
            curl -sN -m 60 "$B4/v1/chat/completions" -d '{"messages":[{"role":"user","content":"Hello there"}],"temperature":0,"stream":true,"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]}' >"$tmp/tools.sse"
            kinds=$(sed -n 's/^data: {/{/p' "$tmp/tools.sse" | jq -r '.choices[0].delta // {} | keys[] | select(. != "role")' | uniq | tr '\n' ' ')
            check '[ "$kinds" = "content reasoning_content content tool_calls " ]' "chat stream delta kinds: $kinds"
            # reasoning tokens: those of "<think>Checking.</think>", in chat and Responses usage
            nr=$(printf '<think>Checking.</think>' | "$CLLM" tokenize "$Q" --no-special --json - | jq '.ids | length')
            call /v1/chat/completions '{"messages":[{"role":"user","content":"Hello there"}],"temperature":0}' "$B4"
            check '[ "$nr" -ge 3 ] && jq -e ".usage.completion_tokens_details.reasoning_tokens == $nr" <<<"$body" >/dev/null' "chat reasoning_tokens (want $nr): $body"
            sse_body=$(curl -sN -m 60 "$B4/v1/chat/completions" -d '{"messages":[{"role":"user","content":"Hello there"}],"temperature":0,"stream":true,"stream_options":{"include_usage":true}}')
            check 'sed -n "s/^data: {/{/p" <<<"$sse_body" | tail -1 | jq -e ".usage.completion_tokens_details.reasoning_tokens == $nr" >/dev/null' "streamed chat reasoning_tokens (want $nr)"
            call /v1/responses '{"input":"Hello there","temperature":0}' "$B4"
            check 'jq -e ".usage.output_tokens_details.reasoning_tokens == $nr" <<<"$body" >/dev/null' "responses reasoning_tokens (want $nr): $body"
        else
            bad "the scripted fixture did not start: $(tail -3 "$tmp/log.$P4")"
        fi
    else
        bad "cannot write the scripted fixture: $(cat "$tmp/gen.log")"
    fi
fi

kill -TERM "$S1"
wait "$S1"
rc=$?
check '[ $rc -eq 0 ]' "SIGTERM on an idle server: exit status $rc"

check_summary test_serve
