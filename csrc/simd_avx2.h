/* simd_avx2.h -- small AVX2/FMA helpers shared by the *_avx2.c twins (horizontal sums,
 * the two-accumulator dot). Include only from files compiled with AVX2 flags. */
#ifndef CQ_SIMD_AVX2_H
#define CQ_SIMD_AVX2_H
#if !defined(__AVX2__) || !defined(__FMA__)
#error "simd_avx2.h is for translation units compiled with -mavx2 -mfma"
#endif
#include <immintrin.h>
#include <stddef.h>

static inline float cq_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float cq_hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* sum a[i]*b[i] with two 8-lane FMA accumulators over 16-element steps, one more
 * 8-element step, then a scalar tail: the order every AVX2 dot in cortiq uses. */
static inline float cq_dot8(const float *a, const float *b, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    if (i + 8 <= n) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        i += 8;
    }
    float s = cq_hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
#endif
