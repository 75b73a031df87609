#!/usr/bin/env bash
# test_llamacpp.sh - llama.cpp itself as the oracle of the GGUF formats:
# random models written by gen_model (tiny-k, qwen3; tiny-k-llama, llama:
# rows of 256, so every format's blocks divide every matrix) in each weight
# format cllm reads, with a placeholder vocabulary (llama.cpp loads no file
# without one), go through llama.cpp's own CPU build (node-llama-cpp's
# prebuilt binaries, pinned in tests/llamacpp/package.json) and through
# cllm: the greedy next token after each of 24 prompts must be the same,
# for f32 all 24, for the others at least 20: llama.cpp rounds the
# activations of those matmuls (to f16, bf16 or 8 bits) and a random
# model's logits hold near-ties (1-2 of 24 flip here), while a format
# misread (a scale's bits, a nibble's order) leaves about 1 in 1,024 the
# same.
# Without node/npm the test is skipped (exit 77). Usage: test_llamacpp.sh
# <cllm binary> (gen_model beside it) [shared dir] [fixtures dir].
set -u
CLLM=$1
GEN=$(dirname "$CLLM")/gen_model
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/check_lib.sh"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "test_llamacpp: SKIP: no node/npm to run llama.cpp with"
    exit 77
fi
if [ ! -d "$HERE/llamacpp/node_modules/node-llama-cpp" ]; then
    (cd "$HERE/llamacpp" && npm install --no-audit --no-fund --no-package-lock --ignore-scripts \
        --omit=optional >"$tmp/npm.log" 2>&1) || {
        echo "test_llamacpp: SKIP: npm install failed: $(tail -3 "$tmp/npm.log")"
        exit 77
    }
fi
# 24 prompts of 3-26 ids (a fixed LCG: the same every run)
s=7
for p in $(seq 1 24); do
    line=""
    for k in $(seq 1 $((3 + p))); do
        s=$(((s * 1103515245 + 12345) % 2147483648))
        line="$line${line:+,}$((s % 1024))"
    done
    echo "$line"
done >"$tmp/prompts"
for shape in tiny-k tiny-k-llama; do
    for dt in f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k; do
        f=$tmp/$shape-$dt.gguf
        if ! "$GEN" --shape "$shape" --dtype "$dt" --placeholder-vocab -o "$f" >"$tmp/gen.log" 2>&1; then
            bad "gen_model $shape $dt: $(cat "$tmp/gen.log")"
            continue
        fi
        want=$(node "$HERE/llamacpp/greedy_first.mjs" "$f" <"$tmp/prompts" 2>"$tmp/node.err")
        got=$(while read -r ids; do
            echo "$("$CLLM" run "$f" --prompt-ids "$ids" -n 1 --temp 0 --print-ids 2>/dev/null)"
        done <"$tmp/prompts")
        n_want=$(grep -c . <<<"$want")
        same=$(paste -d' ' <(echo "$want") <(echo "$got") | awk '$1 == $2 && $1 != "" {n++} END {print n + 0}')
        need=$([ "$dt" = f32 ] && echo 24 || echo 20)
        check '[ "$n_want" = 24 ] && [ "$same" -ge "$need" ]' "$shape $dt: $same of 24 greedy tokens as llama.cpp's (llama.cpp: $(tr '\n' ' ' <<<"$want"); cllm: $(tr '\n' ' ' <<<"$got"); $(tail -2 "$tmp/node.err"))"
        echo "$shape $dt: $same of 24 greedy tokens as llama.cpp's"
        rm -f "$f"
    done
done
# Llama 3.1's rope scaling as llama.cpp stores it (rope_freqs.weight, which
# gen_model writes from the llama3 fixture's rope_scaling): f32, all 24;
# prompts past 200 tokens, where the scaled frequencies have turned far
FIX=${3:-$HERE/fixtures}
if [ -d "$FIX/oracle/llama3" ]; then
    f=$tmp/llama3.gguf
    if "$GEN" --from-hf "$FIX/oracle/llama3" --dtype f32 --placeholder-vocab -o "$f" >"$tmp/gen.log" 2>&1; then
        for p in $(seq 1 24); do
            awk -v p="$p" 'BEGIN { for (k = 0; k < 200 + 4 * p; k++) printf "%s%d", k ? "," : "", (p * 37 + k * 5) % 1024; print "" }'
        done >"$tmp/long"
        want=$(node "$HERE/llamacpp/greedy_first.mjs" "$f" <"$tmp/long" 2>"$tmp/node.err")
        got=$(while read -r ids; do
            echo "$("$CLLM" run "$f" --prompt-ids "$ids" -n 1 --temp 0 --print-ids 2>/dev/null)"
        done <"$tmp/long")
        same=$(paste -d' ' <(echo "$want") <(echo "$got") | awk '$1 == $2 && $1 != "" {n++} END {print n + 0}')
        echo "llama3 (rope_freqs) f32: $same of 24 greedy tokens as llama.cpp's"
        check '[ "$same" = 24 ]' "llama3 rope_freqs: $same of 24 (llama.cpp: $(tr '\n' ' ' <<<"$want"); cllm: $(tr '\n' ' ' <<<"$got"); $(tail -2 "$tmp/node.err"))"
    else
        bad "gen_model --from-hf llama3: $(cat "$tmp/gen.log")"
    fi
else
    bad "no llama3 fixture under $FIX"
fi
check_summary test_llamacpp
