/* matvec_avx512.c -- AVX-512 twin of the matvec family: the f32/f16/bf16/q8 row dots
 * run 16 lanes (in-cache q8_row 22.4 vs 16.2 Gweights/s, f16 15.7 vs 13.7 on the
 * development VM, one thread); everything else is the AVX2 code of
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
