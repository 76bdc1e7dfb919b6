/* nystrom_avx2.c -- AVX2/FMA twin of nystrom_ref.c: the same algorithm (nystrom_body.h)
 * with 8-lane FMA dot/axpy/scale and scalar tails. Differs from the reference only by
 * rounding (two accumulators in the dot, fused multiply-adds). */
#include "../cortiq.h"
#include <immintrin.h>
#include <stddef.h>

static inline float NYS_DOT(const float *a, const float *b, size_t n) {
    size_t i = 0;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s0 = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float s = _mm_cvtss_f32(h);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
static inline void NYS_AXPY(float *y, float a, const float *x, size_t n) {
    size_t i = 0;
    __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}
static inline void NYS_SCALE(float *y, float a, size_t n) {
    size_t i = 0;
    __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] *= a;
}

#include "nystrom_body.h"

const cq_nystrom_ops cq_nystrom_avx2 = {nys_absorb, nys_step, nys_readout, nys_seg_means};
