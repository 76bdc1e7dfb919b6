/* mathfn_neon.c -- NEON twins of mathfn_ref.c; same contracts. The exp runs on 4 lanes,
 * two vectors a step; scalar tails through the reference's cq_exp1. */
#include "../cortiq.h"
#include "exp8.h"
#include "../simd_neon.h"

static void exp_neon(const float *x, float *out, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float32x4_t a = cq_ld4(x + i), b = cq_ld4(x + i + 4);
        cq_st4(out + i, cq_exp4(a));
        cq_st4(out + i + 4, cq_exp4(b));
    }
    for (; i + 4 <= n; i += 4) cq_st4(out + i, cq_exp4(cq_ld4(x + i)));
    for (; i < n; i++) out[i] = cq_exp1(x[i]);
}

static void softmax_row(float *r, size_t n) {
    size_t i = 0;
    float top = -INFINITY;
    if (n >= 4) {
        /* FMAXNM drops a NaN lane, as the reference's compare does */
        float32x4_t m = vdupq_n_f32(-INFINITY);
        for (; i + 4 <= n; i += 4) m = vmaxnmq_f32(m, cq_ld4(r + i));
        top = vmaxnmvq_f32(m);
    }
    for (; i < n; i++) top = r[i] > top ? r[i] : top;
    if (top == -INFINITY) return;
    const float32x4_t t = vdupq_n_f32(top);
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0;
    for (i = 0; i + 8 <= n; i += 8) {
        const float32x4_t e0 = cq_exp4(vsubq_f32(cq_ld4(r + i), t));
        const float32x4_t e1 = cq_exp4(vsubq_f32(cq_ld4(r + i + 4), t));
        cq_st4(r + i, e0);
        cq_st4(r + i + 4, e1);
        a0 = vaddq_f32(a0, e0);
        a1 = vaddq_f32(a1, e1);
    }
    float den = vaddvq_f32(vaddq_f32(a0, a1));
    for (; i < n; i++) {
        r[i] = cq_exp1(r[i] - top);
        den += r[i];
    }
    const float inv = 1.0f / den;
    const float32x4_t vi = vdupq_n_f32(inv);
    for (i = 0; i + 4 <= n; i += 4) cq_st4(r + i, vmulq_f32(cq_ld4(r + i), vi));
    for (; i < n; i++) r[i] *= inv;
}

static void softmax_rows_neon(float *x, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++) softmax_row(x + r * cols, cols);
}

static void silu_mul_neon(float *g, const float *u, const float *a, const float *b, size_t rows,
                          size_t cols) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    for (size_t r = 0; r < rows; r++) {
        float *gr = g + r * cols;
        const float *ur = u + r * cols;
        size_t i = 0;
        for (; i + 4 <= cols; i += 4) {
            const float32x4_t x = vmulq_f32(cq_ld4(gr + i), cq_ld4(a + i));
            const float32x4_t e = cq_exp4(vnegq_f32(x));
            const float32x4_t ub = vmulq_f32(cq_ld4(ur + i), cq_ld4(b + i));
            cq_st4(gr + i, vmulq_f32(vdivq_f32(x, vaddq_f32(one, e)), ub));
        }
        for (; i < cols; i++) {
            float x = gr[i] * a[i];
            gr[i] = x / (1.0f + cq_exp1(-x)) * (ur[i] * b[i]);
        }
    }
}

static void gate_mul_neon(float *y, const float *g, const float *s, size_t rows, size_t cols) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    for (size_t r = 0; r < rows; r++) {
        float *yr = y + r * cols;
        const float *gr = g + r * cols;
        size_t i = 0;
        for (; i + 4 <= cols; i += 4) {
            const float32x4_t x = vmulq_f32(cq_ld4(gr + i), cq_ld4(s + i));
            cq_st4(yr + i, vdivq_f32(cq_ld4(yr + i), vaddq_f32(one, cq_exp4(vnegq_f32(x)))));
        }
        for (; i < cols; i++) yr[i] /= 1.0f + cq_exp1(-(gr[i] * s[i]));
    }
}

static float dot_neon(const float *a, const float *b, size_t n) { return cq_dot4(a, b, n); }

static void axpy_neon(float *y, float alpha, const float *x, size_t n) { cq_axpy4(y, alpha, x, n); }

const cq_mathfn_ops cq_mathfn_neon = {
    exp_neon, softmax_rows_neon, silu_mul_neon, gate_mul_neon, dot_neon, axpy_neon,
};
