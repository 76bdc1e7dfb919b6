/* matvec_avx512.c -- AVX-512 twin of the matvec family: the f32/f16/bf16/q8 and q4
 * (q4_block, q4_tiled, q4tp) row dots run 16 lanes (one thread, in cache, on the
 * development VM: q8_row 22.4 vs 16.2 Gweights/s, f16 15.7 vs 13.7; q4: see
 * docs/ARCHITECTURE.md); q2tp, the decoders and matmat are the AVX2 code of
 * matvec_avx2_impl.h. Same contracts as the reference. */
#include "matvec_avx2_impl.h"

static inline __m512 z_i8(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline __m512 z_f16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline __m512 z_bf16(const uint8_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
static inline __m512 z_f32(const uint8_t *p) { return _mm512_loadu_ps((const float *)p); }

#define CQ_DOT_STREAM16(LOAD, EB, SCALAR)                                                 \
    do {                                                                                 \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                       \
        size_t c = 0;                                                                    \
        for (; c + 64 <= cols; c += 64) {                                                \
            a0 = _mm512_fmadd_ps(LOAD(p + (c + 0) * EB), _mm512_loadu_ps(x + c + 0), a0);   \
            a1 = _mm512_fmadd_ps(LOAD(p + (c + 16) * EB), _mm512_loadu_ps(x + c + 16), a1); \
            a2 = _mm512_fmadd_ps(LOAD(p + (c + 32) * EB), _mm512_loadu_ps(x + c + 32), a2); \
            a3 = _mm512_fmadd_ps(LOAD(p + (c + 48) * EB), _mm512_loadu_ps(x + c + 48), a3); \
        }                                                                                \
        for (; c + 16 <= cols; c += 16) a0 = _mm512_fmadd_ps(LOAD(p + c * EB), _mm512_loadu_ps(x + c), a0); \
        acc = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))); \
        for (; c < cols; c++) acc += (SCALAR) * x[c];                                    \
    } while (0)

/* q4 group on 16 lanes: the 16 bytes widen once; low nibbles (even elements) meet
 * xg[0..15], high nibbles (odd elements) xg[16..31] (x permuted by prep_x). */
static inline __m512 q4_gdot16(const uint8_t *nib, const float *xg) {
    const __m512i m15 = _mm512_set1_epi32(15), eight = _mm512_set1_epi32(8);
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)nib));
    __m512 lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(b, m15), eight));
    __m512 hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(b, 4), eight));
    return _mm512_fmadd_ps(hi, _mm512_loadu_ps(xg + 16), _mm512_mul_ps(lo, _mm512_loadu_ps(xg)));
}

/* q4_block / q4_tiled / q4tp rows (cols % 32 == 0): acc += gs * scale per group. */
static float q4_dot512(const cq_qmat *m, size_t r, const float *x) {
    const size_t cols = m->cols, gpr = cols / CQ_GROUP;
    const uint8_t *d = m->data;
    __m512 t0 = _mm512_setzero_ps(), t1 = t0;
    size_t g = 0;
    if (m->dtype == CQ_DT_Q4_BLOCK) {
        const uint8_t *nb = d + 16 * r * gpr, *sp = d + 16 * m->rows * gpr + 2 * r * gpr;
        float sc[8];
        for (; g + 8 <= gpr; g += 8) {
            _mm256_storeu_ps(sc, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sp + 2 * g))));
            for (int k = 0; k < 8; k += 2) {
                t0 = _mm512_fmadd_ps(q4_gdot16(nb + 16 * (g + k), x + 32 * (g + k)), _mm512_set1_ps(sc[k]), t0);
                t1 = _mm512_fmadd_ps(q4_gdot16(nb + 16 * (g + k + 1), x + 32 * (g + k + 1)), _mm512_set1_ps(sc[k + 1]), t1);
            }
        }
        for (; g < gpr; g++)
            t0 = _mm512_fmadd_ps(q4_gdot16(nb + 16 * g, x + 32 * g), _mm512_set1_ps(h2f_hw(sp + 2 * g)), t0);
    } else if (m->dtype == CQ_DT_Q4_TILED) {
        const uint8_t *tl = d + 18 * r * gpr;
        for (; g + 2 <= gpr; g += 2) {
            t0 = _mm512_fmadd_ps(q4_gdot16(tl + 18 * g + 2, x + 32 * g), _mm512_set1_ps(h2f_hw(tl + 18 * g)), t0);
            t1 = _mm512_fmadd_ps(q4_gdot16(tl + 18 * g + 20, x + 32 * g + 32), _mm512_set1_ps(h2f_hw(tl + 18 * g + 18)), t1);
        }
        for (; g < gpr; g++)
            t0 = _mm512_fmadd_ps(q4_gdot16(tl + 18 * g + 2, x + 32 * g), _mm512_set1_ps(h2f_hw(tl + 18 * g)), t0);
    } else { /* q4tp */
        const size_t stride = cq_tp_stride(cols);
        const uint8_t *body = d + r * gpr * 16;
        const uint8_t *cb = d + m->rows * gpr * 16 + 4 * m->rows + r * stride;
        const float *ladder = m->aux + 32 * r;
        for (size_t g0 = 0; g0 < gpr; g0 += 64) {
            uint8_t codes[64];
            size_t ng = gpr - g0 < 64 ? gpr - g0 : 64, gi = 0;
            tp_codes(cb + 5 * (g0 / 8), stride - 5 * (g0 / 8), ng, codes);
            for (; gi + 2 <= ng; gi += 2) {
                size_t gg = g0 + gi;
                t0 = _mm512_fmadd_ps(q4_gdot16(body + 16 * gg, x + 32 * gg), _mm512_set1_ps(ladder[codes[gi]]), t0);
                t1 = _mm512_fmadd_ps(q4_gdot16(body + 16 * gg + 16, x + 32 * gg + 32), _mm512_set1_ps(ladder[codes[gi + 1]]), t1);
            }
            for (; gi < ng; gi++)
                t0 = _mm512_fmadd_ps(q4_gdot16(body + 16 * (g0 + gi), x + 32 * (g0 + gi)), _mm512_set1_ps(ladder[codes[gi]]), t0);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(t0, t1));
}

static float dot_row(const cq_qmat *m, size_t r, const float *x) {
    const size_t cols = m->cols;
    float acc = 0.0f;
    switch (m->dtype) {
    case CQ_DT_F32: {
        const uint8_t *p = m->data + 4 * r * cols;
        CQ_DOT_STREAM16(z_f32, 4, cq_ldf32(p + 4 * c));
        return acc;
    }
    case CQ_DT_F16: {
        const uint8_t *p = m->data + 2 * r * cols;
        CQ_DOT_STREAM16(z_f16, 2, cq_h2f(cq_ld16(p + 2 * c)));
        return acc;
    }
    case CQ_DT_BF16: {
        const uint8_t *p = m->data + 2 * r * cols;
        CQ_DOT_STREAM16(z_bf16, 2, cq_bf2f(cq_ld16(p + 2 * c)));
        return acc;
    }
    case CQ_DT_Q8_ROW:
    case CQ_DT_Q8_2F: {
        const uint8_t *p = m->data + r * cols;
        CQ_DOT_STREAM16(z_i8, 1, (float)(int8_t)p[c]);
        return acc * m->aux[r];
    }
    case CQ_DT_Q4_BLOCK:
    case CQ_DT_Q4_TILED:
    case CQ_DT_Q4TP:
        if (grouped_fast(m)) return q4_dot512(m, r, x);
        return avx2_dot_row(m, r, x);
    default: return avx2_dot_row(m, r, x);
    }
}

#define dequant_row avx2_dequant_row
#define needs_prep avx2_needs_prep
#define prep_x avx2_prep_x
/* The prefill product stays the AVX2 block: a 4x6 zmm dot block and a packed
 * GEMM-style zmm kernel both measured no faster here (34 vs 34-44 GMAC/s). */
#define matmat_block avx2_matmat_block
#define CQ_MM_ROWS 16

#include "matvec_drivers.h"

CQ_MATVEC_OPS(cq_matvec_avx512);
