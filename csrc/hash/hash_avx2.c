/* hash_avx2.c -- hash64 with 4x64-bit lanes. AVX2 has no 64-bit multiply, so x*C is
 * lo(x)*lo(C) + ((hi(x)*lo(C) + lo(x)*hi(C)) << 32) with three vpmuludq. Two vector
 * accumulators (8 words = 64 bytes per iteration); scalar tail from hash_common.h. */
#include <immintrin.h>

#include "cortiq.h"
#include "hash_common.h"

static inline __m256i mul_const(__m256i x, __m256i clo, __m256i chi) {
    __m256i lo = _mm256_mul_epu32(x, clo);
    __m256i c1 = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), clo);
    __m256i c2 = _mm256_mul_epu32(x, chi);
    return _mm256_add_epi64(lo, _mm256_slli_epi64(_mm256_add_epi64(c1, c2), 32));
}

static inline __m256i fmix4(__m256i x, __m256i m1lo, __m256i m1hi, __m256i m2lo, __m256i m2hi) {
    x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 33));
    x = mul_const(x, m1lo, m1hi);
    x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 33));
    x = mul_const(x, m2lo, m2hi);
    x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 33));
    return x;
}

static uint64_t hash64_avx2(const uint8_t *p, size_t n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return cq_hash_ref.hash64(p, n);
#else
    size_t nw = n / 8, i = 0;
    const __m256i m1lo = _mm256_set1_epi64x((long long)(CQ_H_M1 & 0xffffffffu));
    const __m256i m1hi = _mm256_set1_epi64x((long long)(CQ_H_M1 >> 32));
    const __m256i m2lo = _mm256_set1_epi64x((long long)(CQ_H_M2 & 0xffffffffu));
    const __m256i m2hi = _mm256_set1_epi64x((long long)(CQ_H_M2 >> 32));
    const uint64_t G = CQ_H_G;
    /* lane j of g0 holds (i+j)*G, of g1 (i+4+j)*G; both advance by 8G per iteration */
    __m256i g0 = _mm256_set_epi64x((long long)(3 * G), (long long)(2 * G), (long long)G, 0);
    __m256i g1 = _mm256_add_epi64(g0, _mm256_set1_epi64x((long long)(4 * G)));
    const __m256i step = _mm256_set1_epi64x((long long)(8 * G));
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
    for (; i + 8 <= nw; i += 8) {
        __m256i w0 = _mm256_loadu_si256((const __m256i *)(p + 8 * i));
        __m256i w1 = _mm256_loadu_si256((const __m256i *)(p + 8 * i + 32));
        a0 = _mm256_xor_si256(a0, _mm256_xor_si256(fmix4(w0, m1lo, m1hi, m2lo, m2hi), g0));
        a1 = _mm256_xor_si256(a1, _mm256_xor_si256(fmix4(w1, m1lo, m1hi, m2lo, m2hi), g1));
        g0 = _mm256_add_epi64(g0, step);
        g1 = _mm256_add_epi64(g1, step);
    }
    __m256i a = _mm256_xor_si256(a0, a1);
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, a);
    return cq_h_finish(p, n, i, lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3]);
#endif
}

const cq_hash_ops cq_hash_avx2 = {hash64_avx2};
