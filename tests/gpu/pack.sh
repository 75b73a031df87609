#!/usr/bin/env bash
# tests/gpu/pack.sh - gathers what tests/gpu/run.sh needs on a GPU machine
# that cannot build cllm (no libjansson-dev etc. there) into .carry/ (git-
# ignored): the CUDA build's binaries, the non-system shared libraries they
# link, and the sample models from ../shared. On the GPU machine:
#   .carry/bin/env.sh tests/gpu/run.sh .carry/bin .carry/shared
# Usage: tests/gpu/pack.sh [BUILD_DIR] [SHARED_DIR]
#   AB="NAME=MODULE ...": other builds' libcllm_cuda.so, gzipped into
#   .carry/ab/NAME.so.gz for tests/gpu/ab.sh (e.g. AB="old=/tmp/old/libcllm_cuda.so");
#   ABDIR="NAME=BUILD_DIR ...": another build's cllm and module (gzipped)
#   into .carry/ab/NAME/, for a change outside the module (ab.sh's
#   old=dir:.carry/ab/old);
#   PROBES=1: also builds this tree's two measurement modules (the decode
#   attention's and the staged GEMV's probes, src/backend/cuda/*_probe.cuh)
#   into build-probe-dec/ and build-probe-gemv/ and carries them gzipped as
#   .carry/probe/dec.so.gz and gemv.so.gz;
#   LINEINFO=1: also builds this tree's module with -lineinfo (the same SASS,
#   with source lines) into build-lineinfo/ and carries it as
#   .carry/probe/lineinfo.so.gz (tests/gpu/code_profile.sh's MODULE).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-cuda} SHARED=${2:-../shared}
rm -rf .carry/bin .carry/lib .carry/shared .carry/ab .carry/probe
mkdir -p .carry/bin .carry/lib .carry/shared/models
# libcllm_cuda.so (the CUDA backend module, dlopened by --device cuda) goes
# next to the binaries, where they look for it first.
cp "$BUILD/cllm" "$BUILD/test_cuda" "$BUILD/gen_model" "$BUILD/libcllm_cuda.so" .carry/bin/
# test_batch runs the batching equivalence tests on the GPU,
# test_gemv_staged the staged GEMV kernel, test_gemm_tc the tensor-core
# GEMM, test_head_pick_cuda the screened greedy head; bench_gemv, bench_gemm_tc, bench_persist, bench_kvread, bench_icache and bench_handoff time kernels alone
# (all optional; tests/gpu/perf.sh runs the benches).
for b in test_batch test_gemv_staged test_gemm_tc test_gemv_mma test_head_pick_cuda bench_gemv bench_gemm_tc bench_persist bench_kvread bench_icache bench_handoff; do [ -x "$BUILD/$b" ] && cp "$BUILD/$b" .carry/bin/; done
# libcllm_trace.so writes a kernel timeline through CUPTI (bench/cupti/);
# CUPTI itself travels too, in case the GPU machine's toolkit lacks it.
if [ -e "$BUILD/libcllm_trace.so" ]; then
    cp "$BUILD/libcllm_trace.so" bench/trace_steps.py .carry/bin/
    cp -L "$(ldd "$BUILD/libcllm_trace.so" | awk '/libcupti/ {print $3}')" .carry/lib/
fi
for lib in $(ldd "$BUILD/cllm" "$BUILD/libcllm_cuda.so" | awk '/=>/ {print $3}' | sort -u | grep -v -E 'cuda|cublas|/libc\.|/libm\.|/libdl\.|/libpthread\.|/librt\.|/libstdc\+\+|/libgcc_s'); do
    cp -L "$lib" .carry/lib/
done
cp -r "$SHARED/models/stories260K" "$SHARED/models/tinystories-656k" .carry/shared/models/
# real tokenizers for serving the random-weight bench shapes over HTTP
# (cllm serve --tokenizer; their vocabularies fit the llama3-8b / qwen3 shapes)
mkdir -p .carry/shared/tokenizers
cp -r "$SHARED/tokenizers/llama3_1" "$SHARED/tokenizers/qwen3" .carry/shared/tokenizers/
# env.sh: puts only the libraries the GPU machine lacks on LD_LIBRARY_PATH.
cat > .carry/bin/env.sh <<'EOS'
#!/usr/bin/env bash
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p /tmp/cllm-lib
cuda=""; for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib /usr/local/cuda/lib; do [ -e "$d/libcublas.so.13" ] && { cuda=$d; break; }; done; [ -n "$cuda" ] || cuda=$(dirname "$(find / -xdev -name "libcublas.so.13*" 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for m in $(ldd "$here/bin/cllm" "$here/bin/libcllm_cuda.so" $(ls "$here/bin/libcllm_trace.so" 2>/dev/null) | awk '/not found/ {print $1}' | sort -u); do ln -sf "$here/lib/$m" /tmp/cllm-lib/; done
export LD_LIBRARY_PATH="/tmp/cllm-lib:$LD_LIBRARY_PATH"
echo "libraries taken from .carry/lib: $(ls /tmp/cllm-lib | tr '\n' ' ')"
# cllm links no CUDA library; the module it dlopens for --device cuda does.
ldd "$here/bin/cllm" "$here/bin/libcllm_cuda.so" | grep -E "not found|cublas|cudart|:$" || true
exec "$@"
EOS
chmod +x .carry/bin/env.sh
for v in ${AB:-}; do
    mkdir -p .carry/ab
    gzip -c "${v#*=}" > ".carry/ab/${v%%=*}.so.gz"
done
for v in ${ABDIR:-}; do
    mkdir -p ".carry/ab/${v%%=*}"
    cp "${v#*=}/cllm" ".carry/ab/${v%%=*}/"
    gzip -c "${v#*=}/libcllm_cuda.so" > ".carry/ab/${v%%=*}/libcllm_cuda.so.gz"
done
# carry_module NAME DIR CUDA_FLAGS [C_FLAGS]: this tree's module built in
# DIR with those flags, carried gzipped as .carry/probe/NAME.so.gz
carry_module() {
    mkdir -p .carry/probe
    cmake -S . -B "$2" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS="$3" -DCMAKE_C_FLAGS="${4:-}" >/dev/null
    cmake --build "$2" -j"$(nproc)" --target cllm_cuda >/dev/null
    gzip -c "$2/libcllm_cuda.so" > ".carry/probe/$1.so.gz"
}
if [ "${PROBES:-0}" = 1 ]; then
    carry_module dec build-probe-dec -DCUK_DEC_PROBE -DCUK_DEC_PROBE
    carry_module gemv build-probe-gemv -DCUK_GEMV_PROBE -DCUK_GEMV_PROBE
fi
if [ "${LINEINFO:-0}" = 1 ]; then # the same SASS with source lines, for
    # tests/gpu/code_profile.sh (MODULE=.carry/probe/lineinfo.so.gz)
    carry_module lineinfo build-lineinfo -lineinfo
fi
du -sh .carry
