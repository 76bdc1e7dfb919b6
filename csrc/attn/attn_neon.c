/* attn_neon.c -- NEON twin of attn_ref.c: vector dot/axpy/scale/sum-of-squares,
 * half-split rotary and the softmax exp; top-k and the interleaved tail rotary are the
 * shared scalar code. Dots keep four 4-lane accumulators (rounding-level differences
 * from ref); the rotary and the exp are bit-identical to it. */
#include "attn_scalar.h"
#include "../simd_neon.h"

static float vdot(const float *a, const float *b, size_t n) { return cq_dot4(a, b, n); }
static void vaxpy(float *y, float a, const float *x, size_t n) { cq_axpy4(y, a, x, n); }
static void vscale(float *y, const float *x, float s, const float *w, size_t n) {
    const float32x4_t vs = vdupq_n_f32(s);
    size_t i = 0;
    if (w) {
        for (; i + 4 <= n; i += 4) cq_st4(y + i, vmulq_f32(vmulq_f32(cq_ld4(x + i), vs), cq_ld4(w + i)));
        for (; i < n; i++) y[i] = x[i] * s * w[i];
    } else {
        for (; i + 4 <= n; i += 4) cq_st4(y + i, vmulq_f32(cq_ld4(x + i), vs));
        for (; i < n; i++) y[i] = x[i] * s;
    }
}
static float vsumsq(const float *x, size_t n) { return vdot(x, x, n); }
/* Same roundings as the reference (mul, mul, sub/add: no FMA), so bit-identical. */
static void rope_half_row(float *a, float *b, const float *c, const float *s, size_t h, int inverse) {
    size_t i = 0;
    for (; i + 4 <= h; i += 4) {
        const float32x4_t x = cq_ld4(a + i), y = cq_ld4(b + i), vc = cq_ld4(c + i);
        const float32x4_t vs = inverse ? vnegq_f32(cq_ld4(s + i)) : cq_ld4(s + i);
        cq_st4(a + i, vsubq_f32(vmulq_f32(x, vc), vmulq_f32(y, vs)));
        cq_st4(b + i, vaddq_f32(vmulq_f32(x, vs), vmulq_f32(y, vc)));
    }
    for (; i < h; i++) {
        float si = inverse ? -s[i] : s[i], x = a[i], y = b[i];
        a[i] = x * c[i] - y * si;
        b[i] = x * si + y * c[i];
    }
}
/* cq_exp1(s[i] - top) on 4 lanes with exactly its operations: bit for bit. */
static void vexp_shift(float *s, size_t n, float top) {
    const float32x4_t t = vdupq_n_f32(top);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) cq_st4(s + i, cq_exp4_exact(vsubq_f32(cq_ld4(s + i), t)));
    for (; i < n; i++) s[i] = cq_exp1(s[i] - top);
}

#include "attn_body.h"

CQ_ATTN_OPS(cq_attn_neon);
