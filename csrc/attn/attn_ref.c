/* attn_ref.c -- scalar reference of the attn family (norms, rotary, top-k, attention). */
#include "attn_scalar.h"

static float vdot(const float *a, const float *b, size_t n) {
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
static void vaxpy(float *y, float a, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}
static void vscale(float *y, const float *x, float s, const float *w, size_t n) {
    if (w) for (size_t i = 0; i < n; i++) y[i] = x[i] * s * w[i];
    else for (size_t i = 0; i < n; i++) y[i] = x[i] * s;
}
static float vsumsq(const float *x, size_t n) { return vdot(x, x, n); }
static void rope_half_row(float *a, float *b, const float *c, const float *s, size_t h, int inverse) {
    for (size_t i = 0; i < h; i++) {
        float si = inverse ? -s[i] : s[i], x = a[i], y = b[i];
        a[i] = x * c[i] - y * si;
        b[i] = x * si + y * c[i];
    }
}
static void vexp_shift(float *s, size_t n, float top) {
    for (size_t i = 0; i < n; i++) s[i] = cq_exp1(s[i] - top);
}

#include "attn_body.h"

CQ_ATTN_OPS(cq_attn_ref);
