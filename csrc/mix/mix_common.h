/* mix_common.h -- scalar pieces shared by mix_ref.c and mix_avx2.c (static, so each
 * ISA file gets its own copy compiled with its own flags). These are the small,
 * per-token steps of DeepSeek-V4's hyper-connections whose cost is negligible next to
 * the hc*dim passes: the split + Sinkhorn of a (2+hc)*hc mix vector, the head gate. */
#ifndef CQ_MIX_COMMON_H
#define CQ_MIX_COMMON_H
#include "../cortiq.h"
#include <math.h>

static inline float mix_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

static void mix_split_sinkhorn(const float *mixes, const float *scale3, const float *base,
                               size_t hc, size_t iters, float eps, float *pre, float *post,
                               float *comb) {
    for (size_t j = 0; j < hc; j++) {
        pre[j] = mix_sigmoid(mixes[j] * scale3[0] + base[j]) + eps;
        post[j] = 2.0f * mix_sigmoid(mixes[j + hc] * scale3[1] + base[j + hc]);
    }
    for (size_t j = 0; j < hc; j++)
        for (size_t k = 0; k < hc; k++) {
            size_t idx = j * hc + k + 2 * hc;
            comb[j * hc + k] = mixes[idx] * scale3[2] + base[idx];
        }
    for (size_t j = 0; j < hc; j++) { /* row softmax + eps */
        float *row = comb + j * hc, m = -INFINITY, s = 0.0f;
        for (size_t k = 0; k < hc; k++) m = row[k] > m ? row[k] : m;
        for (size_t k = 0; k < hc; k++) { row[k] = expf(row[k] - m); s += row[k]; }
        for (size_t k = 0; k < hc; k++) row[k] = row[k] / s + eps;
    }
    size_t rounds = iters ? iters : 1; /* the column step always runs once */
    for (size_t it = 0; it < rounds; it++) {
        if (it > 0) { /* rows, then columns; the first round is columns only */
            for (size_t j = 0; j < hc; j++) {
                float s = 0.0f;
                for (size_t k = 0; k < hc; k++) s += comb[j * hc + k];
                s += eps;
                for (size_t k = 0; k < hc; k++) comb[j * hc + k] /= s;
            }
        }
        for (size_t k = 0; k < hc; k++) {
            float s = eps;
            for (size_t j = 0; j < hc; j++) s += comb[j * hc + k];
            for (size_t j = 0; j < hc; j++) comb[j * hc + k] /= s;
        }
    }
}

static void mix_head_pre(const float *mixes, float scale, const float *base, size_t hc,
                         float eps, float *pre) {
    for (size_t j = 0; j < hc; j++) pre[j] = mix_sigmoid(mixes[j] * scale + base[j]) + eps;
}

/* swiglu with the asymmetric clamp, in place on g: g = silu(min(g, L)) * clamp(u, -L, L) * w
 * (limit <= 0: no clamp). Scalar; n is moe_inter (small). */
static void mix_swiglu(float *g, const float *u, size_t n, float limit, float weight) {
    for (size_t i = 0; i < n; i++) {
        float gv = g[i], uv = u[i];
        if (limit > 0.0f) {
            gv = gv < limit ? gv : limit;
            uv = uv < -limit ? -limit : (uv > limit ? limit : uv);
        }
        g[i] = gv / (1.0f + expf(-gv)) * uv * weight;
    }
}

/* softmax over `slots` per column of width `width`, weighted sum of kv (CMF seed
 * pool_by_score): a column whose scores are all -inf yields 0. */
static void mix_pool_by_score(const float *kv, const float *score, size_t slots, size_t width,
                              float *out) {
    for (size_t d = 0; d < width; d++) {
        float m = -INFINITY;
        for (size_t t = 0; t < slots; t++) m = score[t * width + d] > m ? score[t * width + d] : m;
        out[d] = 0.0f;
        if (!isfinite(m)) continue;
        float den = 0.0f;
        for (size_t t = 0; t < slots; t++) den += expf(score[t * width + d] - m);
        if (!(den > 0.0f)) continue;
        float acc = 0.0f;
        for (size_t t = 0; t < slots; t++)
            acc += (expf(score[t * width + d] - m) / den) * kv[t * width + d];
        out[d] = acc;
    }
}

#ifdef CORTIQ_HAVE_OPENMP
#include <omp.h>
#endif
static cq_status mix_grouped_rows(const cq_qmat *m, const float *x, size_t groups, float *out) {
    if (!m || groups == 0 || m->rows % groups) return CQ_ERR_SHAPE;
    size_t lora = m->rows / groups, per = m->cols;
    long rows = (long)m->rows;
    int bad = 0;
    cq_status (*row_dot)(const cq_qmat *, size_t, const float *, float *) =
        cq_active()->matvec->row_dot;
#ifdef CORTIQ_HAVE_OPENMP
#pragma omp parallel for num_threads(cq_get_num_threads()) schedule(static) if (rows >= 64) reduction(|: bad)
#endif
    for (long r = 0; r < rows; r++) {
        size_t g = (size_t)r / lora;
        if (row_dot(m, (size_t)r, x + g * per, out + r) != CQ_OK) bad |= 1;
    }
    return bad ? CQ_ERR_ARG : CQ_OK;
}

static cq_status mix_rows_sum(const cq_qmat *ms, size_t n, const float *const *xs, float *out) {
    if (!ms || n == 0) return CQ_ERR_SHAPE;
    for (size_t j = 1; j < n; j++)
        if (ms[j].rows != ms[0].rows) return CQ_ERR_SHAPE;
    long rows = (long)ms[0].rows;
    int bad = 0;
    cq_status (*row_dot)(const cq_qmat *, size_t, const float *, float *) =
        cq_active()->matvec->row_dot;
#ifdef CORTIQ_HAVE_OPENMP
#pragma omp parallel for num_threads(cq_get_num_threads()) schedule(static) if (rows * (long)n >= 256) reduction(|: bad)
#endif
    for (long r = 0; r < rows; r++) {
        float acc = 0.0f, v;
        for (size_t j = 0; j < n; j++) {
            if (row_dot(&ms[j], (size_t)r, xs[j], &v) != CQ_OK) bad |= 1;
            acc += v;
        }
        out[r] = acc;
    }
    return bad ? CQ_ERR_ARG : CQ_OK;
}
#endif
