/* ggml_kq_scalar.h -- the ggml K-quant block formats (q2_k, q3_k, q4_k, q5_k, q6_k,
 * iq4_xs: 256 weights a block, in llama.cpp's byte layout, docs/cmf-format.md §7.9): the
 * scalar decoder, the reference row of the float32 path and of the int8 path. Shared by
 * the reference and the scalar fallbacks of the SIMD twins; every file is compiled with
 * -ffp-contract=off, so these float operations give the same bits in every ISA file.
 *
 * A block is first split into its integers: q[256] (the weight's integer, signed where
 * the format's is), and per 16 weights a scale sc[s] and (q2_k, q4_k, q5_k) a min mn[s]
 * (the 32-weight scales of q4_k, q5_k, iq4_xs given to both of their halves). The
 * float32 weight is then, as the gguf package computes it (float32, in this order):
 *   with mins (q2_k, q4_k, q5_k): (d * sc) * q - (dmin * mn)
 *   without (q3_k, q6_k, iq4_xs): (d * sc) * q
 * so a non-finite d or dmin gives inf/NaN weights, and a zero one zero terms. */
#ifndef CQ_GGML_KQ_SCALAR_H
#define CQ_GGML_KQ_SCALAR_H
#include "qmat.h"

#define CQ_KQ_BLOCK 256

static inline int kq_is(int dtype) {
    switch (dtype) {
    case CQ_DT_GGML_Q2_K: case CQ_DT_GGML_Q3_K: case CQ_DT_GGML_Q4_K: case CQ_DT_GGML_Q5_K: case CQ_DT_GGML_Q6_K: case CQ_DT_GGML_IQ4_XS: return 1;
    default: return 0;
    }
}
static inline int kq_has_min(int dtype) { return dtype == CQ_DT_GGML_Q2_K || dtype == CQ_DT_GGML_Q4_K || dtype == CQ_DT_GGML_Q5_K; }

static inline size_t kq_block_bytes(int dtype) {
    switch (dtype) {
    case CQ_DT_GGML_Q2_K: return 84;
    case CQ_DT_GGML_Q3_K: return 110;
    case CQ_DT_GGML_Q4_K: return 144;
    case CQ_DT_GGML_Q5_K: return 176;
    case CQ_DT_GGML_Q6_K: return 210;
    case CQ_DT_GGML_IQ4_XS: return 136;
    default: return 0;
    }
}

/* Payload bytes of a [rows, cols] K-quant matrix; 0 when cols is no multiple of 256. */
static inline size_t kq_nbytes(int dtype, size_t rows, size_t cols) {
    if (cols % CQ_KQ_BLOCK) return 0;
    return rows * (cols / CQ_KQ_BLOCK) * kq_block_bytes(dtype);
}

/* The 16 non-linear levels of iq4_nl / iq4_xs codes. */
static const int8_t KQ_IQ4_LEVELS[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* q4_k / q5_k: 6-bit scale and min of sub-block j (0..7) from their 12 packed bytes. */
static inline void kq_scale_min6(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

typedef struct {
    int16_t q[CQ_KQ_BLOCK];
    int16_t sc[16], mn[16]; /* per 16 weights; mn 0 without mins */
    float d, dmin;          /* dmin 0 without mins */
} kq_ints;

/* One block's half-precision scales d (and dmin) and its per-16-weight scale and min
 * integers sc, mn (o->q untouched): the scale half of kq_block_ints, also read by the
 * SIMD decoders that split the weights themselves. */
static void kq_block_scales(int dtype, const uint8_t *b, kq_ints *o) {
    o->dmin = 0.0f;
    for (int s = 0; s < 16; s++) o->mn[s] = 0;
    switch (dtype) {
    case CQ_DT_GGML_Q4_K:
    case CQ_DT_GGML_Q5_K: /* d, dmin, scales[12], (q5_k: qh[32]), qs[128] */
        o->d = cq_h2f(cq_ld16(b));
        o->dmin = cq_h2f(cq_ld16(b + 2));
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            kq_scale_min6(b + 4, j, &sc, &mn);
            o->sc[2 * j] = o->sc[2 * j + 1] = (int16_t)sc;
            o->mn[2 * j] = o->mn[2 * j + 1] = (int16_t)mn;
        }
        break;
    case CQ_DT_GGML_Q6_K: /* ql[128], qh[64], scales[16] (int8), d */
        o->d = cq_h2f(cq_ld16(b + 208));
        for (int s = 0; s < 16; s++) o->sc[s] = (int8_t)b[192 + s];
        break;
    case CQ_DT_GGML_Q2_K: /* scales[16] (low nibble scale, high min), qs[64], d, dmin */
        o->d = cq_h2f(cq_ld16(b + 80));
        o->dmin = cq_h2f(cq_ld16(b + 82));
        for (int s = 0; s < 16; s++) {
            o->sc[s] = b[s] & 15;
            o->mn[s] = b[s] >> 4;
        }
        break;
    case CQ_DT_GGML_Q3_K: { /* hmask[32], qs[64], scales[12] (6-bit, - 32), d */
        const uint8_t *sp = b + 96;
        o->d = cq_h2f(cq_ld16(b + 108));
        for (int s = 0; s < 16; s++) {
            const int lo = (s < 8 ? sp[s] : sp[s - 8] >> 4) & 15, hi = (sp[8 + s % 4] >> (2 * (s / 4))) & 3;
            o->sc[s] = (int16_t)((lo | (hi << 4)) - 32);
        }
        break;
    }
    default: { /* iq4_xs: d, scales_h (u16), scales_l[4], qs[128] */
        o->d = cq_h2f(cq_ld16(b));
        const unsigned sh = cq_ld16(b + 2);
        const uint8_t *sl = b + 4;
        for (int j = 0; j < 8; j++) {
            const int lo = (sl[j / 2] >> (4 * (j & 1))) & 15, hi = (int)(sh >> (2 * j)) & 3;
            o->sc[2 * j] = o->sc[2 * j + 1] = (int16_t)((lo | (hi << 4)) - 32);
        }
        break;
    }
    }
}

/* Split one block into its integers and half-precision scales. */
static void kq_block_ints(int dtype, const uint8_t *b, kq_ints *o) {
    kq_block_scales(dtype, b, o);
    switch (dtype) {
    case CQ_DT_GGML_Q4_K:
    case CQ_DT_GGML_Q5_K: {
        const uint8_t *qh = b + 16, *qs = b + (dtype == CQ_DT_GGML_Q5_K ? 48 : 16);
        for (int i = 0; i < 4; i++) /* 32 bytes: low nibbles weights 64i.., high 64i+32.. */
            for (int k = 0; k < 32; k++) {
                o->q[64 * i + k] = qs[32 * i + k] & 15;
                o->q[64 * i + 32 + k] = qs[32 * i + k] >> 4;
            }
        if (dtype == CQ_DT_GGML_Q5_K) /* bit j of qh[k]: weight 32j + k's fifth bit */
            for (int j = 0; j < 8; j++)
                for (int k = 0; k < 32; k++) o->q[32 * j + k] |= (int16_t)(((qh[k] >> j) & 1) << 4);
        break;
    }
    case CQ_DT_GGML_Q6_K: {
        const uint8_t *ql = b, *qh = b + 128;
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 64; k++) {
                o->q[128 * h + k] = ql[64 * h + k] & 15;
                o->q[128 * h + 64 + k] = ql[64 * h + k] >> 4;
            }
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 4; s++)
                for (int k = 0; k < 32; k++) {
                    int16_t *q = &o->q[128 * h + 32 * s + k];
                    *q = (int16_t)((*q | (((qh[32 * h + k] >> (2 * s)) & 3) << 4)) - 32);
                }
        break;
    }
    case CQ_DT_GGML_Q2_K: {
        const uint8_t *qs = b + 16;
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 4; s++)
                for (int k = 0; k < 32; k++) o->q[128 * h + 32 * s + k] = (qs[32 * h + k] >> (2 * s)) & 3;
        break;
    }
    case CQ_DT_GGML_Q3_K: {
        const uint8_t *hm = b, *qs = b + 32;
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 4; s++)
                for (int k = 0; k < 32; k++) {
                    const int e = 128 * h + 32 * s + k, j = e / 32; /* high bit j of hmask[k] */
                    const int low = (qs[32 * h + k] >> (2 * s)) & 3, high = (hm[k] >> j) & 1;
                    o->q[e] = (int16_t)(low - (high ? 0 : 4));
                }
        break;
    }
    default: { /* iq4_xs */
        const uint8_t *qs = b + 8;
        for (int j = 0; j < 8; j++)
            for (int k = 0; k < 16; k++) { /* 16 bytes: low nibbles weights 32j.., high 32j+16.. */
                o->q[32 * j + k] = KQ_IQ4_LEVELS[qs[16 * j + k] & 15];
                o->q[32 * j + 16 + k] = KQ_IQ4_LEVELS[qs[16 * j + k] >> 4];
            }
        break;
    }
    }
}

/* One block's 256 float32 weights (the header's formula). */
static void kq_decode_block(int dtype, const uint8_t *b, float *out) {
    kq_ints t;
    kq_block_ints(dtype, b, &t);
    const int mins = kq_has_min(dtype);
    for (int s = 0; s < 16; s++) {
        const float ds = t.d * (float)t.sc[s], dm = t.dmin * (float)t.mn[s];
        for (int k = 0; k < 16; k++) {
            const float w = ds * (float)t.q[16 * s + k];
            out[16 * s + k] = mins ? w - dm : w;
        }
    }
}

/* Row r of a K-quant matrix: with out != NULL store its weights, else return sum w * x
 * in column order (ref_row's contract). */
static float kq_ref_row(const cq_qmat *m, size_t r, const float *x, float *out) {
    const size_t nb = m->cols / CQ_KQ_BLOCK, bb = kq_block_bytes(m->dtype);
    const uint8_t *row = m->data + r * nb * bb;
    float acc = 0.0f, w[CQ_KQ_BLOCK];
    for (size_t i = 0; i < nb; i++) {
        kq_decode_block(m->dtype, row + i * bb, out ? out + i * CQ_KQ_BLOCK : w);
        if (out) continue;
        for (int k = 0; k < CQ_KQ_BLOCK; k++) acc += w[k] * x[CQ_KQ_BLOCK * i + k];
    }
    return acc;
}

/* The int8-activation row (x in the CQ_XQ_G32 layout: natural order, d per group of
 * 32), the spec of the SIMD twins. Per group g of 32 (halves a, b of 16 weights), in
 * exact integers:
 *   isum = sc_a * sum_a q*xq + sc_b * sum_b q*xq,   msum = mn_a * sum_a xq + mn_b * sum_b xq
 * (|isum| < 2^24, so each converts to float32 exactly), then the group's term
 *   with mins:    d_g * (d * isum - dmin * msum)
 *   without:      (d * d_g) * isum
 * is added to lane j = g % 8 (the group's place in its 256-weight block), block after
 * block, and the row is ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)): the order of
 * eight float lanes, so the SIMD kernels, which form the same integers in any order,
 * give these bits. */
static float kq_ref_i8_row(const cq_qmat *m, size_t r, const cq_xq *xq) {
    const size_t nb = m->cols / CQ_KQ_BLOCK, bb = kq_block_bytes(m->dtype);
    const uint8_t *row = m->data + r * nb * bb;
    const int mins = kq_has_min(m->dtype);
    float l[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    kq_ints t;
    for (size_t i = 0; i < nb; i++) {
        kq_block_ints(m->dtype, row + i * bb, &t);
        for (int j = 0; j < 8; j++) {
            const size_t g = 8 * i + j;
            const int8_t *xg = xq->q + 32 * g;
            int32_t isum = 0, msum = 0;
            for (int h = 0; h < 2; h++) {
                int32_t qs = 0, xs = 0;
                for (int k = 0; k < 16; k++) {
                    qs += (int32_t)t.q[32 * j + 16 * h + k] * xg[16 * h + k];
                    xs += xg[16 * h + k];
                }
                isum += t.sc[2 * j + h] * qs;
                msum += t.mn[2 * j + h] * xs;
            }
            if (mins) l[j] += xq->d[g] * (t.d * (float)isum - t.dmin * (float)msum);
            else l[j] += (t.d * xq->d[g]) * (float)isum;
        }
    }
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}
#endif
