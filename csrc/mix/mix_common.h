/* mix_common.h -- scalar pieces shared by mix_ref.c and mix_avx2.c (static, so each
 * ISA file gets its own copy compiled with its own flags). These are the small,
 * per-token steps of DeepSeek-V4's hyper-connections whose cost is negligible next to
 * the hc*dim passes: the split + Sinkhorn of a (2+hc)*hc mix vector, the head gate. */
#ifndef CQ_MIX_COMMON_H
#define CQ_MIX_COMMON_H
#include "../cortiq.h"
#include <math.h>
#include <string.h>

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

/* softmax over `slots` per column of width `width`, weighted sum of kv (the reference engine's
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

#include "../pool.h"
/* Rows per task of grouped_rows / rows_sum. A task makes one matvec.rows_dot call per
 * matrix (x prepared and the matrix checked once per call, not per row) and reads each
 * matrix as one run of contiguous rows, which the hardware prefetcher follows better
 * than rows_sum's former row-by-row walk across all the experts. rows_dot gives each
 * row exactly what row_dot does, so the results do not depend on the block. */
#ifndef MIX_BLOCK
#define MIX_BLOCK 128
#endif
typedef cq_status (*mix_rows_dot_fn)(const cq_qmat *, size_t, size_t, const float *, float *);

typedef struct {
    const cq_qmat *m; /* grouped_rows: one matrix and n inputs; rows_sum: n matrices */
    size_t n, groups, lora, nb, rows;
    const float *x;
    const float *const *xs;
    float *out;
    mix_rows_dot_fn rows_dot;
    int bad;
} mix_job;

/* A task is one block of rows of one group; it runs them for every input in turn, so
 * the block comes from memory once and from cache for the other inputs, and each
 * input's rows are exactly what it gets alone (the same rows_dot calls). */
static void grouped_range(void *arg, size_t t0, size_t t1) {
    mix_job *j = (mix_job *)arg;
    const size_t cols = j->m->cols, width = j->groups * cols;
    for (size_t t = t0; t < t1; t++) {
        size_t g = t / j->nb, b0 = (t % j->nb) * MIX_BLOCK;
        size_t nr = j->lora - b0 < MIX_BLOCK ? j->lora - b0 : MIX_BLOCK;
        size_t r0 = g * j->lora + b0;
        for (size_t i = 0; i < j->n; i++)
            if (j->rows_dot(j->m, r0, nr, j->x + i * width + g * cols, j->out + i * j->rows + r0) != CQ_OK)
                cq_pool_flag(&j->bad);
    }
}

static cq_status mix_grouped_rows(const cq_qmat *m, const float *x, size_t n, size_t groups, float *out) {
    if (!m || groups == 0 || m->rows % groups) return CQ_ERR_SHAPE;
    size_t lora = m->rows / groups;
    if (lora == 0 || n == 0) return CQ_OK;
    size_t nb = (lora + MIX_BLOCK - 1) / MIX_BLOCK; /* tasks per group */
    mix_job j = {m, n, groups, lora, nb, m->rows, x, NULL, out, cq_active()->matvec->rows_dot, 0};
    const size_t tasks = groups * nb;
    cq_pool_for(tasks, 1, m->rows >= 64 && tasks > 1, grouped_range, &j);
    return j.bad ? CQ_ERR_ARG : CQ_OK;
}

static void sum_range(void *arg, size_t b0, size_t b1) {
    mix_job *j = (mix_job *)arg;
    for (size_t b = b0; b < b1; b++) {
        size_t r0 = b * MIX_BLOCK;
        size_t nr = j->rows - r0 < MIX_BLOCK ? j->rows - r0 : MIX_BLOCK;
        float acc[MIX_BLOCK], part[MIX_BLOCK];
        for (size_t i = 0; i < nr; i++) acc[i] = 0.0f;
        for (size_t k = 0; k < j->n; k++) { /* terms in list order, as row by row */
            if (j->rows_dot(&j->m[k], r0, nr, j->xs[k], part) != CQ_OK) {
                cq_pool_flag(&j->bad);
                continue;
            }
            for (size_t i = 0; i < nr; i++) acc[i] += part[i];
        }
        memcpy(j->out + r0, acc, nr * sizeof(float));
    }
}

static cq_status mix_rows_sum(const cq_qmat *ms, size_t n, const float *const *xs, float *out) {
    if (!ms || n == 0) return CQ_ERR_SHAPE;
    for (size_t k = 1; k < n; k++)
        if (ms[k].rows != ms[0].rows) return CQ_ERR_SHAPE;
    size_t rows = ms[0].rows, blocks = (rows + MIX_BLOCK - 1) / MIX_BLOCK;
    mix_job j = {ms, n, 0, 0, 0, rows, NULL, xs, out, cq_active()->matvec->rows_dot, 0};
    cq_pool_for(blocks, 1, rows * n >= 256 && blocks > 1, sum_range, &j);
    return j.bad ? CQ_ERR_ARG : CQ_OK;
}
#endif
