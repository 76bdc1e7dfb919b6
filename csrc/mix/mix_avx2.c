/* mix_avx2.c -- AVX2/FMA twin of mix_ref.c (same contracts; sums in 8 lanes, so
 * results differ from the reference at rounding level). The hot passes are the ones
 * over hc*dim floats: the mixes projection, the fold and the expand. */
#include "mix_common.h"
#include "../simd_avx2.h"
#include "../mathfn/exp8_avx2.h"

/* Four rows of fn against x at once: four streams from memory in flight instead of
 * one (fn is read cold every token), x loaded once per step. Each row keeps exactly
 * cq_dot8's accumulators and order, so every result equals cq_dot8(row, x, n). */
static void dot8_rows4(const float *f, size_t n, const float *x, float *res) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps(),
           b1 = _mm256_setzero_ps(), c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(),
           d0 = _mm256_setzero_ps(), d1 = _mm256_setzero_ps();
    const float *fa = f, *fb = f + n, *fc = f + 2 * n, *fd = f + 3 * n;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(fa + i), x0, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(fa + i + 8), x1, a1);
        b0 = _mm256_fmadd_ps(_mm256_loadu_ps(fb + i), x0, b0);
        b1 = _mm256_fmadd_ps(_mm256_loadu_ps(fb + i + 8), x1, b1);
        c0 = _mm256_fmadd_ps(_mm256_loadu_ps(fc + i), x0, c0);
        c1 = _mm256_fmadd_ps(_mm256_loadu_ps(fc + i + 8), x1, c1);
        d0 = _mm256_fmadd_ps(_mm256_loadu_ps(fd + i), x0, d0);
        d1 = _mm256_fmadd_ps(_mm256_loadu_ps(fd + i + 8), x1, d1);
    }
    if (i + 8 <= n) {
        __m256 x0 = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(fa + i), x0, a0);
        b0 = _mm256_fmadd_ps(_mm256_loadu_ps(fb + i), x0, b0);
        c0 = _mm256_fmadd_ps(_mm256_loadu_ps(fc + i), x0, c0);
        d0 = _mm256_fmadd_ps(_mm256_loadu_ps(fd + i), x0, d0);
        i += 8;
    }
    float s[4] = {cq_hsum8(_mm256_add_ps(a0, a1)), cq_hsum8(_mm256_add_ps(b0, b1)),
                  cq_hsum8(_mm256_add_ps(c0, c1)), cq_hsum8(_mm256_add_ps(d0, d1))};
    for (int k = 0; k < 4; k++) {
        const float *fk = f + (size_t)k * n;
        for (size_t j = i; j < n; j++) s[k] += fk[j] * x[j];
        res[k] = s[k];
    }
}

typedef struct {
    const float *fn, *x;
    size_t n;
    float r, *out;
} mixes_job;

static void mixes_quads(void *arg, size_t q0, size_t q1) {
    const mixes_job *j = (const mixes_job *)arg;
    for (size_t q = q0; q < q1; q++) {
        float d[4];
        dot8_rows4(j->fn + q * 4 * j->n, j->n, j->x, d);
        for (int k = 0; k < 4; k++) j->out[q * 4 + k] = d[k] * j->r;
    }
}

static void hc_mixes_avx2(const float *x, size_t n, const float *fn, size_t mix, float eps,
                          float *out) {
    float r = 1.0f / sqrtf(cq_dot8(x, x, n) / (float)n + eps);
    const size_t quads = mix / 4;
    mixes_job j = {fn, x, n, r, out};
    cq_pool_for(quads, 1, n * mix >= ((size_t)1 << 18), mixes_quads, &j);
    for (size_t i = quads * 4; i < mix; i++) out[i] = cq_dot8(fn + i * n, x, n) * r;
}

static void hc_fold_avx2(const float *x, const float *pre, size_t hc, size_t dim, float *out) {
    size_t d = 0;
    for (; d + 8 <= dim; d += 8) {
        __m256 s = _mm256_setzero_ps();
        for (size_t j = 0; j < hc; j++)
            s = _mm256_fmadd_ps(_mm256_set1_ps(pre[j]), _mm256_loadu_ps(x + j * dim + d), s);
        _mm256_storeu_ps(out + d, s);
    }
    for (; d < dim; d++) {
        float s = 0.0f;
        for (size_t j = 0; j < hc; j++) s += pre[j] * x[j * dim + d];
        out[d] = s;
    }
}

static void rms_weighted_avx2(float *v, const float *w, size_t n, float eps) {
    float r = 1.0f / sqrtf(cq_dot8(v, v, n) / (float)n + eps);
    __m256 rr = _mm256_set1_ps(r);
    size_t i = 0;
    if (w) {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(v + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), rr),
                                                  _mm256_loadu_ps(w + i)));
        for (; i < n; i++) v[i] = v[i] * r * w[i];
    } else {
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(v + i, _mm256_mul_ps(_mm256_loadu_ps(v + i), rr));
        for (; i < n; i++) v[i] = v[i] * r;
    }
}

static void hc_fold_norm_avx2(const float *x, const float *pre, size_t hc, size_t dim,
                              const float *w, float eps, float *out) {
    hc_fold_avx2(x, pre, hc, dim, out);
    rms_weighted_avx2(out, w, dim, eps);
}

static void hc_expand_avx2(const float *blk, const float *res, const float *post,
                           const float *comb, size_t hc, size_t dim, float *out) {
    for (size_t j = 0; j < hc; j++) {
        __m256 p = _mm256_set1_ps(post[j]);
        size_t d = 0;
        for (; d + 8 <= dim; d += 8) {
            __m256 s = _mm256_mul_ps(p, _mm256_loadu_ps(blk + d));
            for (size_t k = 0; k < hc; k++)
                s = _mm256_fmadd_ps(_mm256_set1_ps(comb[k * hc + j]),
                                    _mm256_loadu_ps(res + k * dim + d), s);
            _mm256_storeu_ps(out + j * dim + d, s);
        }
        for (; d < dim; d++) {
            float s = post[j] * blk[d];
            for (size_t k = 0; k < hc; k++) s += comb[k * hc + j] * res[k * dim + d];
            out[j * dim + d] = s;
        }
    }
}

/* mix_swiglu on 8 lanes with the vector Cephes exp (the scalar tail is mix_swiglu's,
 * libm expf): within rounding of the reference, about 8x faster -- the MoE runs it
 * over top_k + 1 experts' moe_inter values per layer per token. The clamps keep the
 * reference's NaN behaviour: min(g, L) gives L for a NaN g, clip(u) keeps a NaN u. */
static void swiglu_avx2(float *g, const float *u, size_t n, float limit, float weight) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    const __m256 w = _mm256_set1_ps(weight), hi = _mm256_set1_ps(limit),
                 lo = _mm256_set1_ps(-limit);
    int clamp = limit > 0.0f;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i), uv = _mm256_loadu_ps(u + i);
        if (clamp) {
            gv = _mm256_min_ps(gv, hi);                     /* NaN g -> limit */
            uv = _mm256_max_ps(lo, _mm256_min_ps(hi, uv));  /* NaN u stays NaN */
        }
        __m256 e = exp8(_mm256_xor_ps(gv, sign));
        /* exp8 saturates near FLT_MAX where expf overflows to inf: take inf there, so
         * g / (1 + e) is the reference's -0 (and NaN for g = -inf), not g / 3.4e38 */
        e = _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(gv, _mm256_set1_ps(-88.72284f), _CMP_LT_OQ));
        __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_mul_ps(s, uv), w));
    }
    if (i < n) mix_swiglu(g + i, u + i, n - i, limit, weight);
}

const cq_mix_ops cq_mix_avx2 = {
    hc_mixes_avx2, mix_split_sinkhorn, mix_head_pre, hc_fold_avx2, hc_fold_norm_avx2,
    hc_expand_avx2, rms_weighted_avx2, swiglu_avx2, mix_pool_by_score,
    mix_grouped_rows, mix_rows_sum,
};
