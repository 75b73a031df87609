#!/usr/bin/env bash
# test_cuda_module.sh - the CUDA backend module (libcllm_cuda.so) and its
# loader in backend.c, on any machine: cllm itself links no CUDA library; a
# CPU run (and --device auto without an NVIDIA driver) never loads the
# module; --device cuda finds the module next to the binary, through
# $CLLM_CUDA_MODULE (which wins, and must exist) or at its build-time path
# and, without a GPU, fails with "no CUDA device found"; a numeric CUDA
# lever it cannot take is
# refused by name, GPU or not; a module that cannot be loaded is named with
# the loader's reason. Builds without CUDA: --device cuda says so.
# Usage: test_cuda_module.sh <cllm binary> <shared dir> <fixtures dir>
set -u
CLLM=$1 SHARED=$2
. "$(dirname "$0")/check_lib.sh"
MODEL="$SHARED/models/stories260K"
MOD="$(dirname "$CLLM")/libcllm_cuda.so"
gpu=0
ls /dev/nvidia[0-9]* /proc/driver/nvidia >/dev/null 2>&1 && gpu=1

# 1. The binary links no CUDA library.
check '! ldd "$CLLM" | grep -qE "libcudart|libcublas"' "cllm links CUDA: $(ldd "$CLLM" | grep -E 'cuda|cublas')"

if [ ! -e "$MOD" ]; then
    "$CLLM" run "$MODEL" -p Zoo -n 2 --temp 0 --device cuda >/dev/null 2>"$tmp/err"; rc=$?
    check '[ $rc -ne 0 ] && grep -q "no CUDA backend" "$tmp/err"' "no-CUDA build, --device cuda: $(cat "$tmp/err")"
    echo "test_cuda_module: no module (build without CUDA): $pass passed, $fail failed"
    [ "$fail" -eq 0 ]; exit
fi

# 2. The module exports one symbol and needs nothing from the executable.
if command -v nm >/dev/null; then
    syms=$(nm -D --defined-only "$MOD" | awk '{print $3}' | tr '\n' ' ')
    check '[ "$syms" = "cllm_cuda_module " ]' "module exports: $syms"
fi

# 2b. A numeric CUDA lever set to what it cannot take is refused by name,
#     before the device is looked for, so with or without a GPU.
for lv in CLLM_CUDA_DEC_BPS=9 CLLM_CUDA_GEMV_MAX=8x CLLM_CUDA_MMA_KS=3 CLLM_CUDA_STAGE_COLS=300 CLLM_CUDA_PF_MT=3; do
    env "$lv" "$CLLM" run "$MODEL" -p Zoo -n 2 --temp 0 --device cuda >/dev/null 2>"$tmp/err"; rc=$?
    check '[ $rc -ne 0 ] && grep -q "${lv%%=*}=\"${lv#*=}\": needs" "$tmp/err"' "$lv: $(cat "$tmp/err")"
done

# 3. CPU runs (and auto on a machine without an NVIDIA driver) never map it.
maps() { # runs cllm with args, printing the CUDA objects it had mapped at exit
    LD_DEBUG=files "$CLLM" "$@" 2>&1 >/dev/null | grep -oE "file=[^ ]*(cllm_cuda|cudart|cublas)[^ ]*" | sort -u
}
check '[ -z "$(maps run "$MODEL" -p Zoo -n 2 --temp 0)" ]' "cpu run loaded: $(maps run "$MODEL" -p Zoo -n 2 --temp 0)"
if [ "$gpu" = 0 ]; then
    out=$("$CLLM" run "$MODEL" -p Zoo -n 5 --temp 0 --device auto 2>/dev/null)
    check '[[ "$out" == "Zoo was"* ]]' "auto without a GPU: got '$out'"
    check '[ -z "$(maps run "$MODEL" -p Zoo -n 2 --temp 0 --device auto)" ]' "auto without a GPU loaded the module"

    # 4. --device cuda loads the module (next to the binary) and says why not.
    "$CLLM" run "$MODEL" -p Zoo -n 2 --temp 0 --device cuda >/dev/null 2>"$tmp/err"; rc=$?
    check '[ $rc -ne 0 ] && grep -q "no CUDA device found" "$tmp/err"' "--device cuda without a GPU: $(cat "$tmp/err")"
    check '[ -n "$(maps run "$MODEL" -p Zoo -n 2 --device cuda)" ]' "--device cuda did not load the module"

    # 5. A binary away from the module finds it through $CLLM_CUDA_MODULE
    #    or the build-time path; an unloadable module is named with the reason.
    mkdir -p "$tmp/bin" && cp "$CLLM" "$tmp/bin/cllm"
    CLLM_CUDA_MODULE="$MOD" "$tmp/bin/cllm" run "$MODEL" -p Zoo -n 2 --device cuda >/dev/null 2>"$tmp/err"
    check 'grep -q "no CUDA device found" "$tmp/err"' "CLLM_CUDA_MODULE: $(cat "$tmp/err")"
    "$tmp/bin/cllm" run "$MODEL" -p Zoo -n 2 --device cuda >/dev/null 2>"$tmp/err"
    check 'grep -q "no CUDA device found" "$tmp/err"' "build-time path: $(cat "$tmp/err")"
    echo "not a library" >"$tmp/bad.so"
    CLLM_CUDA_MODULE="$tmp/bad.so" "$tmp/bin/cllm" run "$MODEL" -p Zoo -n 2 --device cuda >/dev/null 2>"$tmp/err"; rc=$?
    check '[ $rc -ne 0 ] && grep -q "CUDA backend module $tmp/bad.so cannot be loaded" "$tmp/err"' "bad module: $(cat "$tmp/err")"
    # 6. $CLLM_CUDA_MODULE wins over the module next to the binary: the
    #    one named on purpose is the one loaded (here, and named as
    #    unusable), and one that is missing is an error, not the other.
    CLLM_CUDA_MODULE="$tmp/bad.so" "$CLLM" run "$MODEL" -p Zoo -n 2 --device cuda >/dev/null 2>"$tmp/err"; rc=$?
    check '[ $rc -ne 0 ] && grep -q "CUDA backend module $tmp/bad.so cannot be loaded" "$tmp/err"' "CLLM_CUDA_MODULE beside a module: $(cat "$tmp/err")"
    CLLM_CUDA_MODULE="$tmp/missing.so" "$CLLM" run "$MODEL" -p Zoo -n 2 --device cuda >/dev/null 2>"$tmp/err"; rc=$?
    check '[ $rc -ne 0 ] && grep -q "CUDA backend module $tmp/missing.so (CLLM_CUDA_MODULE) not found" "$tmp/err"' "CLLM_CUDA_MODULE missing: $(cat "$tmp/err")"
fi

check_summary test_cuda_module
