/* nystrom_body.h -- the far-field algorithm of docs/nystrom.md, written once and
 * included by each ISA file after it defines
 *     static inline float NYS_DOT(const float *a, const float *b, size_t n);
 *     static inline void  NYS_AXPY(float *y, float a, const float *x, size_t n);
 *     static inline void  NYS_SCALE(float *y, float a, size_t n);
 * Everything here is static; the including file exports the ops struct. f32 throughout
 * (the f64 parts of the seal live in seg_means and in csrc/linalg). */
#include <math.h>
#include <string.h>

/* Every head absorbs one row (docs/nystrom.md §2 "far insert"). */
static void nys_absorb_row(cq_nys_view *g, const float *k, const float *v) {
    const size_t m = g->m, d = g->d, dv = g->dv;
    for (size_t h = 0; h < g->rep; h++) {
        const float *qt = g->q_tilde + h * m * d;
        float *th = g->t_hat + h * m * dv, *zh = g->z_hat + h * m, *mx = g->m_max + h * m;
        for (size_t b = 0; b < m; b++) {
            float l = g->scale * NYS_DOT(qt + b * d, k, d);
            float *tb = th + b * dv;
            if (l > mx[b]) {
                float r = expf(mx[b] - l); /* 0 when the maximum was -inf */
                zh[b] *= r;
                NYS_SCALE(tb, r, dv);
                mx[b] = l;
            }
            float e = expf(l - mx[b]);
            zh[b] += e;
            NYS_AXPY(tb, e, v, dv);
        }
    }
}

static void nys_absorb(cq_nys_view *g, const float *k, const float *v, size_t n) {
    for (size_t r = 0; r < n; r++) nys_absorb_row(g, k + r * g->d, v + r * g->dv);
    g->far_len += n;
}

/* Head h's readout (docs/nystrom.md §2) of q[d] into y[dv]. */
static void nys_readout_head(const cq_nys_view *g, size_t h, const float *q, float *y) {
    const size_t d = g->d, dv = g->dv, m = g->m;
    const size_t ns = g->sink_len, nw = g->win_len, nn = ns + nw;
    float *sc = g->scratch;
    float c = -INFINITY;
    for (size_t j = 0; j < ns; j++) {
        sc[j] = g->scale * NYS_DOT(q, g->sink_k + j * d, d);
        if (sc[j] > c) c = sc[j];
    }
    for (size_t j = 0; j < nw; j++) {
        sc[ns + j] = g->scale * NYS_DOT(q, g->win_k + j * d, d);
        if (sc[ns + j] > c) c = sc[ns + j];
    }
    float cs = c, far_den = 0.0f;
    memset(y, 0, dv * sizeof(float));
    if (g->far_len > 0 && m > 0 && !g->exact_only) {
        float *lam = sc + nn, *u = lam + m;
        const float *mu = g->mu + h * m * m, *mx = g->m_max + h * m;
        const float *th = g->t_hat + h * m * dv, *zh = g->z_hat + h * m;
        float f = -INFINITY;
        for (size_t a = 0; a < m; a++) {
            lam[a] = g->scale * NYS_DOT(q, g->k_tilde + a * d, d);
            if (lam[a] > f) f = lam[a];
        }
        for (size_t a = 0; a < m; a++) lam[a] = expf(lam[a] - f);
        memset(u, 0, m * sizeof(float));
        for (size_t a = 0; a < m; a++) NYS_AXPY(u, lam[a], mu + a * m, m);
        if (g->rect_fm)
            for (size_t b = 0; b < m; b++) u[b] = u[b] > 0.0f ? u[b] : 0.0f;
        for (size_t b = 0; b < m; b++) {
            float t = f + mx[b];
            if (t > cs) cs = t;
        }
        for (size_t b = 0; b < m; b++) {
            u[b] = u[b] * expf(f + mx[b] - cs);
            far_den += u[b] * zh[b];
        }
        if (far_den >= 0.0f) {
            for (size_t b = 0; b < m; b++) NYS_AXPY(y, u[b], th + b * dv, dv);
        } else {
            far_den = 0.0f; /* the aggregate guard (also catches NaN) */
        }
    }
    float den = far_den;
    for (size_t j = 0; j < ns; j++) {
        float p = expf(sc[j] - cs);
        den += p;
        NYS_AXPY(y, p, g->sink_v + j * dv, dv);
    }
    for (size_t j = 0; j < nw; j++) {
        float p = expf(sc[ns + j] - cs);
        den += p;
        NYS_AXPY(y, p, g->win_v + j * dv, dv);
    }
    NYS_SCALE(y, 1.0f / (den > 1e-30f ? den : 1e-30f), dv);
}

static void nys_readout(cq_nys_view *g, const float *q, float *y) {
    for (size_t h = 0; h < g->rep; h++) nys_readout_head(g, h, q + h * g->d, y + h * g->dv);
}

static cq_status nys_step(cq_nys_view *g, const float *q, const float *k, const float *v,
                          float *y, int restep) {
    const size_t d = g->d, dv = g->dv, w = g->w;
    size_t slot;
    if (restep) {
        if (g->win_len == 0) return CQ_ERR_SHAPE;
        if (g->exact_only || g->win_len < w) slot = g->win_len - 1;
        else slot = (g->win_head + w - 1) % w;
    } else if (g->exact_only) {
        if (g->win_len >= w) return CQ_ERR_SHAPE;
        slot = g->win_len++;
    } else if (g->win_len < w) {
        slot = g->win_len++;
    } else {
        slot = g->win_head;
        nys_absorb(g, g->win_k + slot * d, g->win_v + slot * dv, 1);
        g->win_head = (g->win_head + 1) % w;
    }
    memcpy(g->win_k + slot * d, k, d * sizeof(float));
    memcpy(g->win_v + slot * dv, v, dv * sizeof(float));
    nys_readout(g, q, y);
    return CQ_OK;
}

static cq_status nys_seg_means(const float *x, size_t ld, size_t d, const uint32_t *index,
                               size_t rows, size_t m, double *out) {
    if (m == 0 || rows < m) return CQ_ERR_ARG;
    for (size_t a = 0; a < m; a++) {
        size_t lo = a * rows / m, hi = (a + 1) * rows / m;
        double *o = out + a * d;
        for (size_t j = 0; j < d; j++) o[j] = 0.0;
        for (size_t r = lo; r < hi; r++) {
            const float *row = x + (index ? (size_t)index[r] : r) * ld;
            for (size_t j = 0; j < d; j++) o[j] += (double)row[j];
        }
        double inv = 1.0 / (double)(hi - lo);
        for (size_t j = 0; j < d; j++) o[j] *= inv;
    }
    return CQ_OK;
}
