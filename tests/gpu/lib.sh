# tests/gpu/lib.sh - what the GPU scripts share (sourced; they set BIN and WORK).
# (gpu_bin_dir below needs neither.)
# gpu_model SHAPE: the path of the random-weight model of a gen_model
# shape, in DTYPE (gen_model's --dtype: bf16 unless set, e.g. q4_k), made
# in $WORK by $BIN/gen_model the first time (at most GEN_TIMEOUT seconds,
# 300); fails when gen_model does.
gpu_model() {
    local dt=${DTYPE:-bf16}
    local f="$WORK/$1-$dt.gguf"
    [ -f "$f" ] || timeout "${GEN_TIMEOUT:-300}" "$BIN/gen_model" --shape "$1" --dtype "$dt" -o "$f" >/dev/null || return 1
    echo "$f"
}

# gpu_bin_dir DIR MODULE FILE...: DIR holding FILE... (cllm and the like)
# and MODULE, gzipped or not, as the libcllm_cuda.so cllm loads from
# beside itself.
gpu_bin_dir() {
    local dir=$1 module=$2
    shift 2
    mkdir -p "$dir"
    cp "$@" "$dir/"
    case "$module" in
    *.gz) gunzip -c "$module" > "$dir/libcllm_cuda.so" ;;
    *) cp "$module" "$dir/libcllm_cuda.so" ;;
    esac
}
