/* mathfn_ref.c -- scalar reference of the elementwise helpers: the spec. */
#include "../cortiq.h"
#include "exp8.h"

static void exp_ref(const float *x, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = cq_exp1(x[i]);
}

static void softmax_row(float *r, size_t n) {
    float top = -INFINITY;
    for (size_t i = 0; i < n; i++) top = r[i] > top ? r[i] : top;
    if (top == -INFINITY) return;  /* fully masked (or empty) row: left as is */
    float den = 0.0f;
    for (size_t i = 0; i < n; i++) {
        r[i] = cq_exp1(r[i] - top);
        den += r[i];
    }
    float inv = 1.0f / den;
    for (size_t i = 0; i < n; i++) r[i] *= inv;
}

static void softmax_rows_ref(float *x, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++) softmax_row(x + r * cols, cols);
}

static void silu_mul_ref(float *g, const float *u, const float *a, const float *b,
                         size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++) {
        float *gr = g + r * cols;
        const float *ur = u + r * cols;
        for (size_t i = 0; i < cols; i++) {
            float x = gr[i] * a[i];
            gr[i] = x / (1.0f + cq_exp1(-x)) * (ur[i] * b[i]);
        }
    }
}

static void gate_mul_ref(float *y, const float *g, const float *s, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++) {
        float *yr = y + r * cols;
        const float *gr = g + r * cols;
        for (size_t i = 0; i < cols; i++) yr[i] /= 1.0f + cq_exp1(-(gr[i] * s[i]));
    }
}

static float dot_ref(const float *a, const float *b, size_t n) {
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy_ref(float *y, float alpha, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

const cq_mathfn_ops cq_mathfn_ref = {
    exp_ref, softmax_rows_ref, silu_mul_ref, gate_mul_ref, dot_ref, axpy_ref,
};
