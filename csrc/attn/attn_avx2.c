/* attn_avx2.c -- AVX2/FMA twin of attn_ref.c: vector dot/axpy/scale/sum-of-squares
 * and half-split rotary; top-k and the interleaved tail rotary are the shared scalar
 * code. Dots keep two 8-lane accumulators (rounding-level differences from ref). */
#include "attn_scalar.h"
#include <immintrin.h>

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static float vdot(const float *a, const float *b, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    if (i + 8 <= n) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        i += 8;
    }
    float s = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
static void vaxpy(float *y, float a, const float *x, size_t n) {
    __m256 va = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}
static void vscale(float *y, const float *x, float s, const float *w, size_t n) {
    __m256 vs = _mm256_set1_ps(s);
    size_t i = 0;
    if (w) {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), _mm256_loadu_ps(w + i)));
        for (; i < n; i++) y[i] = x[i] * s * w[i];
    } else {
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
        for (; i < n; i++) y[i] = x[i] * s;
    }
}
static float vsumsq(const float *x, size_t n) { return vdot(x, x, n); }
/* Same roundings as the reference (mul, mul, sub/add: no FMA), so bit-identical. */
static void rope_half_row(float *a, float *b, const float *c, const float *s, size_t h, int inverse) {
    __m256 sg = _mm256_set1_ps(inverse ? -0.0f : 0.0f);
    size_t i = 0;
    for (; i + 8 <= h; i += 8) {
        __m256 x = _mm256_loadu_ps(a + i), y = _mm256_loadu_ps(b + i);
        __m256 vc = _mm256_loadu_ps(c + i), vs = _mm256_xor_ps(_mm256_loadu_ps(s + i), sg);
        _mm256_storeu_ps(a + i, _mm256_sub_ps(_mm256_mul_ps(x, vc), _mm256_mul_ps(y, vs)));
        _mm256_storeu_ps(b + i, _mm256_add_ps(_mm256_mul_ps(x, vs), _mm256_mul_ps(y, vc)));
    }
    for (; i < h; i++) {
        float si = inverse ? -s[i] : s[i], x = a[i], y = b[i];
        a[i] = x * c[i] - y * si;
        b[i] = x * si + y * c[i];
    }
}

#include "attn_body.h"

CQ_ATTN_OPS(cq_attn_avx2);
