/* test_quant_dq_emu.cpp - the device's widening of GGUF's low-bit blocks
 * (src/backend/cuda/quant_dq.cuh, cuk_dq8) run on the host through
 * tests/emu/cuda_emu.h: for every format, on blocks of random bytes (any
 * scale, code and bit pattern; f16 fields kept finite), every 8-value
 * piece of a row must have the bits of the host's quant_dequantize_row,
 * which test_gguf and test_llamacpp hold to llama.cpp's. So the kernels'
 * dequantization is checked where there is no GPU. */
#include "emu/cuda_emu.h"

#include "base/half.h"
extern "C" {
#include "model/tensor.h" /* before quant_dq.cuh, with C linkage */
}

/* what quant_dq.cuh takes from the vector types, cuda_fp16.h and the
 * load intrinsics */
struct uint2 {
    unsigned x, y;
};
template <typename T> static inline T __ldg(const T *p) { return *p; }
static inline uint16_t __ushort_as_half(unsigned short u) { return u; }
static inline float __half2float(uint16_t h) { return f16_to_f32(h); }
static inline float __fadd_rn(float a, float b) { return a + b; }

#include "backend/cuda/quant_dq.cuh"

extern "C" {
#include "model/quant.h"
#include "testutil.h"
}

static uint64_t rs = 0x243F6A8885A308D3ULL;
static uint32_t rnd()
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 32);
}

/* A finite f16 of moderate size (exponent 5..24: 2^-10 .. 2^9), either sign. */
static uint16_t rand_f16()
{
    return (uint16_t)((rnd() & 0x8000u) | ((5 + rnd() % 20) << 10) | (rnd() & 0x3FFu));
}

/* Byte offsets of a block's f16 fields (d, and dmin / m where it has one). */
static void f16_fields(enum dtype dt, int *a, int *b)
{
    *a = *b = -1;
    switch (dt) {
    case DT_Q4_0: case DT_Q5_0: *a = 0; break;
    case DT_Q4_1: case DT_Q5_1: case DT_Q4_K: case DT_Q5_K: *a = 0; *b = 2; break;
    case DT_Q6_K: *a = 208; break;
    case DT_Q2_K: *a = 80; *b = 82; break;
    case DT_Q3_K: *a = 108; break;
    default: break;
    }
}

template <int DT> static void piece(const uint8_t *row, int c, float *v) { cuk_dq8<DT>(row, c, v); }

int main()
{
    const enum dtype dts[] = {DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q4_K,
                              DT_Q5_K, DT_Q6_K, DT_Q2_K, DT_Q3_K};
    for (enum dtype dt : dts) {
        const int be = cuk_q_block_elems(dt), bb = cuk_q_block_bytes(dt);
        CHECK(be == (int)dtype_block_elems(dt) && (size_t)bb == dtype_row_bytes(dt, be),
              "%s: block of %d values, %d bytes", dtype_name(dt), be, bb);
        const int cols = be * 12, rows = 40;
        const size_t rb = dtype_row_bytes(dt, cols);
        CHECK(cuk_q_row_bytes(dt, cols) == rb, "%s: row bytes", dtype_name(dt));
        std::vector<uint8_t> w(rb * rows);
        for (auto &x : w)
            x = (uint8_t)rnd();
        int fa, fb;
        f16_fields(dt, &fa, &fb);
        for (size_t blk = 0; blk < w.size() / bb; blk++)
            for (int off : {fa, fb})
                if (off >= 0) {
                    uint16_t h = rand_f16();
                    memcpy(&w[blk * bb + off], &h, 2);
                }
        std::vector<float> ref(cols), got(cols);
        int bad = 0, any = 0;
        for (int r = 0; r < rows; r++) {
            const uint8_t *row = w.data() + (size_t)r * rb;
            quant_dequantize_row(dt, row, ref.data(), cols);
            for (int c = 0; c < cols; c += 8) {
                if (r % 2)
                    cuk_dq8_any(dt, row, c, &got[c]);
                else
                    switch (dt) { /* the kernels' compile-time form */
                    case DT_Q4_0: piece<DT_Q4_0>(row, c, &got[c]); break;
                    case DT_Q4_1: piece<DT_Q4_1>(row, c, &got[c]); break;
                    case DT_Q5_0: piece<DT_Q5_0>(row, c, &got[c]); break;
                    case DT_Q5_1: piece<DT_Q5_1>(row, c, &got[c]); break;
                    case DT_Q4_K: piece<DT_Q4_K>(row, c, &got[c]); break;
                    case DT_Q5_K: piece<DT_Q5_K>(row, c, &got[c]); break;
                    case DT_Q6_K: piece<DT_Q6_K>(row, c, &got[c]); break;
                    case DT_Q2_K: piece<DT_Q2_K>(row, c, &got[c]); break;
                    default: piece<DT_Q3_K>(row, c, &got[c]); break;
                    }
            }
            for (int c = 0; c < cols; c++) {
                bad += memcmp(&got[c], &ref[c], 4) != 0;
                any += ref[c] != 0.0f;
            }
        }
        CHECK(bad == 0 && any > rows * cols / 2, "%s: %d of %d values differ from "
              "quant_dequantize_row's bits (%d non-zero)", dtype_name(dt), bad, rows * cols, any);
        printf("%s: %d values, device widening == host widening: %s\n", dtype_name(dt),
               rows * cols, bad ? "no" : "yes");
    }
    return test_summary("test_quant_dq_emu");
}
