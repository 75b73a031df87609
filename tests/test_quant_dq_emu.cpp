/* test_quant_dq_emu.cpp - the device's reading of GGUF's low-bit blocks
 * run on the host through tests/emu/cuda_emu.h, for every format, on
 * blocks of random bytes (any scale, code and bit pattern; f16 fields kept
 * finite), against the host's quant_dequantize_row, which test_gguf and
 * test_llamacpp hold to llama.cpp's:
 *   - quant_dq.cuh's widening (cuk_dq8): every 8-value piece of a row has
 *     the host's bits;
 *   - quant_dot.cuh's integer units (gd_load): every value's code, scale
 *     and min give the host's value to the bit (s * code - m), at the
 *     column gd_perm and gd_block say, and a unit's byte dot product
 *     (gd_dot) against 8-bit activations matches a double product;
 *   - qmma_dq.cuh's reading of Q4_K, Q5_K and Q6_K (the tensor-core GEMV on the
 *     blocks): every value's 128 + q pair and its group's d1 (Q6_K: its 16
 *     values' d sc) give the host's bits.
 * So the kernels' reading of the blocks is checked where there is no GPU. */
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
struct uint4 {
    unsigned x, y, z, w;
};
struct float2 {
    float x, y;
};
struct float4 {
    float x, y, z, w;
};
static inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w)
{
    return {x, y, z, w};
}
static inline float2 make_float2(float x, float y) { return {x, y}; }
template <typename T> static inline T __ldg(const T *p) { return *p; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline uint16_t __ushort_as_half(unsigned short u) { return u; }
static inline float __half2float(uint16_t h) { return f16_to_f32(h); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __int_as_float(int i) { return __uint_as_float((unsigned)i); }
/* result byte i = byte (s >> 4i) & 7 of the eight bytes of a (0-3) and b (4-7) */
static inline unsigned __byte_perm(unsigned a, unsigned b, unsigned s)
{
    const uint64_t x = (uint64_t)b << 32 | a;
    unsigned r = 0;
    for (int i = 0; i < 4; i++)
        r |= (unsigned)((x >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}
/* per byte: a - b modulo 256; the sum of the signed bytes' products, plus c */
static inline unsigned __vsub4(unsigned a, unsigned b)
{
    unsigned r = 0;
    for (int i = 0; i < 4; i++)
        r |= ((((a >> (8 * i)) & 0xFF) - ((b >> (8 * i)) & 0xFF)) & 0xFF) << (8 * i);
    return r;
}
/* the low word of (hi:lo) >> sh, sh taken mod 32 (_r) or at most 32 (_rc) */
static inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned sh)
{
    return (unsigned)((((uint64_t)hi << 32) | lo) >> (sh & 31));
}
static inline unsigned __funnelshift_rc(unsigned lo, unsigned hi, unsigned sh)
{
    return (unsigned)((((uint64_t)hi << 32) | lo) >> (sh < 32 ? sh : 32));
}
static inline int __dp4a(int a, int b, int c)
{
    for (int i = 0; i < 4; i++)
        c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}

#include "backend/cuda/quant_dot.cuh"
#include "backend/cuda/quant_dq.cuh"
#include "backend/cuda/qmma_dq.cuh"

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
    case DT_Q4_0: case DT_Q5_0: case DT_Q8_0: *a = 0; break;
    case DT_Q4_1: case DT_Q5_1: case DT_Q4_K: case DT_Q5_K: *a = 0; *b = 2; break;
    case DT_Q6_K: *a = 208; break;
    case DT_Q2_K: *a = 80; *b = 82; break;
    case DT_Q3_K: *a = 108; break;
    default: break;
    }
}

template <int DT> static void piece(const uint8_t *row, int c, float *v) { cuk_dq8<DT>(row, c, v); }

/* The lane and word (0..7) of a step's staged slot (gd_slot's inverse). */
static int slot_lane(int slot) { return slot % 128 / 4; }
static int slot_word(int slot) { return 4 * (slot / 128) + slot % 4; }

/* Every column of a step goes to one word of one lane (gd_perm is one to
 * one, and gd_slot too), and the lane reads its group's activation scale
 * from that column's 32-block (gd_block). */
template <int SHAPE> static void check_perm(const char *name)
{
    constexpr int G = SHAPE == GD_NIB16 ? 1 : SHAPE == GD_QUARTER ? 4 : 2;
    int seen[GD_STEP / 4] = {0}, bad = 0;
    for (int r = 0; r < GD_STEP; r += 4) {
        const int w = gd_perm<SHAPE>(r);
        if (w < 0 || w >= GD_STEP / 4) {
            bad++;
            continue;
        }
        seen[w]++;
        bad += gd_slot(slot_lane(w), slot_word(w)) != w;
        bad += gd_block<SHAPE>(slot_lane(w), slot_word(w) / (8 / G)) != r / 32;
    }
    for (int w = 0; w < GD_STEP / 4; w++)
        bad += seen[w] != 1;
    CHECK(bad == 0, "gd_perm %s: %d columns misplaced", name, bad);
}

/* A row's units against the host's widening ref (cols values): each
 * value's s * code - m has ref's bits; and each unit's gd_dot against x
 * (8-bit codes xq in gd_perm's order, scales xd a 32-block) is the double
 * product of ref and the codes' values within 1e-5 of its magnitude.
 * Returns the values that differ; *dot_bad counts units off. */
template <int DT>
static int check_units(const uint8_t *row, const uint16_t *srow, const float *ref, int cols,
                       const uint32_t *xq, const float *xd, int *dot_bad)
{
    using F = gd_fmt<DT>;
    int bad = 0;
    const int units = (cols + GD_STEP - 1) / GD_STEP * 32;
    for (int u = 0; u < units; u++) {
        /* as k_gemv_qdot loads them: past the row's last unit, the last
         * unit again (Q8_0: each half clamped in the row by gd_load) */
        const int ul = F::SHAPE == GD_BYTES ? u : min(u, cols / 32 - 1);
        gd_unit w;
        gd_load<DT>(row, srow, ul, cols, w);
        const int step = u / 32, lane = u % 32;
        double want = 0, mag = 0;
        for (int r = 0; r < GD_STEP; r += 4) {
            const int wd = gd_perm<F::SHAPE>(r);
            const int c = step * GD_STEP + r;
            if (slot_lane(wd) != lane || c >= cols)
                continue;
            const int i = slot_word(wd), g = i / F::PER;
            for (int e = 0; e < 4; e++) {
                const int code = F::MIN ? (int)((w.q[i] >> (8 * e)) & 0xFF) : (int)(int8_t)(w.q[i] >> (8 * e));
                const float v = F::MIN ? w.s[g] * (float)code - w.m[g] : w.s[g] * (float)code;
                bad += memcmp(&v, &ref[c + e], 4) != 0;
                const double xv = (double)xd[(c + e) / 32] * (int8_t)(xq[step * (GD_STEP / 4) + wd] >> (8 * e));
                want += (double)ref[c + e] * xv;
                mag += fabs((double)ref[c + e] * xv);
            }
        }
        int x[8], sums[4] = {0, 0, 0, 0};
        float dx[4] = {0, 0, 0, 0};
        for (int i = 0; i < 8; i++)
            x[i] = (int)xq[step * (GD_STEP / 4) + gd_slot(lane, i)];
        for (int g = 0; g < F::G; g++)
            dx[g] = xd[step * (GD_STEP / 32) + gd_block<F::SHAPE>(lane, g)];
        if (F::MIN)
            gd_sums<DT>(x, sums);
        const double got = gd_dot<DT>(w, x, dx, sums);
        *dot_bad += !(fabs(got - want) <= 1e-5 * mag + 1e-30);
    }
    return bad;
}

/* x rounded to 8 bits a 32-block as k_gemv_qdot stages it (gd_quant4 at
 * absmax / 127), into words in gd_perm's order and a scale a block. */
template <int SHAPE>
static void stage_x(const float *x, int cols, uint32_t *xq, float *xd)
{
    const int padded = (cols + GD_STEP - 1) / GD_STEP * GD_STEP;
    memset(xq, 0, (size_t)padded);
    memset(xd, 0, sizeof(float) * (size_t)(padded / 32));
    for (int b = 0; b < cols / 32; b++) {
        float a = 0.0f;
        for (int i = 0; i < 32; i++)
            a = fmaxf(a, fabsf(x[32 * b + i]));
        const float d = a / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        xd[b] = d;
        for (int c = 32 * b; c < 32 * b + 32; c += 4)
            xq[(c / GD_STEP) * (GD_STEP / 4) + gd_perm<SHAPE>(c % GD_STEP)] =
                gd_quant4(x[c], x[c + 1], x[c + 2], x[c + 3], id);
    }
}

/* row: the file's blocks; Q8_0 is read as the device keeps it (values,
 * then a table of scales: cuk_q8_repack's layout), rebuilt here. */
template <int DT>
static int units_row(const uint8_t *row, const float *ref, int cols, const float *x, int *dot_bad)
{
    const int padded = (cols + GD_STEP - 1) / GD_STEP * GD_STEP;
    std::vector<uint32_t> xq((size_t)padded / 4);
    std::vector<float> xd((size_t)padded / 32);
    stage_x<gd_fmt<DT>::SHAPE>(x, cols, xq.data(), xd.data());
    std::vector<uint8_t> vals;
    std::vector<uint16_t> scales;
    if (DT == DT_Q8_0) {
        const struct block_q8_0 *b = (const struct block_q8_0 *)row;
        for (int k = 0; k < cols / 32; k++) {
            scales.push_back(b[k].d);
            vals.insert(vals.end(), (const uint8_t *)b[k].qs, (const uint8_t *)b[k].qs + 32);
        }
        row = vals.data();
    }
    return check_units<DT>(row, scales.data(), ref, cols, xq.data(), xd.data(), dot_bad);
}

/* The staged GEMV's chunks (gd_chunk_of, gd_chunk_unit): a row of
 * random blocks whose last step is partial, copied chunk by chunk as
 * k_gemv_qstaged's bulk copies copy it (Q8_0 as the device keeps it:
 * values, then its table of scales), for chunks of 1, 2 and 3 steps:
 * every lane's unit read from the copy (gd_load<DT, true>) has the bits
 * of the row's unit as k_gemv_qdot reads it; and the chunks cover the
 * row's bytes and columns exactly once. Returns the units that differ. */
template <int DT> static int check_chunks(const char *name)
{
    using F = gd_fmt<DT>;
    const bool q8 = DT == DT_Q8_0;
    const int be = q8 ? 32 : cuk_q_block_elems(DT), bb = q8 ? 34 : cuk_q_block_bytes(DT);
    const int cols = be == 256 ? 256 * 11 : 32 * 75; /* 2.75 and ~2.3 steps */
    const size_t rb = q8 ? (size_t)cols : cuk_q_row_bytes(DT, cols);
    std::vector<uint8_t> row(rb + 64), file((size_t)(cols / be) * bb);
    std::vector<uint16_t> sc(cols / 32 + 8);
    for (auto &x : file)
        x = (uint8_t)rnd();
    int fa, fb;
    f16_fields((enum dtype)DT, &fa, &fb);
    for (size_t blk = 0; blk < file.size() / bb; blk++)
        for (int off : {fa, fb})
            if (off >= 0) {
                uint16_t h = rand_f16();
                memcpy(&file[blk * bb + off], &h, 2);
            }
    if (q8) /* cuk_q8_repack's layout: values in row order, a scale table */
        for (int k = 0; k < cols / 32; k++) {
            memcpy(&sc[k], &file[(size_t)k * 34], 2);
            memcpy(&row[(size_t)k * 32], &file[(size_t)k * 34 + 2], 32);
        }
    else
        memcpy(row.data(), file.data(), rb);
    int bad = 0;
    for (int cs = 1; cs <= 3; cs++) {
        const int nsteps = (cols + GD_STEP - 1) / GD_STEP, nch = (nsteps + cs - 1) / cs;
        size_t bytes = 0, sbytes = 0;
        int ccols = 0;
        for (int ch = 0; ch < nch; ch++) {
            const gd_chunk c = gd_chunk_of(DT, rb, cols, cs, ch);
            bad += c.off != bytes || (q8 && c.soff != sbytes);
            bytes += c.bytes, sbytes += c.sbytes, ccols += c.cols;
            /* the slot: 16-aligned, filled past the copy with bytes that
             * a read past it would take in */
            alignas(16) static uint8_t slot[3 * GD_STEP + 64], sslot[3 * GD_STEP / 16 + 64];
            memset(slot, 0xFF, sizeof slot);
            memset(sslot, 0xFF, sizeof sslot);
            memcpy(slot, row.data() + c.off, c.bytes);
            if (q8)
                memcpy(sslot, (const uint8_t *)sc.data() + c.soff, c.sbytes);
            for (int lu = 0; lu < (c.cols + GD_STEP - 1) / GD_STEP * 32; lu++) {
                const int ug = ch * cs * 32 + lu;
                gd_unit a, b;
                memset(&a, 0, sizeof a);
                memset(&b, 0, sizeof b);
                gd_load<DT, true>(slot, (const uint16_t *)sslot, gd_chunk_unit<DT>(lu, c.cols),
                                  c.cols, a);
                const int uu = F::SHAPE == GD_BYTES ? ug : min(ug, cols / 32 - 1);
                gd_load<DT>(row.data(), sc.data(), uu, cols, b);
                bad += memcmp(a.q, b.q, sizeof a.q) != 0 ||
                       memcmp(a.s, b.s, sizeof(float) * F::G) != 0 ||
                       memcmp(a.m, b.m, sizeof(float) * F::G) != 0;
            }
        }
        bad += bytes != rb || ccols != cols || (q8 && sbytes != (size_t)cols / 16);
    }
    CHECK(bad == 0, "%s: %d staged units or chunk bounds differ from the row's", name, bad);
    return bad;
}

/* model/quant_dq.h's k_scale_min (a C header with restrict, not
 * included here): group j's 6-bit scale and min of a K block's 12 bytes */
static void k_scale_min_ref(int j, const uint8_t *q, uint8_t *sc, uint8_t *mn)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *mn = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* The tensor-core GEMV's reading of a Q4_K or Q5_K row (qmma_dq.cuh)
 * against the host's widening ref: for every group i of every block and
 * lane t, the bf16 pairs qmma_pair makes of qmma_codes' words of the
 * lane's bytes 8t .. 8t + 7 of the group's run of codes (and Q5_K's
 * fifth bits, bit i of the same bytes of qh) are 128 + the codes of
 * columns 32i + 8t .. + 7, which with the host's d1 and m1 give ref's
 * bits as d1 * q - m1; and qmma_coef4's pair for the group (from the
 * half j that has it) is d1 and fmaf(128, d1, m1). Returns the values
 * and coefficients that differ. */
template <int DT> static int check_qmma_row(const uint8_t *row, const float *ref, int cols)
{
    constexpr int BB = DT == DT_Q5_K ? 176 : 144, QS = DT == DT_Q5_K ? 48 : 16;
    constexpr int QMAX = DT == DT_Q5_K ? 31 : 15;
    int bad = 0;
    for (int b = 0; b < cols / 256; b++) {
        const uint8_t *blk = row + (size_t)b * BB;
        uint4 hd;
        memcpy(&hd, blk, 16);
        uint16_t dh, mh;
        memcpy(&dh, blk, 2);
        memcpy(&mh, blk + 2, 2);
        const float d = f16_to_f32(dh), dmin = f16_to_f32(mh);
        for (int i = 0; i < 8; i++) {
            uint8_t sc, mn;
            k_scale_min_ref(i, blk + 4, &sc, &mn);
            const float d1 = d * (float)sc, m1 = dmin * (float)mn, b1 = fmaf(128.0f, d1, m1);
            float ca4[4], cb4[4];
            qmma_coef4(hd, (i & 3) >> 1, ca4, cb4);
            const float ca = ca4[(i & 1) + 2 * (i >> 2)], cb = cb4[(i & 1) + 2 * (i >> 2)];
            bad += memcmp(&ca, &d1, 4) != 0;
            bad += memcmp(&cb, &b1, 4) != 0;
            for (int t = 0; t < 4; t++) {
                uint32_t w[2], hw[2] = {0, 0};
                memcpy(w, blk + QS + 32 * (i / 2) + 8 * t, 8);
                if (DT == DT_Q5_K)
                    memcpy(hw, blk + 16 + 8 * t, 8);
                for (int h = 0; h < 2; h++)
                    for (int e = 0; e < 2; e++) {
                        const uint32_t p = qmma_pair(qmma_codes<DT>(w[h], hw[h], i), e);
                        for (int k = 0; k < 2; k++) {
                            const float a = __uint_as_float((p >> (16 * k)) << 16); /* bf16 */
                            const int q = (int)a - 128;
                            const float v = d1 * (float)q - m1;
                            const int col = 256 * b + 32 * i + 8 * t + 4 * h + 2 * e + k;
                            bad += a != (float)(int)a || q < 0 || q > QMAX ||
                                   memcmp(&v, &ref[col], 4) != 0;
                        }
                    }
            }
        }
    }
    return bad;
}

/* The same for Q6_K: for every group i (half i / 4, k = i % 4) of every
 * block and lane t, qmma_codes6's words of the lane's bytes 4t .. 4t + 3
 * and 16 + 4t .. of the group's run of low nibbles and of its half's bit
 * pairs, as qmma_pair's bf16 values, are 128 + the 6-bit codes of those
 * columns, and qmma_coef6's d sc of each 16-value half (from the lane
 * half j that makes it) times q - 32 is ref's value, bit for bit. */
static int check_qmma6_row(const uint8_t *row, const float *ref, int cols)
{
    int bad = 0;
    for (int b = 0; b < cols / 256; b++) {
        const uint8_t *blk = row + (size_t)b * 210;
        for (int i = 0; i < 8; i++) {
            const int n = i / 4, k = i % 4, j = (i & 3) >> 1;
            uint4 hd = {0, 0, 0, 0};
            memcpy(&hd.x, blk + 208, 2);
            memcpy(&hd.y, blk + 192 + 4 * j, 4);
            memcpy(&hd.z, blk + 200 + 4 * j, 4);
            float ca[4], cb[4];
            qmma_coef6(hd, ca, cb);
            const float scl[2] = {ca[(i & 1) + 2 * (i >> 2)], cb[(i & 1) + 2 * (i >> 2)]};
            for (int t = 0; t < 4; t++)
                for (int half = 0; half < 2; half++) {
                    uint32_t w, h;
                    memcpy(&w, blk + 64 * n + 32 * (k & 1) + 16 * half + 4 * t, 4);
                    memcpy(&h, blk + 128 + 32 * n + 16 * half + 4 * t, 4);
                    const uint32_t m = qmma_codes6(w, h, k);
                    for (int e = 0; e < 2; e++) {
                        const uint32_t p = qmma_pair(m, e);
                        for (int l = 0; l < 2; l++) {
                            const float a = __uint_as_float((p >> (16 * l)) << 16); /* bf16 */
                            const int q = (int)a - 128;
                            const float v = scl[half] * (float)(q - 32);
                            const int col = 256 * b + 32 * i + 16 * half + 4 * t + 2 * e + l;
                            bad += a != (float)(int)a || q < 0 || q > 63 ||
                                   memcmp(&v, &ref[col], 4) != 0;
                        }
                    }
                }
        }
    }
    return bad;
}

/* One chunk of the tensor-core GEMV as its warp reads it (qmma_dq.cuh):
 * 16 rows of nb blocks of dtype DT laid out as on the device (rows
 * rb bytes apart from a 16-aligned base, so Q6_K's blocks sit at the
 * skews the kernel meets), block k copied into a slot as qmma_issue
 * copies it (Q6_K: the aligned 16-byte pieces over the block, zeros
 * past its end), then every lane's qmma_read, qmma_head and qmma_coefs
 * (written over the slot after all lanes read it), and for each group
 * the mma's A and B rebuilt from the lanes' fragments (qmma_a, qmma_x)
 * and multiplied as the kernel sums them: d1 C - (128 d1 + m1) S, or
 * Q6_K's d sc (C - 160 S) per 16 columns. Returns the rows x tokens whose
 * sum is off the double product of the host's widening (ref) with the
 * same bf16 x by more than 1e-5 of the row's magnitude. */
template <int DT>
static int check_qmma_chunk(const uint8_t *base, size_t rb, int k, const float *ref, int cols,
                            const uint16_t *xs, int stride, int n)
{
    using F = qmma_fmt<DT>;
    alignas(16) static unsigned char slot[16 * 256 + 64];
    memset(slot, 0, sizeof slot);
    int skew[16];
    for (int r = 0; r < 16; r++) {
        const uint8_t *b = base + r * rb + (size_t)k * F::BYTES;
        const uint8_t *a = F::K6 ? (const uint8_t *)((uintptr_t)b & ~(uintptr_t)15) : b;
        skew[r] = (int)(b - a);
        for (int o = 0; o < F::BB; o++)
            slot[r * F::BB + o] = a + o < b + F::BYTES ? a[o] : 0;
    }
    qmma_raw raw[32];
    uint4 hd[32];
    for (int L = 0; L < 32; L++) {
        const int sk[2] = {skew[L >> 2], skew[(L >> 2) + 8]};
        qmma_read<DT>(raw[L], slot, L >> 2, L & 3, sk);
        hd[L] = qmma_head<DT>(slot, L & 15, skew[L & 15], L >> 4);
    }
    for (int L = 0; L < 32; L++)
        qmma_coefs<DT>((float4 *)slot, hd[L], L);
    const float4 *cf = (const float4 *)slot;
    double acc[16][8] = {};
    for (int i = 0; i < 8; i++) {
        float A[2][16][16], B[2][16][8];
        for (int L = 0; L < 32; L++) {
            const int g = L >> 2, t = L & 3;
            uint32_t a[2][4];
            qmma_a<DT>(raw[L], i, a[0], a[1]);
            const uint4 xv = qmma_x<DT>(xs, stride, g, n, 256 * k + 32 * i, t);
            const uint32_t bx[2][2] = {{xv.x, xv.y}, {xv.z, xv.w}};
            for (int m = 0; m < 2; m++)
                for (int e = 0; e < 2; e++) {
                    /* a[m][0..3]: (g, 2t + e), (g + 8, 2t + e), (g, 2t + 8 + e), (g + 8, ..) */
                    for (int q = 0; q < 4; q++)
                        A[m][g + 8 * (q & 1)][2 * t + 8 * (q >> 1) + e] =
                            __uint_as_float((a[m][q] >> (16 * e)) << 16);
                    for (int q = 0; q < 2; q++)
                        B[m][2 * t + 8 * q + e][g] = __uint_as_float((bx[m][q] >> (16 * e)) << 16);
                }
        }
        for (int row = 0; row < 16; row++)
            for (int tok = 0; tok < 8; tok++) {
                double c[2] = {0, 0}, sx[2] = {0, 0};
                for (int m = 0; m < 2; m++)
                    for (int kk = 0; kk < 16; kk++) {
                        c[m] += (double)A[m][row][kk] * B[m][kk][tok];
                        sx[m] += B[m][kk][tok];
                    }
                const float4 q = cf[8 * i + (row & 7)];
                const double ca = row < 8 ? q.x : q.z, cb = row < 8 ? q.y : q.w;
                if (F::K6)
                    acc[row][tok] += ca * (c[0] - 160.0 * sx[0]) + cb * (c[1] - 160.0 * sx[1]);
                else
                    acc[row][tok] += ca * (c[0] + c[1]) - cb * (sx[0] + sx[1]);
            }
    }
    int bad = 0;
    for (int row = 0; row < 16; row++)
        for (int tok = 0; tok < n; tok++) {
            double want = 0, mag = 0;
            for (int c = 0; c < 256; c++) {
                const double x = __uint_as_float((uint32_t)xs[tok * stride + 256 * k + c] << 16);
                const double w = ref[(size_t)row * cols + 256 * k + c];
                want += w * x;
                mag += fabs(w * x);
            }
            bad += fabs(acc[row][tok] - want) > 1e-5 * mag + 1e-30;
        }
    return bad;
}

/* check_qmma_chunk over every block of 16 random rows of cols columns. */
template <int DT> static int check_qmma_chunks(int cols)
{
    using F = qmma_fmt<DT>;
    const size_t rb = (size_t)cols / 256 * F::BYTES;
    std::vector<uint8_t> buf(16 * rb + 64);
    uint8_t *base = (uint8_t *)(((uintptr_t)buf.data() + 15) & ~(uintptr_t)15);
    for (size_t i = 0; i < 16 * rb; i++)
        base[i] = (uint8_t)rnd();
    int fa, fb;
    f16_fields((enum dtype)DT, &fa, &fb);
    for (size_t blk = 0; blk < 16 * rb / F::BYTES; blk++)
        for (int off : {fa, fb})
            if (off >= 0) {
                const uint16_t h = rand_f16();
                memcpy(base + blk * F::BYTES + off, &h, 2);
            }
    std::vector<float> ref((size_t)16 * cols);
    for (int r = 0; r < 16; r++)
        quant_dequantize_row((enum dtype)DT, base + r * rb, &ref[(size_t)r * cols], cols);
    const int n = 8, stride = cols + 32;
    std::vector<uint16_t> xs((size_t)n * stride);
    for (auto &v : xs)
        v = f32_to_bf16((float)((int)(rnd() % 2001) - 1000) / 1000.0f);
    int bad = 0;
    for (int k = 0; k < cols / 256; k++)
        bad += check_qmma_chunk<DT>(base, rb, k, ref.data(), cols, xs.data(), stride, n);
    return bad;
}

int main()
{
    /* Q8_0: its integer units only (quant_dq.cuh does not widen it) */
    const enum dtype dts[] = {DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q4_K,
                              DT_Q5_K, DT_Q6_K, DT_Q2_K, DT_Q3_K, DT_Q8_0};
    for (enum dtype dt : dts) {
        const bool q8 = dt == DT_Q8_0;
        const int be = q8 ? 32 : cuk_q_block_elems(dt), bb = q8 ? 34 : cuk_q_block_bytes(dt);
        CHECK(be == (int)dtype_block_elems(dt) && (size_t)bb == dtype_row_bytes(dt, be),
              "%s: block of %d values, %d bytes", dtype_name(dt), be, bb);
        const int cols = be * 12, rows = 40;
        const size_t rb = dtype_row_bytes(dt, cols);
        CHECK(q8 || cuk_q_row_bytes(dt, cols) == rb, "%s: row bytes", dtype_name(dt));
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
        std::vector<float> ref(cols), got(cols), x(cols);
        int bad = 0, any = 0, ubad = 0, dbad = 0, mbad = 0;
        for (int r = 0; r < rows; r++) {
            const uint8_t *row = w.data() + (size_t)r * rb;
            quant_dequantize_row(dt, row, ref.data(), cols);
            if (dt == DT_Q4_K)
                mbad += check_qmma_row<DT_Q4_K>(row, ref.data(), cols);
            else if (dt == DT_Q5_K)
                mbad += check_qmma_row<DT_Q5_K>(row, ref.data(), cols);
            else if (dt == DT_Q6_K)
                mbad += check_qmma6_row(row, ref.data(), cols);
            for (int c = 0; c < cols; c += 8) {
                if (q8)
                    memcpy(&got[c], &ref[c], 32);
                else if (r % 2)
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
                x[c] = (float)((int)(rnd() % 20001) - 10000) * (r % 3 ? 1e-3f : 1e-7f);
            }
            switch (dt) {
            case DT_Q4_0: ubad += units_row<DT_Q4_0>(row, ref.data(), cols, x.data(), &dbad); break;
            case DT_Q4_1: ubad += units_row<DT_Q4_1>(row, ref.data(), cols, x.data(), &dbad); break;
            case DT_Q5_0: ubad += units_row<DT_Q5_0>(row, ref.data(), cols, x.data(), &dbad); break;
            case DT_Q5_1: ubad += units_row<DT_Q5_1>(row, ref.data(), cols, x.data(), &dbad); break;
            case DT_Q4_K: ubad += units_row<DT_Q4_K>(row, ref.data(), cols, x.data(), &dbad); break;
            case DT_Q5_K: ubad += units_row<DT_Q5_K>(row, ref.data(), cols, x.data(), &dbad); break;
            case DT_Q6_K: ubad += units_row<DT_Q6_K>(row, ref.data(), cols, x.data(), &dbad); break;
            case DT_Q2_K: ubad += units_row<DT_Q2_K>(row, ref.data(), cols, x.data(), &dbad); break;
            case DT_Q3_K: ubad += units_row<DT_Q3_K>(row, ref.data(), cols, x.data(), &dbad); break;
            default: ubad += units_row<DT_Q8_0>(row, ref.data(), cols, x.data(), &dbad); break;
            }
        }
        CHECK(mbad == 0, "%s: %d values or scales of the tensor-core GEMV's reading "
              "(qmma_dq.cuh) differ from quant_dequantize_row's", dtype_name(dt), mbad);
        if (dt == DT_Q4_K || dt == DT_Q5_K || dt == DT_Q6_K)
            printf("%s: the tensor-core GEMV's A values and scales == host widening: %s\n",
                   dtype_name(dt), mbad ? "no" : "yes");
        CHECK(ubad == 0, "%s: %d of %d values' integer units (s * code - m) differ from "
              "quant_dequantize_row's bits", dtype_name(dt), ubad, rows * cols);
        CHECK(dbad == 0, "%s: %d of %d units' byte dot products off a double product",
              dtype_name(dt), dbad, rows * cols / 32);
        CHECK(bad == 0 && any > rows * cols / 2, "%s: %d of %d values differ from "
              "quant_dequantize_row's bits (%d non-zero)", dtype_name(dt), bad, rows * cols, any);
        printf("%s: %d values, device widening == host widening: %s; integer units: %s, "
               "dot products: %s\n", dtype_name(dt), rows * cols, q8 ? "n/a" : bad ? "no" : "yes",
               ubad ? "no" : "yes", dbad ? "no" : "yes");
    }
    /* gd_quant4's rounding is the CPU's (nearbyintf of v * id): random
     * values and scales, and every tie k + 0.5 (to even) */
    int qbad = 0;
    for (int i = 0; i < 200000; i++) {
        float v[4], id = i < 1000 ? 1.0f : 127.0f / (float)(1 + rnd() % 1000000) * 1e3f;
        for (int k = 0; k < 4; k++) {
            v[k] = i < 1000 ? (float)((int)(rnd() % 254) - 127) + 0.5f
                            : ((float)(rnd() % 2000001) / 1000000.0f - 1.0f) * (127.0f / id);
            if (i >= 1000 && v[k] * id > 127.0f)
                v[k] = 127.0f / id;
        }
        const uint32_t q = gd_quant4(v[0], v[1], v[2], v[3], id);
        for (int k = 0; k < 4; k++)
            qbad += (int8_t)(q >> (8 * k)) != (int8_t)nearbyintf(v[k] * id);
    }
    CHECK(qbad == 0, "gd_quant4: %d of 800000 activations rounded unlike nearbyintf", qbad);
    check_perm<GD_BYTES>("BYTES");
    check_perm<GD_NIB16>("NIB16");
    check_perm<GD_NIB32>("NIB32");
    check_perm<GD_QUARTER>("QUARTER");
    int cbad = check_chunks<DT_Q4_0>("Q4_0") + check_chunks<DT_Q4_1>("Q4_1") +
               check_chunks<DT_Q5_0>("Q5_0") + check_chunks<DT_Q5_1>("Q5_1") +
               check_chunks<DT_Q4_K>("Q4_K") + check_chunks<DT_Q5_K>("Q5_K") +
               check_chunks<DT_Q6_K>("Q6_K") + check_chunks<DT_Q2_K>("Q2_K") +
               check_chunks<DT_Q3_K>("Q3_K") + check_chunks<DT_Q8_0>("Q8_0");
    printf("staged chunks of 1-3 steps, every format: units as the row's: %s\n",
           cbad ? "no" : "yes");
    /* the tensor-core GEMV's chunks (rows of 768 columns: Q6_K's 630-byte
     * rows 2-aligned; 1,024: 8-aligned; 2,048: 16-aligned) */
    for (int cols : {768, 1024, 2048}) {
        const int q4 = check_qmma_chunks<DT_Q4_K>(cols), q5 = check_qmma_chunks<DT_Q5_K>(cols),
                  q6 = check_qmma_chunks<DT_Q6_K>(cols);
        CHECK(q4 == 0 && q5 == 0 && q6 == 0,
              "tensor-core GEMV chunks of %d columns: %d / %d / %d sums of Q4_K / Q5_K / Q6_K "
              "rows off the double product",
              cols, q4, q5, q6);
    }
    printf("tensor-core GEMV chunks as a warp reads and multiplies them, Q4_K, Q5_K, Q6_K: "
           "checked\n");
    return test_summary("test_quant_dq_emu");
}
