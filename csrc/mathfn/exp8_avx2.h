/* exp8_avx2.h -- the 8-lane Cephes exp of the AVX2 twins (the vector form of
 * cq_exp1 in exp8.h, with FMA: within rounding of it, not bit-identical). Include
 * only from files compiled with AVX2 flags. */
#ifndef CQ_EXP8_AVX2_H
#define CQ_EXP8_AVX2_H
#include "exp8.h"
#include "../simd_avx2.h"

/* exp on 8 lanes. min/max take the input as the SECOND operand so a NaN lane
 * propagates (minps/maxps return the second operand when either is NaN). */
static inline __m256 exp8(__m256 x) {
    __m256 v = _mm256_max_ps(_mm256_set1_ps(CQ_EXP_LO), _mm256_min_ps(_mm256_set1_ps(CQ_EXP_HI), x));
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(v, _mm256_set1_ps(CQ_LOG2E), _mm256_set1_ps(0.5f)));
    __m256 g = _mm256_fnmadd_ps(n, _mm256_set1_ps(CQ_EXP_C1), v);
    g = _mm256_fnmadd_ps(n, _mm256_set1_ps(CQ_EXP_C2), g);
    __m256 p = _mm256_set1_ps(CQ_EXP_P0);
    p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(CQ_EXP_P1));
    p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(CQ_EXP_P2));
    p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(CQ_EXP_P3));
    p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(CQ_EXP_P4));
    p = _mm256_fmadd_ps(p, g, _mm256_set1_ps(CQ_EXP_P5));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, g), g, _mm256_add_ps(g, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif
