# tests/gpu/lib.sh - what the GPU scripts share (sourced; they set BIN and WORK).
# gpu_model SHAPE: the path of the random-weight bf16 model of a gen_model
# shape, made in $WORK by $BIN/gen_model the first time (at most
# GEN_TIMEOUT seconds, 300); fails when gen_model does.
gpu_model() {
    local f="$WORK/$1-bf16.gguf"
    [ -f "$f" ] || timeout "${GEN_TIMEOUT:-300}" "$BIN/gen_model" --shape "$1" --dtype bf16 -o "$f" >/dev/null || return 1
    echo "$f"
}
