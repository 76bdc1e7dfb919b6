/* matvec_avx2_impl.h -- AVX2/FMA/F16C row kernels of the matvec family. Included by
 * matvec_avx2.c and matvec_avx512.c only (both compiled with -mavx2 -mfma -mf16c).
 * Numerics: weights decode to the exact float32 values of the reference; the dot
 * products keep several 8-lane FMA accumulators and factor the row scale (q8) or
 * the group scale (q4/q2 families) out of the partial sums, so they differ from the
 * reference's sequential sum at float32 rounding level only. */
#ifndef CQ_MATVEC_AVX2_IMPL_H
#define CQ_MATVEC_AVX2_IMPL_H
#include "qmat.h"
#include "matvec_scalar.h"
#include "../simd_avx2.h"
#include "ggml_kq_decode_avx2.h"

static inline __m256 ld_f16x8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline __m256 ld_bf16x8(const uint8_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline __m256 ld_i8x8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline float h2f_hw(const uint8_t *p) { return _cvtsh_ss(cq_ld16(p)); }

/* The weight stream's prefetches at byte address a (once per 64-byte line): far into
 * L2 and near into L1 (qmat.h: CQ_PF_DIST, CQ_PF_NEAR). */
#define CQ_STREAM_PF(a)                                                       \
    do {                                                                      \
        _mm_prefetch((const char *)(a) + CQ_PF_DIST, _MM_HINT_T1);            \
        _mm_prefetch((const char *)(a) + CQ_PF_NEAR, _MM_HINT_T0);            \
    } while (0)
/* ... for steps of n (64 < n <= 128) bytes, q4_tiled's 72-byte blocks: each step
 * prefetches the line of its last byte, and the line after it too when the next step's
 * last byte will skip that line (one step in eight for 72-byte steps). Prefetching the
 * first and the last byte's lines of every step (two pairs a step, most of them
 * repeats) read a few points slower from DRAM. */
#define CQ_STREAM_PF_SPAN(a, n)                                               \
    do {                                                                      \
        const char *e_ = (const char *)(a) + (n) - 1;                         \
        CQ_STREAM_PF(e_);                                                     \
        if (((uintptr_t)e_ & 63) >= 128 - (n)) CQ_STREAM_PF(e_ + 64);         \
    } while (0)

/* One generic 8-lane stream: LOAD(p + k*EB) gives 8 floats of elements k..k+7, EB >= 2
 * bytes an element (f32, f16, bf16: a step covers whole lines; q8 rows: q8_rows.h).
 * Stepping pointers (CQ_STEPPING): the hot loops walk the weights and x with pointers
 * of their own and count no columns, because GCC turns a live column counter into
 * indexed addressing (x + 4c), and an FMA with an indexed memory operand is
 * un-laminated into two uops on these Intel cores, which costs streaming bandwidth
 * (a few points of the read bandwidth from DRAM: docs/PERFORMANCE.md). */
#define CQ_DOT_STREAM(LOAD, EB, SCALAR)                                              \
    do {                                                                            \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                  \
        const uint8_t *pc_ = p; /* CQ_STEPPING, above */                      \
        const float *xc_ = x, *const xe_ = x + (cols & ~(size_t)31);                \
        for (; xc_ < xe_; pc_ += 32 * EB, xc_ += 32) {                              \
            for (size_t o_ = 0; o_ < 32 * EB; o_ += 64) /* each line once (EB >= 2) */ \
                CQ_STREAM_PF(pc_ + o_);                                             \
            a0 = _mm256_fmadd_ps(LOAD(pc_), _mm256_loadu_ps(xc_), a0);               \
            a1 = _mm256_fmadd_ps(LOAD(pc_ + 8 * EB), _mm256_loadu_ps(xc_ + 8), a1);  \
            a2 = _mm256_fmadd_ps(LOAD(pc_ + 16 * EB), _mm256_loadu_ps(xc_ + 16), a2); \
            a3 = _mm256_fmadd_ps(LOAD(pc_ + 24 * EB), _mm256_loadu_ps(xc_ + 24), a3); \
        }                                                                           \
        size_t c = (size_t)(xc_ - x);                                               \
        for (; c + 8 <= cols; c += 8) a0 = _mm256_fmadd_ps(LOAD(p + c * EB), _mm256_loadu_ps(x + c), a0); \
        acc = cq_hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));   \
        for (; c < cols; c++) acc += (SCALAR) * x[c];                               \
    } while (0)

static inline __m256 ld_f32x8(const uint8_t *p) { return _mm256_loadu_ps((const float *)p); }

/* 16 bytes of nibbles (element 2k low, 2k+1 high of byte k) -> 32 int8 in order,
 * minus 8: a = elements 0..15, b = 16..31. */
static inline void q4_unpack(const uint8_t *p, __m128i *a, __m128i *b) {
    const __m128i m = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    *a = _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), eight);
    *b = _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), eight);
}
/* 8 bytes of 2-bit fields (element 4k+j = bits 2j.. of byte k) -> 32 int8 (2v - 3). */
static inline void q2_unpack(const uint8_t *p, __m128i *a, __m128i *b) {
    const __m128i m = _mm_set1_epi8(3), three = _mm_set1_epi8(3);
    __m128i v = _mm_loadl_epi64((const __m128i *)p);
    __m128i e0 = _mm_and_si128(v, m), e1 = _mm_and_si128(_mm_srli_epi16(v, 2), m);
    __m128i e2 = _mm_and_si128(_mm_srli_epi16(v, 4), m), e3 = _mm_and_si128(_mm_srli_epi16(v, 6), m);
    __m128i A = _mm_unpacklo_epi8(e0, e1), B = _mm_unpacklo_epi8(e2, e3);
    __m128i L = _mm_unpacklo_epi16(A, B), H = _mm_unpackhi_epi16(A, B);
    *a = _mm_sub_epi8(_mm_add_epi8(L, L), three);
    *b = _mm_sub_epi8(_mm_add_epi8(H, H), three);
}
static inline __m256 i8lo(__m128i a) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a)); }
static inline __m256 i8hi(__m128i a) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(a, 8))); }

/* sum over one group of 32 of q * x (q from a, b). */
static inline __m256 grp_dot(__m128i a, __m128i b, const float *x) {
    __m256 s = _mm256_mul_ps(i8lo(a), _mm256_loadu_ps(x));
    s = _mm256_fmadd_ps(i8hi(a), _mm256_loadu_ps(x + 8), s);
    s = _mm256_fmadd_ps(i8lo(b), _mm256_loadu_ps(x + 16), s);
    return _mm256_fmadd_ps(i8hi(b), _mm256_loadu_ps(x + 24), s);
}
static inline void grp_store(__m128i a, __m128i b, __m256 s, float *o) {
    _mm256_storeu_ps(o, _mm256_mul_ps(i8lo(a), s));
    _mm256_storeu_ps(o + 8, _mm256_mul_ps(i8hi(a), s));
    _mm256_storeu_ps(o + 16, _mm256_mul_ps(i8lo(b), s));
    _mm256_storeu_ps(o + 24, _mm256_mul_ps(i8hi(b), s));
}

/* Tile codes of a q4tp/q2tp row, 8 at a time (5 bytes hold 8 codes). */
static inline void tp_codes(const uint8_t *cb, size_t stride, size_t gpr, uint8_t *codes) {
    size_t g = 0;
    for (; g + 8 <= gpr; g += 8) {
        const uint8_t *p = cb + 5 * (g / 8);
        uint64_t v = (uint64_t)p[0] | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16) |
                     ((uint64_t)p[3] << 24) | ((uint64_t)p[4] << 32);
        for (int k = 0; k < 8; k++) codes[g + k] = (uint8_t)((v >> (5 * k)) & 31u);
    }
    for (; g < gpr; g++) codes[g] = (uint8_t)tp_code(cb, stride, g);
}

/* Can the grouped fast path run (groups aligned to rows)? */
static inline int grouped_fast(const cq_qmat *m) {
    switch (m->dtype) {
    case CQ_DT_Q4_BLOCK: case CQ_DT_Q4_TILED: case CQ_DT_Q4TP: case CQ_DT_Q2TP:
        return m->cols % CQ_GROUP == 0;
    default: return 0; /* vbit/vbit_ro and odd shapes: the scalar decoder */
    }
}

/* Group g of row r of a grouped dtype: its 32 weights as int8 (a, b) and its scale. */
#define CQ_GROUP_LOOP(...) /* groups [ga, gb) of row r */                               \
    do {                                                                                \
        const size_t gpr = cols / CQ_GROUP;                                             \
        const uint8_t *d = m->data;                                                     \
        switch (m->dtype) {                                                             \
        case CQ_DT_Q4_BLOCK: {                                                          \
            const uint8_t *nb = d + 16 * r * gpr, *sp = d + 16 * m->rows * gpr + 2 * r * gpr; \
            for (size_t g = ga; g < gb; g++) {                                          \
                __m128i a, b;                                                           \
                q4_unpack(nb + 16 * g, &a, &b);                                         \
                float sc = h2f_hw(sp + 2 * g);                                          \
                __VA_ARGS__;                                                                   \
            }                                                                           \
            break;                                                                      \
        }                                                                               \
        case CQ_DT_Q4_TILED: {                                                          \
            const uint8_t *tl = d + 18 * r * gpr;                                       \
            for (size_t g = ga; g < gb; g++) {                                          \
                __m128i a, b;                                                           \
                q4_unpack(tl + 18 * g + 2, &a, &b);                                     \
                float sc = h2f_hw(tl + 18 * g);                                         \
                __VA_ARGS__;                                                                   \
            }                                                                           \
            break;                                                                      \
        }                                                                               \
        case CQ_DT_Q4TP:                                                                \
        case CQ_DT_Q2TP: {                                                              \
            const int q4 = m->dtype == CQ_DT_Q4TP;                                      \
            const size_t tile = q4 ? 16 : 8, stride = cq_tp_stride(cols);               \
            const uint8_t *body = d + r * gpr * tile;                                   \
            const uint8_t *cb = d + m->rows * gpr * tile + 4 * m->rows + r * stride;    \
            const float *ladder = m->aux + 32 * r;                                      \
            for (size_t g0 = ga & ~(size_t)7; g0 < gb; g0 += 64) { /* codes: 8 per 5 bytes */ \
                uint8_t codes[64];                                                      \
                size_t ng = gb - g0 < 64 ? gb - g0 : 64;                                \
                tp_codes(cb + 5 * (g0 / 8), stride - 5 * (g0 / 8), ng, codes);          \
                for (size_t gi = g0 < ga ? ga - g0 : 0; gi < ng; gi++) {                \
                    size_t g = g0 + gi;                                                 \
                    __m128i a, b;                                                       \
                    if (q4) q4_unpack(body + 16 * g, &a, &b);                           \
                    else q2_unpack(body + 8 * g, &a, &b);                               \
                    float sc = ladder[codes[gi]];                                       \
                    __VA_ARGS__;                                                               \
                }                                                                       \
            }                                                                           \
            break;                                                                      \
        }                                                                               \
        default: break;                                                                 \
        }                                                                               \
    } while (0)

/* Grouped dtypes (cols % 32 == 0). x arrives permuted per group by prep_x:
 * q4: [16 even elements][16 odd elements] (low nibbles, then high nibbles);
 * q2: [8 elements 4k][8 elements 4k+1][.. 4k+2][.. 4k+3] (the 2-bit field j of byte k).
 * So each byte widens once (vpmovzxbd) and its fields need no re-interleaving.
 * Per group: gs = sum q*x over its 32 weights (q = nibble - 8, or 2v - 3 for q2),
 * then acc += gs * scale (two alternating accumulators). */
static inline __m256 q4_gdot(const uint8_t *nib, const float *xg) {
    const __m256i m15 = _mm256_set1_epi32(15), eight = _mm256_set1_epi32(8);
    __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)nib));
    __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(nib + 8)));
    __m256 l0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b0, m15), eight));
    __m256 l1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b1, m15), eight));
    __m256 h0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b0, 4), eight));
    __m256 h1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b1, 4), eight));
    __m256 ga = _mm256_fmadd_ps(h0, _mm256_loadu_ps(xg + 16), _mm256_mul_ps(l0, _mm256_loadu_ps(xg)));
    __m256 gb = _mm256_fmadd_ps(h1, _mm256_loadu_ps(xg + 24), _mm256_mul_ps(l1, _mm256_loadu_ps(xg + 8)));
    return _mm256_add_ps(ga, gb);
}
static inline __m256 q2_gdot(const uint8_t *q, const float *xg) {
    const __m256i m3 = _mm256_set1_epi32(3), three = _mm256_set1_epi32(3);
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
    __m256i v0 = _mm256_and_si256(b, m3), v1 = _mm256_and_si256(_mm256_srli_epi32(b, 2), m3);
    __m256i v2 = _mm256_and_si256(_mm256_srli_epi32(b, 4), m3), v3 = _mm256_srli_epi32(b, 6);
    __m256 f0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_add_epi32(v0, v0), three));
    __m256 f1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_add_epi32(v1, v1), three));
    __m256 f2 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_add_epi32(v2, v2), three));
    __m256 f3 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_add_epi32(v3, v3), three));
    __m256 ga = _mm256_fmadd_ps(f1, _mm256_loadu_ps(xg + 8), _mm256_mul_ps(f0, _mm256_loadu_ps(xg)));
    __m256 gb = _mm256_fmadd_ps(f3, _mm256_loadu_ps(xg + 24), _mm256_mul_ps(f2, _mm256_loadu_ps(xg + 16)));
    return _mm256_add_ps(ga, gb);
}

static float grouped_dot(const cq_qmat *m, size_t r, const float *x) {
    const size_t cols = m->cols, gpr = cols / CQ_GROUP;
    const uint8_t *d = m->data;
    __m256 t0 = _mm256_setzero_ps(), t1 = t0;
    size_t g = 0;
    switch (m->dtype) {
    case CQ_DT_Q4_BLOCK: {
        const uint8_t *nb = d + 16 * r * gpr, *sp = d + 16 * m->rows * gpr + 2 * r * gpr;
        float sc[8];
        for (; g + 8 <= gpr; g += 8) {
            CQ_STREAM_PF(nb + 16 * g);
            CQ_STREAM_PF(nb + 16 * g + 64);
            _mm256_storeu_ps(sc, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sp + 2 * g))));
            for (int k = 0; k < 8; k += 2) {
                t0 = _mm256_fmadd_ps(q4_gdot(nb + 16 * (g + k), x + 32 * (g + k)), _mm256_broadcast_ss(sc + k), t0);
                t1 = _mm256_fmadd_ps(q4_gdot(nb + 16 * (g + k + 1), x + 32 * (g + k + 1)), _mm256_broadcast_ss(sc + k + 1), t1);
            }
        }
        for (; g < gpr; g++)
            t0 = _mm256_fmadd_ps(q4_gdot(nb + 16 * g, x + 32 * g), _mm256_set1_ps(h2f_hw(sp + 2 * g)), t0);
        break;
    }
    case CQ_DT_Q4_TILED: {
        const uint8_t *tl = d + 18 * r * gpr;
        for (; g + 2 <= gpr; g += 2) {
            CQ_STREAM_PF(tl + 18 * g);
            t0 = _mm256_fmadd_ps(q4_gdot(tl + 18 * g + 2, x + 32 * g), _mm256_set1_ps(h2f_hw(tl + 18 * g)), t0);
            t1 = _mm256_fmadd_ps(q4_gdot(tl + 18 * g + 20, x + 32 * g + 32), _mm256_set1_ps(h2f_hw(tl + 18 * g + 18)), t1);
        }
        for (; g < gpr; g++)
            t0 = _mm256_fmadd_ps(q4_gdot(tl + 18 * g + 2, x + 32 * g), _mm256_set1_ps(h2f_hw(tl + 18 * g)), t0);
        break;
    }
    case CQ_DT_Q4TP:
    case CQ_DT_Q2TP: {
        const int q4 = m->dtype == CQ_DT_Q4TP;
        const size_t tile = q4 ? 16 : 8, stride = cq_tp_stride(cols);
        const uint8_t *body = d + r * gpr * tile;
        const uint8_t *cb = d + m->rows * gpr * tile + 4 * m->rows + r * stride;
        const float *ladder = m->aux + 32 * r;
        for (size_t g0 = 0; g0 < gpr; g0 += 64) {
            uint8_t codes[64];
            size_t ng = gpr - g0 < 64 ? gpr - g0 : 64;
            tp_codes(cb + 5 * (g0 / 8), stride - 5 * (g0 / 8), ng, codes);
            size_t gi = 0;
            if (q4) {
                for (; gi + 2 <= ng; gi += 2) {
                    size_t gg = g0 + gi;
                    CQ_STREAM_PF(body + 16 * gg);
                    t0 = _mm256_fmadd_ps(q4_gdot(body + 16 * gg, x + 32 * gg), _mm256_broadcast_ss(ladder + codes[gi]), t0);
                    t1 = _mm256_fmadd_ps(q4_gdot(body + 16 * gg + 16, x + 32 * gg + 32), _mm256_broadcast_ss(ladder + codes[gi + 1]), t1);
                }
                for (; gi < ng; gi++)
                    t0 = _mm256_fmadd_ps(q4_gdot(body + 16 * (g0 + gi), x + 32 * (g0 + gi)), _mm256_broadcast_ss(ladder + codes[gi]), t0);
            } else {
                for (; gi + 2 <= ng; gi += 2) {
                    size_t gg = g0 + gi;
                    if ((gi & 7) == 0) CQ_STREAM_PF(body + 8 * gg);
                    t0 = _mm256_fmadd_ps(q2_gdot(body + 8 * gg, x + 32 * gg), _mm256_broadcast_ss(ladder + codes[gi]), t0);
                    t1 = _mm256_fmadd_ps(q2_gdot(body + 8 * gg + 8, x + 32 * gg + 32), _mm256_broadcast_ss(ladder + codes[gi + 1]), t1);
                }
                for (; gi < ng; gi++)
                    t0 = _mm256_fmadd_ps(q2_gdot(body + 8 * (g0 + gi), x + 32 * (g0 + gi)), _mm256_broadcast_ss(ladder + codes[gi]), t0);
            }
        }
        break;
    }
    default: break;
    }
    float acc = cq_hsum8(_mm256_add_ps(t0, t1));
    return m->dtype == CQ_DT_Q2TP ? acc * 0.5f : acc;
}

#include "ggml_q32_avx2.h"

static float avx2_dot_row(const cq_qmat *m, size_t r, const float *x) {
    const size_t cols = m->cols;
    float acc = 0.0f;
    switch (m->dtype) {
    case CQ_DT_F32: {
        const uint8_t *p = m->data + 4 * r * cols;
        CQ_DOT_STREAM(ld_f32x8, 4, cq_ldf32(p + 4 * c));
        return acc;
    }
    case CQ_DT_F16: {
        const uint8_t *p = m->data + 2 * r * cols;
        CQ_DOT_STREAM(ld_f16x8, 2, cq_h2f(cq_ld16(p + 2 * c)));
        return acc;
    }
    case CQ_DT_BF16: {
        const uint8_t *p = m->data + 2 * r * cols;
        CQ_DOT_STREAM(ld_bf16x8, 2, cq_bf2f(cq_ld16(p + 2 * c)));
        return acc;
    }
    default: break; /* q8: q8_row_dot (q8_rows.h) in each ISA file */
    }
    if (kq_is(m->dtype)) return kq_dot_row_avx2(m, r, x);
    if (ggml_q32_block_bytes(m->dtype)) return g32_dot_avx2(m, r, x);
    if (!grouped_fast(m)) return ref_row(m, r, x, NULL);
    return grouped_dot(m, r, x);
}

/* Columns [c0, c1) of row r into out[0 .. c1 - c0); for the grouped dtypes c0 is a
 * multiple of 32 and c1 one too or cols; dtypes the reference decodes (vbit, grouped
 * dtypes with cols % 32 != 0) take whole rows only. matmat decodes a chunk of columns
 * at a time, so the rows it multiplies stay in L1. */
static void avx2_dequant_span(const cq_qmat *m, size_t r, size_t c0, size_t c1, float *out) {
    const size_t cols = m->cols;
    size_t c = c0;
    switch (m->dtype) {
    case CQ_DT_F32:
        memcpy(out, m->data + 4 * (r * cols + c0), (c1 - c0) * sizeof(float));
        return;
    case CQ_DT_F16: {
        const uint8_t *p = m->data + 2 * r * cols;
        for (; c + 8 <= c1; c += 8) _mm256_storeu_ps(out + (c - c0), ld_f16x8(p + 2 * c));
        for (; c < c1; c++) out[c - c0] = cq_h2f(cq_ld16(p + 2 * c));
        return;
    }
    case CQ_DT_BF16: {
        const uint8_t *p = m->data + 2 * r * cols;
        for (; c + 8 <= c1; c += 8) _mm256_storeu_ps(out + (c - c0), ld_bf16x8(p + 2 * c));
        for (; c < c1; c++) out[c - c0] = cq_bf2f(cq_ld16(p + 2 * c));
        return;
    }
    case CQ_DT_Q8_ROW: {
        const uint8_t *p = m->data + r * cols;
        float s = m->aux[r];
        __m256 vs = _mm256_set1_ps(s);
        for (; c + 8 <= c1; c += 8) _mm256_storeu_ps(out + (c - c0), _mm256_mul_ps(ld_i8x8(p + c), vs));
        for (; c < c1; c++) out[c - c0] = (float)(int8_t)p[c] * s;
        return;
    }
    case CQ_DT_Q8_2F: {
        const uint8_t *p = m->data + r * cols;
        const float *col = m->aux + m->rows;
        float s = m->aux[r];
        __m256 vs = _mm256_set1_ps(s);
        for (; c + 8 <= c1; c += 8)
            _mm256_storeu_ps(out + (c - c0), _mm256_mul_ps(_mm256_mul_ps(ld_i8x8(p + c), vs), _mm256_loadu_ps(col + c)));
        for (; c < c1; c++) out[c - c0] = ((float)(int8_t)p[c] * s) * col[c];
        return;
    }
    default: break;
    }
    if (kq_is(m->dtype)) { /* whole rows (matmat asks no less) */
        kq_dequant_row_avx2(m, r, out);
        return;
    }
    if (ggml_q32_block_bytes(m->dtype)) { /* whole blocks: c0, c1 multiples of 32 */
        g32_decode_avx2(m, r, c0 / CQ_GROUP, c1 / CQ_GROUP, out);
        return;
    }
    if (!grouped_fast(m)) { /* odd shapes, vbit: whole rows only (matmat asks no less) */
        (void)ref_row(m, r, NULL, out);
        return;
    }
    const size_t ga = c0 / CQ_GROUP, gb = (c1 + CQ_GROUP - 1) / CQ_GROUP;
    if (m->dtype == CQ_DT_Q2TP) {
        /* (2v - 3) * 0.5 is v - 1.5 exactly; then * s as the reference does. */
        CQ_GROUP_LOOP({
            float *o = out + CQ_GROUP * (g - ga);
            __m256 h = _mm256_set1_ps(0.5f), s = _mm256_set1_ps(sc);
            _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_mul_ps(i8lo(a), h), s));
            _mm256_storeu_ps(o + 8, _mm256_mul_ps(_mm256_mul_ps(i8hi(a), h), s));
            _mm256_storeu_ps(o + 16, _mm256_mul_ps(_mm256_mul_ps(i8lo(b), h), s));
            _mm256_storeu_ps(o + 24, _mm256_mul_ps(_mm256_mul_ps(i8hi(b), h), s));
        });
    } else {
        CQ_GROUP_LOOP(grp_store(a, b, _mm256_set1_ps(sc), out + CQ_GROUP * (g - ga)));
    }
}

static void avx2_dequant_row(const cq_qmat *m, size_t r, float *out) { avx2_dequant_span(m, r, 0, m->cols, out); }

static int avx2_needs_prep(const cq_qmat *m) {
    switch (m->dtype) {
    case CQ_DT_Q8_2F: return 1;
    case CQ_DT_Q4_BLOCK: case CQ_DT_Q4_TILED: case CQ_DT_Q4TP: case CQ_DT_Q2TP: return grouped_fast(m);
    default: return 0;
    }
}
/* q8_2f: xp = col * x, so a row's dot is rs * sum q * xp. Grouped dtypes: x permuted
 * per group of 32 into the order grouped_dot reads (see there). Written with explicit
 * shuffles (q4) and a plain loop kept scalar (q2): GCC's auto-vectorized version of the
 * permutation spilled and stalled on store forwarding (8.8 us per 4096 columns). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-vectorize")))
#endif
static void avx2_prep_x(const cq_qmat *m, const float *x, float *xp) {
    const size_t cols = m->cols;
    if (m->dtype == CQ_DT_Q8_2F) {
        const float *col = m->aux + m->rows;
        size_t c = 0;
        for (; c + 8 <= cols; c += 8)
            _mm256_storeu_ps(xp + c, _mm256_mul_ps(_mm256_loadu_ps(col + c), _mm256_loadu_ps(x + c)));
        for (; c < cols; c++) xp[c] = col[c] * x[c];
        return;
    }
    for (size_t g = 0; g < cols / CQ_GROUP; g++) {
        const float *xg = x + CQ_GROUP * g;
        float *o = xp + CQ_GROUP * g;
        if (m->dtype == CQ_DT_Q2TP) {
            for (int j = 0; j < 4; j++)
                for (int k = 0; k < 8; k++) o[8 * j + k] = xg[4 * k + j];
        } else { /* evens then odds */
            __m256 x0 = _mm256_loadu_ps(xg), x1 = _mm256_loadu_ps(xg + 8);
            __m256 x2 = _mm256_loadu_ps(xg + 16), x3 = _mm256_loadu_ps(xg + 24);
            const int ord = _MM_SHUFFLE(3, 1, 2, 0);
            __m256 e01 = _mm256_shuffle_ps(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));
            __m256 o01 = _mm256_shuffle_ps(x0, x1, _MM_SHUFFLE(3, 1, 3, 1));
            __m256 e23 = _mm256_shuffle_ps(x2, x3, _MM_SHUFFLE(2, 0, 2, 0));
            __m256 o23 = _mm256_shuffle_ps(x2, x3, _MM_SHUFFLE(3, 1, 3, 1));
            _mm256_storeu_ps(o, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e01), ord)));
            _mm256_storeu_ps(o + 8, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e23), ord)));
            _mm256_storeu_ps(o + 16, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o01), ord)));
            _mm256_storeu_ps(o + 24, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o23), ord)));
        }
    }
}
/* ---- int8 activations (cq_qmat.act; spec: ref_i8_row) on 8 lanes: the row
 * kernel is i8_row in matvec_avx2.c; the pieces both ISA files share are here ---- */
/* q4_block: where the f16 scale of group g of row r lives (after all the nibbles). */
static inline const uint8_t *q4b_scale_at(const cq_qmat *m, size_t r, size_t g) {
    const size_t gpr = m->cols / CQ_GROUP;
    return m->data + 16 * m->rows * gpr + 2 * (r * gpr + g);
}

/* sw[0 .. ng) = the scales of groups g0 .. g0+ng-1 of row r (decoded once per 64
 * groups, off the per-group path). */
static void avx2_group_scales(const cq_qmat *m, size_t r, size_t g0, size_t ng, float *sw) {
    const size_t gpr = m->cols / CQ_GROUP;
    const uint8_t *d = m->data;
    size_t k = 0;
    switch (m->dtype) {
    case CQ_DT_Q4_BLOCK: {
        const uint8_t *sp = q4b_scale_at(m, r, g0);
        for (; k + 8 <= ng; k += 8) _mm256_storeu_ps(sw + k, ld_f16x8(sp + 2 * k));
        for (; k < ng; k++) sw[k] = h2f_hw(sp + 2 * k);
        break;
    }
    case CQ_DT_Q4_TILED: { /* eight halves 18 bytes apart put in one register, one
                            * conversion (a conversion each cost a quarter of the row) */
        const uint8_t *sp = d + 18 * (r * gpr + g0);
        for (; k + 8 <= ng; k += 8) {
            const uint8_t *q = sp + 18 * k;
            const __m128i h = _mm_setr_epi16((short)cq_ld16(q), (short)cq_ld16(q + 18), (short)cq_ld16(q + 36),
                                             (short)cq_ld16(q + 54), (short)cq_ld16(q + 72), (short)cq_ld16(q + 90),
                                             (short)cq_ld16(q + 108), (short)cq_ld16(q + 126));
            _mm256_storeu_ps(sw + k, _mm256_cvtph_ps(h));
        }
        for (; k < ng; k++) sw[k] = h2f_hw(sp + 18 * k);
        break;
    }
    default: { /* q4tp, q2tp: 8 codes (5 bytes) a step, shifted out of one qword and
                * looked up in the row's 32-entry ladder, held in four registers, by a
                * vpermps of each and two blends on the code's bits 3 and 4 (one at a
                * time, the scale decode took about a third of a q4tp int8 row; a
                * vpgatherdd, slow on Zen 4, still about a quarter) */
        const size_t stride = cq_tp_stride(m->cols);
        const uint8_t *cb = d + m->rows * gpr * cq_tp_tile(m->dtype) + 4 * m->rows + r * stride + 5 * (g0 / 8);
        const float *ladder = m->aux + 32 * r;
        const __m256i sh_lo = _mm256_setr_epi64x(0, 5, 10, 15), sh_hi = _mm256_setr_epi64x(20, 25, 30, 35);
        const __m256i m31 = _mm256_set1_epi64x(31), order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
        const __m256 l0 = _mm256_loadu_ps(ladder), l1 = _mm256_loadu_ps(ladder + 8);
        const __m256 l2 = _mm256_loadu_ps(ladder + 16), l3 = _mm256_loadu_ps(ladder + 24);
        for (; k + 8 <= ng; k += 8) {
            const uint8_t *p = cb + 5 * (k / 8);
            uint32_t w;
            memcpy(&w, p, 4);
            const __m256i v = _mm256_set1_epi64x((long long)(w | (uint64_t)p[4] << 32));
            const __m256i lo = _mm256_and_si256(_mm256_srlv_epi64(v, sh_lo), m31);
            const __m256i hi = _mm256_and_si256(_mm256_srlv_epi64(v, sh_hi), m31);
            const __m256i c = _mm256_permutevar8x32_epi32(_mm256_or_si256(lo, _mm256_slli_epi64(hi, 32)), order);
            /* blendv picks by each lane's sign bit: bit 3 moved there, then bit 4 */
            const __m256 b3 = _mm256_castsi256_ps(_mm256_slli_epi32(c, 28));
            const __m256 b4 = _mm256_castsi256_ps(_mm256_slli_epi32(c, 27));
            const __m256 lo8 = _mm256_blendv_ps(_mm256_permutevar8x32_ps(l0, c), _mm256_permutevar8x32_ps(l1, c), b3);
            const __m256 hi8 = _mm256_blendv_ps(_mm256_permutevar8x32_ps(l2, c), _mm256_permutevar8x32_ps(l3, c), b3);
            _mm256_storeu_ps(sw + k, _mm256_blendv_ps(lo8, hi8, b4));
        }
        if (k < ng) {
            uint8_t codes[64];
            tp_codes(cb + 5 * (k / 8), stride - 5 * ((g0 + k) / 8), ng - k, codes);
            for (size_t j = 0; k < ng; k++, j++) sw[k] = ladder[codes[j]];
        }
    }
    }
}

/* One group's quantization on 8 lanes, the same float32 operations as cq_xq_quant32
 * (_mm256_cvtps_epi32 rounds as lrintf does): q[32] in column order, *d. 0 for a
 * group with a NaN, an inf or only zeros (the caller takes the scalar group). */
static inline int avx2_quant32(const float *xg, int32_t *qi, float *d) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 a[4];
    for (int k = 0; k < 4; k++) a[k] = _mm256_loadu_ps(xg + 8 * k);
    __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(a[0], absmask), _mm256_and_ps(a[1], absmask)),
                              _mm256_max_ps(_mm256_and_ps(a[2], absmask), _mm256_and_ps(a[3], absmask)));
    float amax = cq_hmax8(mx);
    __m256 nan = _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(a[0], a[0], _CMP_UNORD_Q), _mm256_cmp_ps(a[1], a[1], _CMP_UNORD_Q)),
                              _mm256_or_ps(_mm256_cmp_ps(a[2], a[2], _CMP_UNORD_Q), _mm256_cmp_ps(a[3], a[3], _CMP_UNORD_Q)));
    /* NaN (max drops it, so asked apart), inf, or all zero */
    if (_mm256_movemask_ps(nan) || !(amax <= 3.4028234663852886e38f) || amax == 0.0f) return 0;
    __m256 id = _mm256_set1_ps(127.0f / amax);
    for (int k = 0; k < 4; k++) _mm256_storeu_si256((__m256i *)(qi + 8 * k), _mm256_cvtps_epi32(_mm256_mul_ps(a[k], id)));
    *d = amax / 127.0f;
    return 1;
}

/* cq_xq_build with the scaling and rounding on 8 lanes; q4's even/odd split and bias
 * written here, the other families' placement by cq_xq_put. */
static void avx2_xq_build(int family, const float *x, size_t cols, void *buf, cq_xq *xq) {
    const size_t ng = cols / CQ_GROUP;
    cq_xq_view(family, buf, cols, xq);
    for (size_t g = 0; g < ng; g++) {
        const float *xg = x + CQ_GROUP * g;
        int32_t qi[32];
        float dg;
        if (!avx2_quant32(xg, qi, &dg)) {
            cq_xq_group(xq, g, xg);
            continue;
        }
        if (family != CQ_XQ_Q4) {
            int8_t q[32];
            for (int k = 0; k < 32; k++) q[k] = (int8_t)qi[k];
            cq_xq_put(xq, g, q, dg);
            continue;
        }
        int8_t *qe = (int8_t *)xq->q + 128 * (g / 4) + 16 * (g % 4), *qo = qe + 64;
        for (int k = 0; k < 16; k++) {
            qe[k] = (int8_t)qi[2 * k];
            qo[k] = (int8_t)qi[2 * k + 1];
        }
        for (int j = 0; j < 4; j++) {
            int32_t sum = 0;
            for (int i = 0; i < 8; i++) sum += qi[8 * j + i];
            ((int32_t *)xq->bias)[4 * g + j] = -8 * sum;
            ((float *)xq->dl)[4 * g + j] = dg;
        }
        ((float *)xq->d)[g] = dg;
    }
}

/* q2tp's phase j (0..3) of code bytes v as the u8 weights 2 * ((v >> 2j) & 3): one
 * 16-bit shift and a mask keep every bit inside its byte. */
#define Q2_PHASE(SHL, SRL, AND, v, j, m6) \
    ((j) == 0 ? AND(SHL(v, 1), m6) : AND(SRL(v, 2 * (j) - 1), m6))
#endif
