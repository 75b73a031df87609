/* unpack.c - the portable unpacking of GGUF's 2-6-bit formats into the
 * matmul's code layout (unpack.h), the reference of the per-ISA builds,
 * and cpu_unpack_for. Built for the baseline instruction set: every CPU
 * calls cpu_unpack_for before any check of what it has could keep AVX2
 * code from it. */
#include "backend/cpu/unpack.h"

#include <stdbool.h>
#include <string.h>

#include "model/quant_dq.h"

/* One block's values k0 .. k0 + n (n a multiple of 16) into the row's
 * groups: codes u[0..n), and s, m for each 16 of them. */
static void place(uint8_t *dst, int64_t k0, const uint8_t *u, const float *s, const float *m,
                  int n)
{
    for (int i = 0; i < n; i += 16) {
        const int64_t k = k0 + i;
        uint8_t *grp = dst + (size_t)(k / UNPACK_GROUP) * UNPACK_GROUP_BYTES;
        const int v = (int)(k % UNPACK_GROUP);
        memcpy(grp + v, u + i, 16);
        for (int l = v / 4; l < v / 4 + 4; l++) {
            memcpy(grp + 64 + 4 * l, &s[i / 16], 4);
            memcpy(grp + 128 + 4 * l, &m[i / 16], 4);
        }
    }
}

/* The 32-blocks: value j in the low nibble of byte j, j + 16 in its high
 * one, the fifth bit (Q5_*) bit j of a 32-bit word. */
static void codes_q32(enum dtype dt, const uint8_t *p, uint8_t *u, float *s, float *m)
{
    uint16_t dh, mh;
    uint32_t qh;
    const uint8_t *q = q32_fields(dt, p, &dh, &mh, &qh);
    for (int j = 0; j < 16; j++) {
        u[j] = (uint8_t)((q[j] & 0xF) | ((qh >> j) & 1) << 4); /* qh: 0 unless Q5_* */
        u[j + 16] = (uint8_t)((q[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
    }
    const float d = f16_to_f32(dh);
    s[0] = s[1] = d;
    m[0] = m[1] = q32_min(dt, d, f16_to_f32(mh));
}

/* Q4_K / Q5_K: 64 values per 32 bytes of qs, group 2c in the low nibbles
 * and 2c + 1 in the high ones; Q5_K's fifth bits are bits 2c and 2c + 1
 * of qh[l]. */
static void codes_k45(enum dtype dt, const uint8_t *p, uint8_t *u, float *s, float *m)
{
    const bool five = dt == DT_Q5_K;
    const struct blk_q4_k *b4 = (const void *)p;
    const struct blk_q5_k *b5 = (const void *)p;
    const uint8_t *qs = five ? b5->qs : b4->qs, *scales = five ? b5->scales : b4->scales;
    const float d = f16_to_f32(b4->d), dmin = f16_to_f32(b4->dmin); /* same offsets in both */
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) {
            const int h1 = five ? ((b5->qh[l] >> (2 * c)) & 1) << 4 : 0;
            const int h2 = five ? ((b5->qh[l] >> (2 * c + 1)) & 1) << 4 : 0;
            u[64 * c + l] = (uint8_t)((qs[32 * c + l] & 0xF) | h1);
            u[64 * c + 32 + l] = (uint8_t)((qs[32 * c + l] >> 4) | h2);
        }
        float d1, m1, d2, m2;
        k_pair_scales(scales, 2 * c, d, dmin, &d1, &m1, &d2, &m2);
        s[4 * c] = s[4 * c + 1] = d1;
        m[4 * c] = m[4 * c + 1] = m1;
        s[4 * c + 2] = s[4 * c + 3] = d2;
        m[4 * c + 2] = m[4 * c + 3] = m2;
    }
}

/* Q6_K: each half of 128 holds four runs of 32 (low nibbles of ql[0..32),
 * of ql[32..64), high nibbles of each), their top two bits in qh; one
 * int8 scale a 16. */
static void codes_q6_k(const uint8_t *p, uint8_t *u, float *s, float *m)
{
    const struct blk_q6_k *b = (const void *)p;
    const float d = f16_to_f32(b->d);
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = b->ql + 64 * n, *qh = b->qh + 32 * n;
        uint8_t *o = u + 128 * n;
        for (int l = 0; l < 32; l++) {
            o[l] = (uint8_t)((ql[l] & 0xF) | ((qh[l] & 3) << 4));
            o[l + 32] = (uint8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
            o[l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            o[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
    }
    for (int g = 0; g < 16; g++) {
        s[g] = d * (float)b->scales[g];
        m[g] = 32.0f * s[g];
    }
}

/* Q2_K / Q3_K: value e's two low bits are bits 2 (e % 128 / 32) of byte
 * 32 (e / 128) + e % 32 of qs; Q3_K's third is bit 4 (e / 128) + e % 128 /
 * 32 of hmask byte e % 32, and a clear one means minus 4: the code is
 * the three bits, the min 4 s */
static void codes_q2_k(const uint8_t *p, uint8_t *u, float *s, float *m)
{
    const struct blk_q2_k *b = (const void *)p;
    const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
    for (int e = 0; e < Q_K_BLOCK; e++)
        u[e] = (uint8_t)((b->qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3);
    for (int g = 0; g < 16; g++) {
        s[g] = d * (float)(b->scales[g] & 0xF);
        m[g] = dmin * (float)(b->scales[g] >> 4);
    }
}

static void codes_q3_k(const uint8_t *p, uint8_t *u, float *s, float *m)
{
    const struct blk_q3_k *b = (const void *)p;
    const float d = f16_to_f32(b->d);
    for (int e = 0; e < Q_K_BLOCK; e++) {
        const int run = e % 128 / 32;
        const int hi = (b->hmask[e % 32] >> (4 * (e / 128) + run)) & 1;
        u[e] = (uint8_t)(((b->qs[32 * (e / 128) + e % 32] >> (2 * run)) & 3) | hi << 2);
    }
    int8_t sc[16];
    q3_k_scales(b->scales, sc);
    for (int g = 0; g < 16; g++) {
        s[g] = d * (float)(sc[g] - 32);
        m[g] = 4.0f * s[g];
    }
}

void cpu_unpack_ref(enum dtype dt, const void *src, uint8_t *dst, int64_t cols)
{
    const int64_t be = dtype_block_elems(dt);
    const size_t bb = dtype_row_bytes(dt, be);
    const uint8_t *p = src;
    if (cols % UNPACK_GROUP) /* the last group's missing half */
        memset(dst + unpack_row_bytes(cols) - UNPACK_GROUP_BYTES, 0, UNPACK_GROUP_BYTES);
    uint8_t u[Q_K_BLOCK];
    float s[Q_K_BLOCK / 16], m[Q_K_BLOCK / 16];
    for (int64_t k = 0; k < cols; k += be, p += bb) {
        switch (dt) {
        case DT_Q4_K:
        case DT_Q5_K: codes_k45(dt, p, u, s, m); break;
        case DT_Q6_K: codes_q6_k(p, u, s, m); break;
        case DT_Q2_K: codes_q2_k(p, u, s, m); break;
        case DT_Q3_K: codes_q3_k(p, u, s, m); break;
        default: codes_q32(dt, p, u, s, m); break;
        }
        place(dst, k, u, s, m, (int)be);
    }
}

#if defined(__x86_64__)
void cpu_unpack_avx2(enum dtype dt, const void *src, uint8_t *dst, int64_t cols);
void cpu_unpack_avx512(enum dtype dt, const void *src, uint8_t *dst, int64_t cols);
#endif

cpu_unpack_fn cpu_unpack_for(enum cpu_isa isa)
{
#if defined(__x86_64__)
    if (isa >= CPU_ISA_AVX512)
        return cpu_unpack_avx512;
    if (isa >= CPU_ISA_AVX2)
        return cpu_unpack_avx2;
#else
    (void)isa;
#endif
    return cpu_unpack_ref;
}
