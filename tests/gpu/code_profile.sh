#!/usr/bin/env bash
# tests/gpu/code_profile.sh - the code each decode kernel runs after its
# programmatic-dependent-launch wait, which is fetched again at each launch
# and is on the step's critical path (docs/benchmarks.md, eleventh pass):
# ncu's executed-instruction counts (SourceCounters) of one decode layer's
# kernels, summed by bench/sass_lines.py per kernel and, from `nvdisasm -g`
# of the module's own cubins, per source line.
# Usage: tests/gpu/code_profile.sh BIN_DIR [SHAPE]
#   SHAPE: a gen_model shape (default qwen3-0.6b); COUNT: kernels profiled
#   (6: a layer's); SKIP: launches skipped first (600: well into decode);
#   TOP: source lines per kernel (12); MODULE: a libcllm_cuda.so (.gz
#   allowed) to profile instead of BIN_DIR's. Source lines need a module
#   built with -lineinfo (the same SASS): tests/gpu/pack.sh with LINEINFO=1
#   carries one, MODULE=.carry/probe/lineinfo.so.gz.
set -uo pipefail
BIN=$(cd "${1:?BIN_DIR}" && pwd) SHAPE=${2:-qwen3-0.6b}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-/tmp/cllm-gpu}
. "$(dirname "$0")/lib.sh" # gpu_model, gpu_bin_dir
mkdir -p "$WORK"
for t in ncu cuobjdump nvdisasm python3; do
    command -v $t >/dev/null || { echo "code_profile: no $t"; exit 1; }
done
if [ -n "${MODULE:-}" ]; then # cllm loads the module next to it
    [ -f "$MODULE" ] || { echo "code_profile: no module $MODULE"; exit 1; }
    gpu_bin_dir "$WORK/code_bin" "$MODULE" "$BIN/cllm" "$BIN/gen_model"
    BIN="$WORK/code_bin"
fi
f=$(gpu_model "$SHAPE") || exit 1
rep="$WORK/code_$SHAPE"
ncu --clock-control none --kernel-name regex:"k_attention_dec|k_gemv" --launch-skip "${SKIP:-600}" \
    --launch-count "${COUNT:-6}" --section SourceCounters --section WarpStateStats -f -o "$rep" \
    "$BIN/cllm" bench "$f" --device cuda -p 512 -n 16 >/dev/null 2>&1
[ -f "$rep.ncu-rep" ] || { echo "code_profile: ncu wrote no report"; exit 1; }
ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2>/dev/null
cub="$WORK/code_cubins"
rm -rf "$cub" && mkdir -p "$cub"
(cd "$cub" && cuobjdump -xelf all "$BIN/libcllm_cuda.so" >/dev/null 2>&1)
for c in "$cub"/*.cubin; do nvdisasm -g "$c"; done > "$rep.sass" 2>/dev/null
python3 "$ROOT/bench/sass_lines.py" "$rep.csv" --sass "$rep.sass" --top "${TOP:-12}"
