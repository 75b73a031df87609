#!/usr/bin/env bash
# tests/gpu/ab.sh - A/B of CUDA backend builds in one device call: `cllm
# bench` runs of each variant, alternating (A B A B ...), on the same model
# files, then each variant's mean. Device calls land on different machines
# whose speed differs by a few percent, so only runs of one call compare.
# Usage: tests/gpu/ab.sh BIN_DIR NAME=MODULE_OR_ENV ... 
#   BIN_DIR: cllm, gen_model (tests/gpu/pack.sh's .carry/bin);
#   each variant NAME=SPEC, SPEC either a libcllm_cuda.so (optionally .gz)
#   to load instead of BIN_DIR's, or env:VAR=VALUE[,VAR=VALUE] with
#   BIN_DIR's module (e.g. base=env:CLLM_CUDA_GEMV_STAGED=1 off=env:CLLM_CUDA_GEMV_STAGED=0),
#   or dir:DIR, a directory with its own cllm and libcllm_cuda.so[.gz]
#   (another build's binaries, for changes outside the module: pack.sh's
#   ABDIR); a module or dir: spec may end in +env:VAR=VALUE[,...] to run
#   it with those variables (e.g. new=.carry/ab/new.so.gz+env:CLLM_CUDA_STAGE_KB=176).
#   SHAPES: gen_model shapes (default "llama3-8b qwen3-0.6b"); DTYPE: their
#   weights' gen_model --dtype (bf16; e.g. q4_k for GGUF's formats); ROUNDS (2);
#   ARGS: the bench arguments (default "-p 512 -n 64"); WORK: model files;
#   SHOW: an extended regex of further output lines to print (a probe
#   build's report: SHOW='probe|^  ').
# Prints one line per run ("shape variant decode tok/s [batch lines]") and
# a summary per shape: each variant's mean decode tok/s; METRIC=prefill
# compares the prefill row instead (e.g. ARGS="-p 32768 -n 4"). A probe build
# (tests/gpu/pack.sh with PROBES=1) is a variant like any other:
#   tests/gpu/ab.sh .carry/bin gemv=.carry/probe/gemv.so.gz
set -uo pipefail
BIN=${1:?BIN_DIR}
shift
[ $# -ge 1 ] || { echo "usage: $0 BIN_DIR NAME=SPEC ..." >&2; exit 2; }
WORK=${WORK:-/tmp/cllm-gpu}
. "$(dirname "$0")/lib.sh" # gpu_model, gpu_bin_dir
SHAPES=${SHAPES:-llama3-8b qwen3-0.6b} ROUNDS=${ROUNDS:-2} ARGS=${ARGS:--p 512 -n 64}
mkdir -p "$WORK/ab"
names=() envs=() dirs=()
for v in "$@"; do
    name=${v%%=*} spec=${v#*=}
    [ -n "$name" ] && [ "$name" != "$v" ] || { echo "ab: '$v' is not NAME=SPEC" >&2; exit 2; }
    dir="$BIN" env=""
    case "$spec" in
    *+env:*) env=${spec#*+env:} spec=${spec%%+env:*} ;;
    esac
    case "$spec" in
    env:*) env="${env:+$env,}${spec#env:}" ;;
    dir:*)
        src=${spec#dir:} mod=${spec#dir:}/libcllm_cuda.so
        [ -f "$mod" ] || mod=$mod.gz
        [ -x "$src/cllm" ] && [ -f "$mod" ] ||
            { echo "ab: $src has no cllm and libcllm_cuda.so" >&2; exit 2; }
        dir="$WORK/ab/$name"
        gpu_bin_dir "$dir" "$mod" "$src/cllm"
        ;;
    *)
        [ -f "$spec" ] || { echo "ab: no module $spec" >&2; exit 2; }
        dir="$WORK/ab/$name"
        gpu_bin_dir "$dir" "$spec" "$BIN/cllm"
        ;;
    esac
    names+=("$name") envs+=("$env") dirs+=("$dir")
done
declare -A sum cnt
for shape in $SHAPES; do
    f=$(gpu_model "$shape") || exit 1
    for ((r = 0; r < ROUNDS; r++)); do
        for i in "${!names[@]}"; do
            # shellcheck disable=SC2086
            out=$(env ${envs[$i]//,/ } timeout 300 "${dirs[$i]}/cllm" bench "$f" --device cuda $ARGS 2>&1)
            dec=$(echo "$out" | awk -v m="${METRIC:-decode}" '$1 == m {print $3; exit}')
            bat=$(echo "$out" | awk '/^batch/ {printf " | batch %s %s", $2, $4}')
            echo "$shape ${names[$i]} ${METRIC:-decode} ${dec:-FAILED}$bat"
            [ -n "${SHOW:-}" ] && echo "$out" | grep -E "$SHOW"
            if [ -n "$dec" ]; then
                k="$shape ${names[$i]}"
                sum[$k]=$(awk -v a="${sum[$k]:-0}" -v b="$dec" 'BEGIN {print a + b}')
                cnt[$k]=$(( ${cnt[$k]:-0} + 1 ))
            fi
        done
    done
done
echo "== mean ${METRIC:-decode} tok/s"
for shape in $SHAPES; do
    line="$shape:"
    for n in "${names[@]}"; do
        k="$shape $n"
        if [ "${cnt[$k]:-0}" -gt 0 ]; then
            line+=" $n $(awk -v s="${sum[$k]}" -v c="${cnt[$k]}" 'BEGIN {printf "%.1f", s / c}')"
        else
            line+=" $n FAILED"
        fi
    done
    echo "$line"
done
