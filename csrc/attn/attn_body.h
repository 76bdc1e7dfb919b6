/* attn_body.h -- the attn family's kernels written over four inner primitives that
 * the including ISA file defines first:
 *   static float vdot(const float *a, const float *b, size_t n);
 *   static void vaxpy(float *y, float a, const float *x, size_t n);   y += a*x
 *   (optional) CQ_HAVE_GQA_VALUES + gqa_values(og, sc, n, val, kv_row, rep, hd): the
 *   value pass of attn_gqa with vaxpy's roundings in vaxpy's order
 *   (optional) CQ_HAVE_GQA_SCORES + gqa_scores(sc, qg, keys, n, kv_row, rep, hd, scale):
 *   the score pass of attn_gqa, each score vdot's bits times scale
 *   static void vscale(float *y, const float *x, float s, const float *w, size_t n);
 *        y = x*s (then *w[i] when w != NULL), y may alias x
 *   static float vsumsq(const float *x, size_t n);
 *   static void rope_half_row(float *a, float *b, const float *c, const float *s,
 *                             size_t h, int inverse);
 *   static void vexp_shift(float *s, size_t n, float top);   s[i] = cq_exp1(s[i] - top),
 *        bit for bit (the AVX2 twin evaluates cq_exp1's exact operations on 8 lanes)
 * Parallel kernels give each (query, kv head) or head task to one thread: results are
 * bit-identical for any thread count. */
#ifndef CQ_ATTN_BODY_H
#define CQ_ATTN_BODY_H
#include "attn_scalar.h"
#include "../scratch.h"

static void k_rmsnorm(const float *x, const float *w, float eps, float *y, size_t rows, size_t n) {
    for (size_t r = 0; r < rows; r++) {
        float ms = vsumsq(x + r * n, n) / (float)n;
        float inv = 1.0f / sqrtf(ms + eps);
        vscale(y + r * n, x + r * n, inv, w, n);
    }
}

static void k_justnorm(float *x, float eps, size_t rows, size_t n) {
    for (size_t r = 0; r < rows; r++) {
        float inv = 1.0f / sqrtf(vsumsq(x + r * n, n) + eps);
        vscale(x + r * n, x + r * n, inv, NULL, n);
    }
}

static void k_rope_half(float *x, const float *cs, const float *sn, size_t t, size_t heads,
                        size_t hd, int inverse) {
    size_t h = hd / 2;
    for (size_t r = 0; r < t; r++)
        for (size_t j = 0; j < heads; j++) {
            float *p = x + (r * heads + j) * hd;
            rope_half_row(p, p + h, cs + r * h, sn + r * h, h, inverse);
        }
}

/* softmax over s[0..n) in place with the shared exp; returns nothing (n >= 1). */
static void soft_inplace(float *s, size_t n) {
    float top = -INFINITY;
    for (size_t i = 0; i < n; i++) top = s[i] > top ? s[i] : top;
    if (top == -INFINITY) return;
    vexp_shift(s, n, top);
    float den = 0.0f;
    for (size_t i = 0; i < n; i++) den += s[i];
    float inv = 1.0f / den;
    for (size_t i = 0; i < n; i++) s[i] *= inv;
}

#ifndef CQ_HAVE_GQA_VALUES
/* og[h][d] = sum over keys e, in order, of sc[h][e] * val[e][d] (vaxpy's roundings). */
static void gqa_values(float *og, const float *sc, size_t n, const float *val, size_t kv_row, size_t rep,
                       size_t hd) {
    memset(og, 0, rep * hd * sizeof(float));
    for (size_t e = 0; e < n; e++)
        for (size_t h = 0; h < rep; h++) vaxpy(og + h * hd, sc[h * n + e], val + e * kv_row, hd);
}
#endif

#ifndef CQ_HAVE_GQA_SCORES
/* sc[h][e] = vdot(q of head h, key e) * scale for the rep query heads of one kv head
 * (qg: their rows, hd apart; keys: key e at keys + e * kv_row), each key row read once
 * against every head of the group. */
static void gqa_scores(float *sc, const float *qg, const float *keys, size_t n, size_t kv_row, size_t rep,
                       size_t hd, float scale) {
    for (size_t e = 0; e < n; e++) {
        const float *key = keys + e * kv_row;
        if (e + ATTN_PF_KEYS < n) /* the rows are kv_row apart: the hardware does not follow */
            for (size_t b = 0; b < hd * sizeof(float); b += 64) CQ_PREFETCH((const char *)(key + ATTN_PF_KEYS * kv_row) + b);
        for (size_t h = 0; h < rep; h++) sc[h * n + e] = vdot(qg + h * hd, key, hd) * scale;
    }
}
#endif

/* One attn_gqa call: tasks (query row, kv head), claimed by the pool's slots in kv-head
 * order (all rows of kv head 0, then head 1, ...), so that the keys and values in reach
 * are one head's, which stay in L2 over the rows of a prompt chunk where all heads' do
 * not (512 keys of 4 heads x 128: 2 MiB). */
typedef struct {
    const float *q, *keys, *vals;
    float *out;
    size_t nk, hd, rep, kv_row, q_row, nkeys, pos0, first, window, t, tasks, next;
    float scale;
    int failed;
} gqa_job;

static void gqa_slot(void *arg, size_t slot, size_t nslots) {
    gqa_job *j = (gqa_job *)arg;
    (void)slot;
    (void)nslots;
    const size_t rep = j->rep, hd = j->hd, kv_row = j->kv_row;
    float *sc = NULL;
    for (;;) {
        const size_t task = cq_pool_claim(&j->next, 1);
        if (task >= j->tasks) break;
        if (!sc && !(sc = cq_thread_scratch(rep * j->nkeys * sizeof(float) + 16, &j->failed))) break;
        size_t r = task % j->t, kh = task / j->t;
        size_t p = j->pos0 + r;
        size_t lo = j->first;
        if (j->window && p + 1 > j->window && p + 1 - j->window > lo) lo = p + 1 - j->window;
        size_t n = p + 1 - lo;
        const float *qg = j->q + r * j->q_row + kh * rep * hd;
        float *og = j->out + r * j->q_row + kh * rep * hd;
        gqa_scores(sc, qg, j->keys + (lo - j->first) * kv_row + kh * hd, n, kv_row, rep, hd, j->scale);
        for (size_t h = 0; h < rep; h++) soft_inplace(sc + h * n, n);
        gqa_values(og, sc, n, j->vals + (lo - j->first) * kv_row + kh * hd, kv_row, rep, hd);
    }
    free(sc);
}

static cq_status k_attn_gqa(const float *q, const float *keys, const float *vals, float *out,
                            size_t t, size_t nh, size_t nk, size_t hd, size_t nkeys, size_t pos0,
                            size_t first, size_t window, float scale) {
    if (nk == 0 || nh % nk || hd == 0) return CQ_ERR_SHAPE;
    if (t == 0) return CQ_OK;
    if (pos0 < first || pos0 + t - first > nkeys) return CQ_ERR_SHAPE;
    gqa_job j = {q, keys, vals, out, nk, hd, nh / nk, nk * hd, nh * hd, nkeys, pos0, first, window,
                 t, t * nk, 0, scale, 0};
    const size_t work = t * nh * (pos0 + t - first) * hd, threads = (size_t)cq_get_num_threads();
    const int par = work >= ((size_t)1 << 15) && j.tasks > 1;
    cq_pool_run(!par ? 1 : threads < j.tasks ? threads : j.tasks, gqa_slot, &j);
    return j.failed ? CQ_ERR_NOMEM : CQ_OK;
}

/* One sparse_attend call: one task a head. */
typedef struct {
    const float *q, *kv, *sink;
    const int64_t *idx;
    float *out;
    size_t m, nh, hd, next;
    float scale;
    int failed;
} sparse_job;

static void sparse_slot(void *arg, size_t slot, size_t nslots) {
    sparse_job *j = (sparse_job *)arg;
    (void)slot;
    (void)nslots;
    const size_t m = j->m, hd = j->hd;
    const int64_t *idx = j->idx;
    float *sc = NULL;
    for (;;) {
        const size_t hh = cq_pool_claim(&j->next, 1);
        if (hh >= j->nh) break;
        if (!sc && !(sc = cq_thread_scratch((m ? m : 1) * sizeof(float), &j->failed))) break;
        const float *qh = j->q + hh * hd;
        float *oh = j->out + hh * hd;
        float sk = j->sink ? j->sink[hh] : -INFINITY;
        float top = sk;
        for (size_t e = 0; e < m; e++) {
            if (idx[e] < 0) continue;
            sc[e] = vdot(qh, j->kv + (size_t)idx[e] * hd, hd) * j->scale;
            top = sc[e] > top ? sc[e] : top;
        }
        memset(oh, 0, hd * sizeof(float));
        if (top == -INFINITY) continue; /* nothing to attend and no sink: zeros */
        float den = sk == -INFINITY ? 0.0f : cq_exp1(sk - top);
        for (size_t e = 0; e < m; e++) {
            if (idx[e] < 0) continue;
            float w = cq_exp1(sc[e] - top);
            den += w;
            vaxpy(oh, w, j->kv + (size_t)idx[e] * hd, hd);
        }
        vscale(oh, oh, 1.0f / den, NULL, hd);
    }
    free(sc);
}

static cq_status k_sparse_attend(const float *q, const float *kv, size_t nkv, const int64_t *idx,
                                 size_t m, const float *sink, float scale, size_t nh, size_t hd,
                                 float *out) {
    for (size_t e = 0; e < m; e++)
        if (idx[e] >= (int64_t)nkv) return CQ_ERR_ARG;
    sparse_job j = {q, kv, sink, idx, out, m, nh, hd, 0, scale, 0};
    const size_t threads = (size_t)cq_get_num_threads();
    const int par = nh * m * hd >= ((size_t)1 << 15) && nh > 1;
    cq_pool_run(!par ? 1 : threads < nh ? threads : nh, sparse_slot, &j);
    return j.failed ? CQ_ERR_NOMEM : CQ_OK;
}

static void k_qk_prep(float *x, const float *cs, const float *sn, const float *scale, size_t t,
                      size_t heads, size_t hd, float eps) {
    size_t h = hd / 2;
    for (size_t r = 0; r < t; r++)
        for (size_t j = 0; j < heads; j++) {
            float *p = x + (r * heads + j) * hd;
            rope_half_row(p, p + h, cs + r * h, sn + r * h, h, 0);
            float inv = 1.0f / sqrtf(vsumsq(p, hd) + eps);
            vscale(p, p, inv, scale ? scale + j * hd : NULL, hd);
        }
}

static void k_slerp(float *x, float *out, const float *alpha, size_t rows, size_t n, float eps) {
    for (size_t r = 0; r < rows; r++) {
        float *xr = x + r * n, *o = out + r * n;
        vscale(xr, xr, 1.0f / sqrtf(vsumsq(xr, n) + eps), NULL, n);
        vscale(o, o, 1.0f / sqrtf(vsumsq(o, n) + eps), NULL, n);
        for (size_t i = 0; i < n; i++) {
            o[i] = (o[i] - xr[i]) * alpha[i];
            xr[i] += o[i];
        }
        vscale(xr, xr, 1.0f / sqrtf(vsumsq(xr, n) + eps), NULL, n);
    }
}

static void k_gate_norm(float *y, const float *g, const float *s, size_t rows, size_t n,
                        float eps) {
    cq_active()->mathfn->gate_mul(y, g, s, rows, n);
    k_justnorm(y, eps, rows, n);
}

#define CQ_ATTN_OPS(name) \
    const cq_attn_ops name = {k_rmsnorm, k_justnorm, k_rope_half, rope_interleaved_s, topk_s, \
                              k_attn_gqa, k_sparse_attend, k_qk_prep, k_slerp, k_gate_norm}
#endif
