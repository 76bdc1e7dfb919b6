/* mathfn_avx2.c -- AVX2/FMA twins of mathfn_ref.c; same contracts, scalar tails
 * through the reference's cq_exp1. Compiled with -mavx2 -mfma -mf16c only. */
#include "../cortiq.h"
#include "exp8.h"
#include "../simd_avx2.h"
#include "exp8_avx2.h"

static void exp_avx2(const float *x, float *out, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, exp8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) out[i] = cq_exp1(x[i]);
}

static void softmax_row(float *r, size_t n) {
    size_t i = 0;
    float top = -INFINITY;
    if (n >= 8) {
        __m256 m = _mm256_set1_ps(-INFINITY);
        for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(r + i), m); /* NaN lanes dropped, as in ref */
        top = cq_hmax8(m);
    }
    /* NaN never wins the max (as in ref); it turns the row NaN through exp below. */
    for (; i < n; i++) top = r[i] > top ? r[i] : top;
    if (top == -INFINITY) return;
    __m256 t = _mm256_set1_ps(top), acc = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(r + i), t));
        _mm256_storeu_ps(r + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float den = cq_hsum8(acc);
    for (; i < n; i++) {
        r[i] = cq_exp1(r[i] - top);
        den += r[i];
    }
    float inv = 1.0f / den;
    __m256 vi = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(r + i, _mm256_mul_ps(_mm256_loadu_ps(r + i), vi));
    for (; i < n; i++) r[i] *= inv;
}

static void softmax_rows_avx2(float *x, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++) softmax_row(x + r * cols, cols);
}

static void silu_mul_avx2(float *g, const float *u, const float *a, const float *b,
                          size_t rows, size_t cols) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (size_t r = 0; r < rows; r++) {
        float *gr = g + r * cols;
        const float *ur = u + r * cols;
        size_t i = 0;
        for (; i + 8 <= cols; i += 8) {
            __m256 x = _mm256_mul_ps(_mm256_loadu_ps(gr + i), _mm256_loadu_ps(a + i));
            __m256 e = exp8(_mm256_xor_ps(x, sign));
            __m256 ub = _mm256_mul_ps(_mm256_loadu_ps(ur + i), _mm256_loadu_ps(b + i));
            _mm256_storeu_ps(gr + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), ub));
        }
        for (; i < cols; i++) {
            float x = gr[i] * a[i];
            gr[i] = x / (1.0f + cq_exp1(-x)) * (ur[i] * b[i]);
        }
    }
}

static void gate_mul_avx2(float *y, const float *g, const float *s, size_t rows, size_t cols) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (size_t r = 0; r < rows; r++) {
        float *yr = y + r * cols;
        const float *gr = g + r * cols;
        size_t i = 0;
        for (; i + 8 <= cols; i += 8) {
            __m256 x = _mm256_mul_ps(_mm256_loadu_ps(gr + i), _mm256_loadu_ps(s + i));
            __m256 e = exp8(_mm256_xor_ps(x, sign));
            _mm256_storeu_ps(yr + i, _mm256_div_ps(_mm256_loadu_ps(yr + i), _mm256_add_ps(one, e)));
        }
        for (; i < cols; i++) yr[i] /= 1.0f + cq_exp1(-(gr[i] * s[i]));
    }
}

static float dot_avx2(const float *a, const float *b, size_t n) { return cq_dot8(a, b, n); }

static void axpy_avx2(float *y, float alpha, const float *x, size_t n) {
    __m256 va = _mm256_set1_ps(alpha);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += alpha * x[i];
}

const cq_mathfn_ops cq_mathfn_avx2 = {
    exp_avx2, softmax_rows_avx2, silu_mul_avx2, gate_mul_avx2, dot_avx2, axpy_avx2,
};
