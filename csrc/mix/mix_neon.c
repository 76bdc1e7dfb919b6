/* mix_neon.c -- NEON twin of mix_ref.c (same contracts; sums in 4 lanes, so results
 * differ from the reference at rounding level). The hot passes are the ones over
 * hc*dim floats: the mixes projection, the fold and the expand. */
#include "mix_common.h"
#include "../simd_neon.h"

typedef struct {
    const float *fn, *x;
    size_t n;
    float r, *out;
} mixes_job;

static void mixes_rows(void *arg, size_t i0, size_t i1) {
    const mixes_job *j = (const mixes_job *)arg;
    for (size_t i = i0; i < i1; i++) j->out[i] = cq_dot4(j->fn + i * j->n, j->x, j->n) * j->r;
}

static void hc_mixes_neon(const float *x, size_t n, const float *fn, size_t mix, float eps, float *out) {
    const float r = 1.0f / sqrtf(cq_dot4(x, x, n) / (float)n + eps);
    mixes_job j = {fn, x, n, r, out};
    cq_pool_for(mix, 4, n * mix >= ((size_t)1 << 18), mixes_rows, &j);
}

static void hc_fold_neon(const float *x, const float *pre, size_t hc, size_t dim, float *out) {
    size_t d = 0;
    for (; d + 4 <= dim; d += 4) {
        float32x4_t s = vdupq_n_f32(0.0f);
        for (size_t j = 0; j < hc; j++) s = vfmaq_n_f32(s, cq_ld4(x + j * dim + d), pre[j]);
        cq_st4(out + d, s);
    }
    for (; d < dim; d++) {
        float s = 0.0f;
        for (size_t j = 0; j < hc; j++) s += pre[j] * x[j * dim + d];
        out[d] = s;
    }
}

static void rms_weighted_neon(float *v, const float *w, size_t n, float eps) {
    const float r = 1.0f / sqrtf(cq_dot4(v, v, n) / (float)n + eps);
    const float32x4_t rr = vdupq_n_f32(r);
    size_t i = 0;
    if (w) {
        for (; i + 4 <= n; i += 4) cq_st4(v + i, vmulq_f32(vmulq_f32(cq_ld4(v + i), rr), cq_ld4(w + i)));
        for (; i < n; i++) v[i] = v[i] * r * w[i];
    } else {
        for (; i + 4 <= n; i += 4) cq_st4(v + i, vmulq_f32(cq_ld4(v + i), rr));
        for (; i < n; i++) v[i] = v[i] * r;
    }
}

static void hc_fold_norm_neon(const float *x, const float *pre, size_t hc, size_t dim, const float *w,
                              float eps, float *out) {
    hc_fold_neon(x, pre, hc, dim, out);
    rms_weighted_neon(out, w, dim, eps);
}

static void hc_expand_neon(const float *blk, const float *res, const float *post, const float *comb,
                           size_t hc, size_t dim, float *out) {
    for (size_t j = 0; j < hc; j++) {
        size_t d = 0;
        for (; d + 4 <= dim; d += 4) {
            float32x4_t s = vmulq_n_f32(cq_ld4(blk + d), post[j]);
            for (size_t k = 0; k < hc; k++) s = vfmaq_n_f32(s, cq_ld4(res + k * dim + d), comb[k * hc + j]);
            cq_st4(out + j * dim + d, s);
        }
        for (; d < dim; d++) {
            float s = post[j] * blk[d];
            for (size_t k = 0; k < hc; k++) s += comb[k * hc + j] * res[k * dim + d];
            out[j * dim + d] = s;
        }
    }
}

/* mix_swiglu on 4 lanes with the vector Cephes exp (the scalar tail is mix_swiglu's,
 * libm expf): within rounding of the reference. The clamps keep the reference's NaN
 * behaviour: min(g, L) gives L for a NaN g (FMINNM), clip(u) keeps a NaN u (FMIN/FMAX). */
static void swiglu_neon(float *g, const float *u, size_t n, float limit, float weight) {
    const float32x4_t one = vdupq_n_f32(1.0f), w = vdupq_n_f32(weight), hi = vdupq_n_f32(limit),
                      lo = vdupq_n_f32(-limit), inf = vdupq_n_f32(INFINITY), under = vdupq_n_f32(-88.72284f);
    const int clamp = limit > 0.0f;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t gv = cq_ld4(g + i), uv = cq_ld4(u + i);
        if (clamp) {
            gv = vminnmq_f32(gv, hi);                 /* NaN g -> limit */
            uv = vmaxq_f32(lo, vminq_f32(hi, uv));    /* NaN u stays NaN */
        }
        /* cq_exp4 saturates near FLT_MAX where expf overflows to inf: take inf there, so
         * g / (1 + e) is the reference's -0 (and NaN for g = -inf), not g / 3.4e38 */
        const float32x4_t e = vbslq_f32(vcltq_f32(gv, under), inf, cq_exp4(vnegq_f32(gv)));
        const float32x4_t s = vdivq_f32(gv, vaddq_f32(one, e));
        cq_st4(g + i, vmulq_f32(vmulq_f32(s, uv), w));
    }
    if (i < n) mix_swiglu(g + i, u + i, n - i, limit, weight);
}

const cq_mix_ops cq_mix_neon = {
    hc_mixes_neon, mix_split_sinkhorn, mix_head_pre, hc_fold_neon, hc_fold_norm_neon,
    hc_expand_neon, rms_weighted_neon, swiglu_neon, mix_pool_by_score,
    mix_grouped_rows, mix_rows_sum,
};
