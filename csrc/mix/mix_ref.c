/* mix_ref.c -- scalar reference of the `mix` family (DeepSeek-V4 hyper-connections);
 * contracts in cortiq.h. */
#include "mix_common.h"

static float dot_ref(const float *a, const float *b, size_t n) {
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

typedef struct {
    const float *fn, *x;
    size_t n;
    float r, *out;
} mixes_job;

static void mixes_rows(void *arg, size_t i0, size_t i1) {
    const mixes_job *j = (const mixes_job *)arg;
    for (size_t i = i0; i < i1; i++) j->out[i] = dot_ref(j->fn + i * j->n, j->x, j->n) * j->r;
}

static void hc_mixes_ref(const float *x, size_t n, const float *fn, size_t mix, float eps,
                         float *out) {
    float ss = 0.0f;
    for (size_t i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    mixes_job j = {fn, x, n, r, out};
    cq_pool_for(mix, 4, n * mix >= ((size_t)1 << 18), mixes_rows, &j);
}

static void hc_fold_ref(const float *x, const float *pre, size_t hc, size_t dim, float *out) {
    for (size_t d = 0; d < dim; d++) {
        float s = 0.0f;
        for (size_t j = 0; j < hc; j++) s += pre[j] * x[j * dim + d];
        out[d] = s;
    }
}

static void rms_weighted_ref(float *v, const float *w, size_t n, float eps) {
    float ss = 0.0f;
    for (size_t i = 0; i < n; i++) ss += v[i] * v[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (size_t i = 0; i < n; i++) v[i] = w ? v[i] * r * w[i] : v[i] * r;
}

static void hc_fold_norm_ref(const float *x, const float *pre, size_t hc, size_t dim,
                             const float *w, float eps, float *out) {
    hc_fold_ref(x, pre, hc, dim, out);
    rms_weighted_ref(out, w, dim, eps);
}

static void hc_expand_ref(const float *blk, const float *res, const float *post,
                          const float *comb, size_t hc, size_t dim, float *out) {
    for (size_t j = 0; j < hc; j++)
        for (size_t d = 0; d < dim; d++) {
            float s = post[j] * blk[d];
            for (size_t k = 0; k < hc; k++) s += comb[k * hc + j] * res[k * dim + d];
            out[j * dim + d] = s;
        }
}

const cq_mix_ops cq_mix_ref = {
    hc_mixes_ref, mix_split_sinkhorn, mix_head_pre, hc_fold_ref, hc_fold_norm_ref,
    hc_expand_ref, rms_weighted_ref, mix_swiglu, mix_pool_by_score,
    mix_grouped_rows, mix_rows_sum,
};
