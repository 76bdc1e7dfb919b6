/* ggml_q32_avx512.h -- AVX-512 int8-activation rows of the 32-weight ggml block formats
 * (spec: ggml_q32_ref_i8_row in ggml_q32_scalar.h). Included by matvec_avx512.c.
 *
 * The bulk of a row goes sixteen blocks a step (q8_0: G32_Q8_0_ROWS, two rows side by
 * side; the 4- and 5-bit formats: G32_NIBBLES16): each block's codes meet CQ_XQ_G32's
 * xq in vpdpbusd (or maddubs + madd without VNNI), the per-lane sums are folded to one
 * exact integer a block, the offset formats take off offset * (the block's xq sum, from
 * xq's bias), and one convert and one FMA with d_w * d_x (the sixteen f16 scales
 * assembled by scalar loads) serve the sixteen blocks. The blocks left over go four
 * (G32_NIBBLES4) then two a step (G32_BODY): the codes as u8 (the nibble, the 5-bit
 * value with its fifth bit set from qh through a 64-bit mask, or for q8_0 and iq4_nl
 * |q| against xq carrying q's sign), the offset formats subtracting off * (the lane's
 * xq sum), the min formats adding m * (the lane's xq sum) in float, each step's float
 * terms into two accumulators by step parity. A row with an odd block count ends on a
 * half step whose upper block reads as zero (xq's padding group is zero). The integers
 * equal the reference's; the float sums run in another order, the same on every
 * variant (VNNI or not) and entry point. */
#ifndef CQ_GGML_Q32_AVX512_H
#define CQ_GGML_Q32_AVX512_H
#include "ggml_q32_scalar.h"

/* Two f16 scales to 16 lanes: lanes 0-7 a, 8-15 b. */
static inline __m512 g32_scales2(uint16_t a, uint16_t b) {
    const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)a | ((uint32_t)b << 16))));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 _mm512_castps128_ps512(f));
}

/* 16 nibble bytes of each of two blocks as 64 u8 codes in column order (low nibbles
 * are columns 0-15 of a block, high ones 16-31). */
static inline __m512i g32_nibbles2(const uint8_t *q0, const uint8_t *q1) {
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)q0)),
                                              _mm_loadu_si128((const __m128i *)q1), 1);
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
    z = _mm512_and_si512(z, _mm512_set1_epi8(0x0F)); /* lo0 lo1 hi0 hi1 */
    return _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));
}

static inline uint32_t g32_ld32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Sixteen blocks a step: the dword sums of eight two-block vectors v[i] (block 2i in
 * lanes 0-7, 2i+1 in 8-15) folded to one dword a block by two rounds of unpack + add and
 * one 128-bit shuffle + add (exact integers), in the lane order G32_FOLD_ORDER, so that
 * one convert, one scale multiply and one FMA serve sixteen blocks; the sixteen f16
 * scales come in the same order (g32_halves16). */
static const int32_t G32_FOLD_ORDER[16] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};
static inline __m512i g32_fold16(const __m512i *v) {
    __m512i p[4], q[2];
    for (int i = 0; i < 4; i++)
        p[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                                _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        q[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(p[2 * i], p[2 * i + 1]),
                                _mm512_unpackhi_epi64(p[2 * i], p[2 * i + 1]));
    return _mm512_add_epi32(_mm512_shuffle_i64x2(q[0], q[1], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i64x2(q[0], q[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The f16 at p + at + bb * ord[k], k = 0..15, as 16 floats. By scalar loads: a
 * vpgatherdd of the sixteen took about half the time of a q8_0 row on Zen 4. */
static inline uint64_t g32_h4(const uint8_t *p, size_t bb, const int32_t *o) {
    return (uint64_t)cq_ld16(p + bb * (size_t)o[0]) | (uint64_t)cq_ld16(p + bb * (size_t)o[1]) << 16 |
           (uint64_t)cq_ld16(p + bb * (size_t)o[2]) << 32 | (uint64_t)cq_ld16(p + bb * (size_t)o[3]) << 48;
}
static inline __m512 g32_halves16(const uint8_t *p, size_t bb, const int32_t *ord) {
    const __m256i h = _mm256_setr_epi64x((long long)g32_h4(p, bb, ord), (long long)g32_h4(p, bb, ord + 4),
                                         (long long)g32_h4(p, bb, ord + 8), (long long)g32_h4(p, bb, ord + 12));
    return _mm512_cvtph_ps(h);
}

/* Four consecutive blocks (block b at p + b * bb, codes at qo) as 64 low codes (columns
 * 0-15 of each block, lanes 16b..16b+15) and 64 high ones (16-31); q5's fifth bits go in
 * by two 64-bit masks built from the four qh words. */
static inline void g32_codes4(const uint8_t *p, size_t bb, size_t qo, int q5, __m512i *lo,
                              __m512i *hi) {
    const __m512i m0f = _mm512_set1_epi8(0x0F);
    const __m256i v01 = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p + qo))),
        _mm_loadu_si128((const __m128i *)(p + bb + qo)), 1);
    const __m256i v23 = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p + 2 * bb + qo))),
        _mm_loadu_si128((const __m128i *)(p + 3 * bb + qo)), 1);
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(v01), v23, 1);
    *lo = _mm512_and_si512(v, m0f);
    *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m0f);
    if (q5) {
        const uint64_t h0 = g32_ld32(p + qo - 4), h1 = g32_ld32(p + bb + qo - 4);
        const uint64_t h2 = g32_ld32(p + 2 * bb + qo - 4), h3 = g32_ld32(p + 3 * bb + qo - 4);
        const uint64_t ml = (h0 & 0xFFFF) | (h1 & 0xFFFF) << 16 | (h2 & 0xFFFF) << 32 | (h3 & 0xFFFF) << 48;
        const uint64_t mh = (h0 >> 16) | (h1 >> 16) << 16 | (h2 >> 16) << 32 | (h3 >> 16) << 48;
        *lo = _mm512_or_si512(*lo, _mm512_maskz_mov_epi8((__mmask64)ml, _mm512_set1_epi8(16)));
        *hi = _mm512_or_si512(*hi, _mm512_maskz_mov_epi8((__mmask64)mh, _mm512_set1_epi8(16)));
    }
}

/* xq's halves for the four groups from g, in g32_codes4's lanes. */
static inline void g32_x4(const cq_xq *xq, size_t g, __m512i *xl, __m512i *xh) {
    const __m512i xa = _mm512_load_si512((const void *)(xq->q + CQ_GROUP * g));
    const __m512i xb = _mm512_load_si512((const void *)(xq->q + CQ_GROUP * g + 64));
    *xl = _mm512_shuffle_i64x2(xa, xb, _MM_SHUFFLE(2, 0, 2, 0));
    *xh = _mm512_shuffle_i64x2(xa, xb, _MM_SHUFFLE(3, 1, 3, 1));
}

/* The 4-bit and 5-bit formats four blocks a step: the four blocks' 16 nibble bytes in
 * one register, split into low nibbles (columns 0-15 of each block) and high ones
 * (16-31), meeting xq's halves gathered the same way (two vshufi64x2); lanes 4b..4b+3
 * hold block g+b. The q5 fifth bits go in by two 64-bit masks built from the four qh
 * words. Leaves g at the first block it did not take. */
#define G32_NIBBLES4(DOT)                                                                          \
    do {                                                                                           \
        const size_t qo = 2 + 2 * min + (q5 ? 4 : 0);                                              \
        const __m512i spread4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3); \
        for (; g + 4 <= gpr; g += 4) {                                                             \
            const uint8_t *p = row + g * bb;                                                       \
            CQ_STREAM_PF(p);                                                                       \
            CQ_STREAM_PF(p + 64);                                                                  \
            __m512i lo, hi, xl, xh;                                                                \
            g32_codes4(p, bb, qo, q5, &lo, &hi);                                                   \
            g32_x4(xq, g, &xl, &xh);                                                               \
            __m512i isum;                                                                          \
            if (dt == CQ_DT_GGML_IQ4_NL) {                                                         \
                lo = _mm512_shuffle_epi8(lv, lo);                                                  \
                hi = _mm512_shuffle_epi8(lv, hi);                                                  \
                isum = DOT(zero, _mm512_abs_epi8(lo), _mm512_mask_sub_epi8(xl, _mm512_movepi8_mask(lo), zero, xl)); \
                isum = DOT(isum, _mm512_abs_epi8(hi), _mm512_mask_sub_epi8(xh, _mm512_movepi8_mask(hi), zero, xh)); \
            } else {                                                                               \
                isum = DOT(DOT(zero, lo, xl), hi, xh);                                             \
                if (!min) isum = _mm512_sub_epi32(isum, DOT(DOT(zero, off, xl), off, xh));         \
            }                                                                                      \
            const __m128 dx = _mm_loadu_ps(xq->d + g);                                             \
            const __m128 dw = _mm_cvtph_ps(_mm_setr_epi16((short)cq_ld16(p), (short)cq_ld16(p + bb),   \
                (short)cq_ld16(p + 2 * bb), (short)cq_ld16(p + 3 * bb), 0, 0, 0, 0));              \
            const __m512 sc = _mm512_permutexvar_ps(spread4, _mm512_castps128_ps512(_mm_mul_ps(dw, dx))); \
            __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), sc);                                \
            if (min) {                                                                             \
                const __m128 mw = _mm_cvtph_ps(_mm_setr_epi16((short)cq_ld16(p + 2), (short)cq_ld16(p + bb + 2), \
                    (short)cq_ld16(p + 2 * bb + 2), (short)cq_ld16(p + 3 * bb + 2), 0, 0, 0, 0));  \
                const __m512 mx = _mm512_permutexvar_ps(spread4, _mm512_castps128_ps512(_mm_mul_ps(mw, dx))); \
                t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(DOT(DOT(zero, ones, xl), ones, xh)), mx, t); \
            }                                                                                      \
            if (g & 4) f1 = _mm512_add_ps(f1, t);                                                  \
            else f0 = _mm512_add_ps(f0, t);                                                        \
        }                                                                                          \
    } while (0)

/* The 4-bit and 5-bit formats sixteen blocks a step: four of G32_NIBBLES4's four-block
 * steps, each leaving its blocks' dword sums of u * xq (u the stored code as u8: the
 * nibble, the 5-bit value, or for iq4_nl its level + 128 under VNNI, |level| against xq
 * with the level's sign otherwise), folded to one dword a block (lane 4b + j: block
 * 4j + b); the offset (8 or 16; 128 for iq4_nl's shifted levels) times the block's sum
 * of xq is taken off that integer, and the min formats' m * d_x * (sum of xq) joins by
 * a second FMA (d and m by g32_halves16). */
static const int32_t G32_NIB_ORDER[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
#define G32_NIBBLES16(DOT, XOR128)                                                                 \
    do {                                                                                           \
        const size_t qo = 2 + 2 * min + (q5 ? 4 : 0);                                              \
        const __m512i order = _mm512_loadu_si512((const void *)G32_NIB_ORDER);                     \
        const __m512i ev = _mm512_add_epi32(order, order), od = _mm512_add_epi32(ev, _mm512_set1_epi32(1)); \
        const int sh = dt == CQ_DT_GGML_Q4_0 ? 3 : dt == CQ_DT_GGML_Q5_0 ? 4 : 7;                  \
        const __m512i lvu = _mm512_xor_si512(lv, _mm512_set1_epi8((char)0x80));                   \
        for (; g + 16 <= gpr; g += 16) {                                                           \
            const uint8_t *p16 = row + g * bb;                                                     \
            for (size_t o = 0; o < 16 * bb; o += 64) CQ_STREAM_PF(p16 + o);                        \
            __m512i w[4];                                                                          \
            for (int j = 0; j < 4; j++) {                                                          \
                const uint8_t *p = p16 + 4 * j * bb;                                               \
                const size_t gj = g + 4 * j;                                                       \
                __m512i lo, hi, xl, xh;                                                            \
                g32_codes4(p, bb, qo, q5, &lo, &hi);                                               \
                g32_x4(xq, gj, &xl, &xh);                                                          \
                if (dt == CQ_DT_GGML_IQ4_NL && XOR128) {                                           \
                    w[j] = DOT(DOT(zero, _mm512_shuffle_epi8(lvu, lo), xl), _mm512_shuffle_epi8(lvu, hi), xh); \
                } else if (dt == CQ_DT_GGML_IQ4_NL) {                                              \
                    lo = _mm512_shuffle_epi8(lv, lo);                                              \
                    hi = _mm512_shuffle_epi8(lv, hi);                                              \
                    w[j] = DOT(zero, _mm512_abs_epi8(lo), _mm512_mask_sub_epi8(xl, _mm512_movepi8_mask(lo), zero, xl)); \
                    w[j] = DOT(w[j], _mm512_abs_epi8(hi), _mm512_mask_sub_epi8(xh, _mm512_movepi8_mask(hi), zero, xh)); \
                } else {                                                                           \
                    w[j] = DOT(DOT(zero, lo, xl), hi, xh);                                         \
                }                                                                                  \
            }                                                                                      \
            const __m512i p0 = _mm512_add_epi32(_mm512_unpacklo_epi32(w[0], w[1]), _mm512_unpackhi_epi32(w[0], w[1])); \
            const __m512i p1 = _mm512_add_epi32(_mm512_unpacklo_epi32(w[2], w[3]), _mm512_unpackhi_epi32(w[2], w[3])); \
            __m512i isum = _mm512_add_epi32(_mm512_unpacklo_epi64(p0, p1), _mm512_unpackhi_epi64(p0, p1)); \
            const __m512 dx = _mm512_permutexvar_ps(order, _mm512_loadu_ps(xq->d + g));            \
            const int offset = dt != CQ_DT_GGML_IQ4_NL ? !min : XOR128;                            \
            __m512i xs = zero;                                                                     \
            if (offset || min) {                                                                   \
                const __m512i b0 = _mm512_loadu_si512((const void *)(xq->bias + 2 * g));           \
                const __m512i b1 = _mm512_loadu_si512((const void *)(xq->bias + 2 * g + 16));      \
                xs = _mm512_add_epi32(_mm512_permutex2var_epi32(b0, ev, b1), _mm512_permutex2var_epi32(b0, od, b1)); \
            }                                                                                      \
            if (offset) isum = _mm512_sub_epi32(isum, _mm512_sll_epi32(xs, _mm_cvtsi32_si128(sh))); \
            const __m512 dw = g32_halves16(p16, bb, G32_NIB_ORDER);                               \
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx), acc);           \
            if (min) {                                                                             \
                const __m512 mw = g32_halves16(p16 + 2, bb, G32_NIB_ORDER);                       \
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(xs), _mm512_mul_ps(mw, dx), acc);         \
            }                                                                                      \
        }                                                                                          \
    } while (0)

#define G32_BODY(DOT, DT, XOR128)                                                                          \
    const int dt = (DT), min = ggml_q32_has_min(dt);                                               \
    const int q5 = dt == CQ_DT_GGML_Q5_0 || dt == CQ_DT_GGML_Q5_1;                                 \
    const size_t gpr = m->cols / CQ_GROUP, bb = ggml_q32_block_bytes(dt);                          \
    const uint8_t *row = m->data + r * gpr * bb;                                                   \
    const __m512i zero = _mm512_setzero_si512(), ones = _mm512_set1_epi8(1);                       \
    const __m512i off = _mm512_set1_epi8(dt == CQ_DT_GGML_Q4_0 ? 8 : 16);                          \
    const __m512i lv = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)GGML_IQ4NL_LEVELS)); \
    __m512 f0 = _mm512_setzero_ps(), f1 = f0, acc = f0;                                            \
    static const uint8_t zblk[34] = {0};                                                           \
    size_t g = 0;                                                                                  \
    G32_NIBBLES16(DOT, XOR128);                                                                    \
    G32_NIBBLES4(DOT);                                                                             \
    for (; g < gpr; g += 2) {                                                                      \
        const uint8_t *p0 = row + g * bb, *p1 = g + 1 < gpr ? p0 + bb : zblk;                      \
        CQ_STREAM_PF(p0);                                                                          \
        const __m512i x = _mm512_load_si512((const void *)(xq->q + CQ_GROUP * g));                 \
        __m512i isum, u;                                                                           \
        switch (dt) {                                                                              \
        case CQ_DT_GGML_Q8_0:                                                                      \
        case CQ_DT_GGML_IQ4_NL: {                                                                  \
            const __m512i v = dt == CQ_DT_GGML_Q8_0                                                \
                                  ? _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(  \
                                                           (const __m256i *)(p0 + 2))),            \
                                                       _mm256_loadu_si256((const __m256i *)(p1 + 2)), 1) \
                                  : _mm512_shuffle_epi8(lv, g32_nibbles2(p0 + 2, p1 + 2));         \
            const __m512i xs = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(v), zero, x);           \
            isum = DOT(zero, _mm512_abs_epi8(v), xs);                                              \
            break;                                                                                 \
        }                                                                                          \
        case CQ_DT_GGML_Q4_0:                                                                      \
        case CQ_DT_GGML_Q4_1:                                                                      \
            u = g32_nibbles2(p0 + 2 + 2 * min, p1 + 2 + 2 * min);                                  \
            isum = DOT(zero, u, x);                                                                \
            if (!min) isum = _mm512_sub_epi32(isum, DOT(zero, off, x));                            \
            break;                                                                                 \
        default: { /* q5_0, q5_1 */                                                                \
            const uint8_t *h0 = p0 + 2 + 2 * min, *h1 = p1 + 2 + 2 * min;                          \
            u = g32_nibbles2(h0 + 4, h1 + 4);                                                      \
            const __mmask64 hb = (__mmask64)g32_ld32(h0) | ((__mmask64)g32_ld32(h1) << 32);        \
            u = _mm512_or_si512(u, _mm512_maskz_mov_epi8(hb, _mm512_set1_epi8(16)));                    \
            isum = DOT(zero, u, x);                                                                \
            if (!min) isum = _mm512_sub_epi32(isum, DOT(zero, off, x));                            \
        }                                                                                          \
        }                                                                                          \
        const __m512 dl = _mm512_load_ps(xq->dl + CQ_GROUP * g / 4);                               \
        const __m512 sc = _mm512_mul_ps(g32_scales2(cq_ld16(p0), cq_ld16(p1)), dl);                \
        __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), sc);                                    \
        if (min) {                                                                                 \
            const __m512 mx = _mm512_mul_ps(g32_scales2(cq_ld16(p0 + 2), cq_ld16(p1 + 2)), dl);    \
            t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(DOT(zero, ones, x)), mx, t);                    \
        }                                                                                          \
        if (g & 2) f1 = _mm512_add_ps(f1, t);                                                      \
        else f0 = _mm512_add_ps(f0, t);                                                            \
    }                                                                                              \
    return _mm512_reduce_add_ps(_mm512_add_ps(acc, _mm512_add_ps(f0, f1)))

/* One function per format (the format a constant, so its branches fold away) and per
 * dot product instruction. */
#ifdef CQ_HAVE_VNNI_FN
#define G32_FNS(SUF, DT)                                                                           \
    static float g32_##SUF##_bw(const cq_qmat *m, size_t r, const cq_xq *xq) { G32_BODY(dot_bw, DT, 0); } \
    __attribute__((target("avx512vnni"))) static float g32_##SUF##_vnni(const cq_qmat *m, size_t r,   \
                                                                       const cq_xq *xq) {             \
        G32_BODY(_mm512_dpbusd_epi32, DT, 1);                                                         \
    }
#else
#define G32_FNS(SUF, DT)                                                                           \
    static float g32_##SUF##_bw(const cq_qmat *m, size_t r, const cq_xq *xq) { G32_BODY(dot_bw, DT, 0); }
#endif
G32_FNS(q4_0, CQ_DT_GGML_Q4_0)
G32_FNS(q4_1, CQ_DT_GGML_Q4_1)
G32_FNS(q5_0, CQ_DT_GGML_Q5_0)
G32_FNS(q5_1, CQ_DT_GGML_Q5_1)
G32_FNS(iq4_nl, CQ_DT_GGML_IQ4_NL)

/* q8_0, R rows from r side by side (R weight streams, which read faster from DRAM than
 * one). Per row and step of sixteen blocks: the codes against xq by vpdpbusd as u8 codes
 * q + 128 (VNNI: XOR128 = 1; the step's 128 * (sum of xq) per block, shared by the rows,
 * taken off after the fold), or as |q| against xq with q's sign (maddubs + madd: their
 * 16-bit pair sums stay in range); both give the exact integer sum of each block, folded
 * (g32_fold16) and met by d_w * d_x in one FMA. The remaining blocks go two a step,
 * each pair's float term into f0 or f1 by step parity. Every row, whichever R, runs the
 * same operations in the same order, so the same bits. */
#define G32_Q8_0_ROWS(DOT, R, XOR128)                                                              \
    const size_t gpr = m->cols / CQ_GROUP;                                                         \
    const uint8_t *row = m->data + r * gpr * 34;                                                   \
    const __m512i zero = _mm512_setzero_si512(), sgn = _mm512_set1_epi8((char)0x80);               \
    const __m512i order = _mm512_loadu_si512((const void *)G32_FOLD_ORDER);                                       \
    const __m512i ev = _mm512_add_epi32(order, order), od = _mm512_add_epi32(ev, _mm512_set1_epi32(1)); \
    static const uint8_t zblk[34] = {0};                                                           \
    __m512 acc[R], f0[R], f1[R];                                                                   \
    for (int k = 0; k < (R); k++) acc[k] = f0[k] = f1[k] = _mm512_setzero_ps();                    \
    size_t g = 0;                                                                                  \
    for (; g + 16 <= gpr; g += 16) {                                                               \
        __m512i x[8];                                                                              \
        for (int i = 0; i < 8; i++) x[i] = _mm512_load_si512((const void *)(xq->q + CQ_GROUP * g + 64 * i)); \
        const __m512 dx = _mm512_permutexvar_ps(order, _mm512_loadu_ps(xq->d + g));                \
        __m512i corr = zero;                                                                       \
        if (XOR128) {                                                                              \
            const __m512i b0 = _mm512_loadu_si512((const void *)(xq->bias + 2 * g));               \
            const __m512i b1 = _mm512_loadu_si512((const void *)(xq->bias + 2 * g + 16));          \
            corr = _mm512_slli_epi32(_mm512_add_epi32(_mm512_permutex2var_epi32(b0, ev, b1),       \
                                                      _mm512_permutex2var_epi32(b0, od, b1)), 7);  \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int k = 0; k < (R); k++) {                                    \
            const uint8_t *p = row + (k * gpr + g) * 34;                                           \
            for (int o = 0; o < 16 * 34; o += 64) CQ_STREAM_PF(p + o);                             \
            __m512i s[8];                                                                          \
            for (int i = 0; i < 8; i++) {                                                          \
                const __m512i v = _mm512_inserti64x4(                                              \
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 68 * i + 2))), \
                    _mm256_loadu_si256((const __m256i *)(p + 68 * i + 36)), 1);                    \
                s[i] = XOR128 ? DOT(zero, _mm512_xor_si512(v, sgn), x[i])                          \
                              : DOT(zero, _mm512_abs_epi8(v),                                      \
                                    _mm512_mask_sub_epi8(x[i], _mm512_movepi8_mask(v), zero, x[i])); \
            }                                                                                      \
            const __m512i isum = _mm512_sub_epi32(g32_fold16(s), corr);                            \
            acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(g32_halves16(p, 34, G32_FOLD_ORDER), dx), acc[k]); \
        }                                                                                          \
    }                                                                                              \
    for (; g < gpr; g += 2) {                                                                      \
        const __m512i x = _mm512_load_si512((const void *)(xq->q + CQ_GROUP * g));                 \
        const __m512 dl = _mm512_load_ps(xq->dl + CQ_GROUP * g / 4);                               \
        _Pragma("GCC unroll 4") for (int k = 0; k < (R); k++) {                                    \
            const uint8_t *p0 = row + (k * gpr + g) * 34, *p1 = g + 1 < gpr ? p0 + 34 : zblk;      \
            CQ_STREAM_PF(p0);                                                                      \
            const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p0 + 2))), \
                                                 _mm256_loadu_si256((const __m256i *)(p1 + 2)), 1); \
            const __m512i xs = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(v), zero, x);           \
            const __m512i isum = DOT(zero, _mm512_abs_epi8(v), xs);                                \
            const __m512 sc = _mm512_mul_ps(g32_scales2(cq_ld16(p0), cq_ld16(p1)), dl);            \
            const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), sc);                          \
            if (g & 2) f1[k] = _mm512_add_ps(f1[k], t);                                            \
            else f0[k] = _mm512_add_ps(f0[k], t);                                                  \
        }                                                                                          \
    }                                                                                              \
    for (int k = 0; k < (R); k++) out[k] = _mm512_reduce_add_ps(_mm512_add_ps(acc[k], _mm512_add_ps(f0[k], f1[k])))

typedef void (*g32_rows_fn)(const cq_qmat *, size_t, const cq_xq *, float *);
static void g32_q8_0_rows2_bw(const cq_qmat *m, size_t r, const cq_xq *xq, float *out) { G32_Q8_0_ROWS(dot_bw, 2, 0); }
static void g32_q8_0_rows1_bw(const cq_qmat *m, size_t r, const cq_xq *xq, float *out) { G32_Q8_0_ROWS(dot_bw, 1, 0); }
#ifdef CQ_HAVE_VNNI_FN
__attribute__((target("avx512vnni"))) static void g32_q8_0_rows2_vnni(const cq_qmat *m, size_t r, const cq_xq *xq,
                                                                    float *out) {
    G32_Q8_0_ROWS(_mm512_dpbusd_epi32, 2, 1);
}
__attribute__((target("avx512vnni"))) static void g32_q8_0_rows1_vnni(const cq_qmat *m, size_t r, const cq_xq *xq,
                                                                    float *out) {
    G32_Q8_0_ROWS(_mm512_dpbusd_epi32, 1, 1);
}
#endif

typedef float (*g32_row_fn)(const cq_qmat *, size_t, const cq_xq *);
static void ggml_q32_i8_rows(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *xq, float *out) {
    g32_row_fn f;
    if (m->dtype == CQ_DT_GGML_Q8_0) {
        g32_rows_fn f2 = g32_q8_0_rows2_bw, f1 = g32_q8_0_rows1_bw;
#ifdef CQ_HAVE_VNNI_FN
        if (cq_cpu_features() & CQ_CPU_AVX512VNNI) f2 = g32_q8_0_rows2_vnni, f1 = g32_q8_0_rows1_vnni;
#endif
        for (; nr >= 2; nr -= 2, r0 += 2, out += 2) f2(m, r0, xq, out);
        if (nr) f1(m, r0, xq, out);
        return;
    }
#ifdef CQ_HAVE_VNNI_FN
    if (cq_cpu_features() & CQ_CPU_AVX512VNNI) {
        switch (m->dtype) {
        case CQ_DT_GGML_Q4_0: f = g32_q4_0_vnni; break;
        case CQ_DT_GGML_Q4_1: f = g32_q4_1_vnni; break;
        case CQ_DT_GGML_Q5_0: f = g32_q5_0_vnni; break;
        case CQ_DT_GGML_Q5_1: f = g32_q5_1_vnni; break;
        default: f = g32_iq4_nl_vnni; break;
        }
        for (size_t j = 0; j < nr; j++) out[j] = f(m, r0 + j, xq);
        return;
    }
#endif
    switch (m->dtype) {
    case CQ_DT_GGML_Q4_0: f = g32_q4_0_bw; break;
    case CQ_DT_GGML_Q4_1: f = g32_q4_1_bw; break;
    case CQ_DT_GGML_Q5_0: f = g32_q5_0_bw; break;
    case CQ_DT_GGML_Q5_1: f = g32_q5_1_bw; break;
    default: f = g32_iq4_nl_bw; break;
    }
    for (size_t j = 0; j < nr; j++) out[j] = f(m, r0 + j, xq);
}
#endif
