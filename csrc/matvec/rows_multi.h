/* matvec_batch's multi-input rows for a float32 x (CQ_HAVE_ROWS_MULTI in
 * matvec_drivers.h), shared by the x86 tables: CQ_MULTI_R rows at a time, each group of
 * weights is decoded once and multiplied into up to CQ_MULTI inputs' accumulators (one
 * register per row and input; an x load serves all the rows), so several sequences'
 * decode rows cost one pass over the weights. One accumulator per row and input: equal
 * to matvec's rows within float32 rounding, not bitwise. f32 and q8_row; the other
 * dtypes keep matvec's rows. int8 x has tiles of its own, bit for bit the int8 matvec
 * (i8_multi.h, CQ_HAVE_I8_MULTI: every dtype with int8 activations).
 *
 * Included before matvec_drivers.h by a table that has defined its register tile:
 * CQ_MULTI_R (rows per tile), MULTI_VEC, MULTI_LANES, MULTI_ZERO(), MULTI_LOAD(p),
 * MULTI_FMA(a, b, c), MULTI_HSUM(v), and multi_w(q8, p, c): MULTI_LANES weights of the
 * row at p from column c, as floats. */
#define CQ_HAVE_ROWS_MULTI
#define CQ_MULTI 4      /* inputs per register tile */
#define CQ_MULTI_PF 16384
static int rows_multi_takes(const cq_qmat *m) {
    return m->dtype == CQ_DT_F32 || m->dtype == CQ_DT_Q8_ROW;
}
/* Rows r .. r + nrow - 1 (nrow <= CQ_MULTI_R; missing rows repeat the last, discarded)
 * against J inputs x[0 .. J): Y[k * ldy + row]. */
static inline __attribute__((always_inline)) void multi_tile(const cq_qmat *m, int q8, size_t r, size_t nrow,
                                                             const float *const *x, size_t J, float *Y,
                                                             size_t ldy) {
    const size_t cols = m->cols, eb = q8 ? 1 : 4, cv = cols & ~(size_t)(MULTI_LANES - 1), rb = cols * eb;
    const uint8_t *p[CQ_MULTI_R];
    for (size_t i = 0; i < CQ_MULTI_R; i++) p[i] = m->data + (r + (i < nrow ? i : nrow - 1)) * rb;
    /* The rows about CQ_MULTI_PF bytes ahead, fetched while this tile computes: a claim
     * is read as one stream, which alone leaves most of the memory parallelism unused. */
    const size_t ahead = rb >= CQ_MULTI_PF / CQ_MULTI_R ? CQ_MULTI_R : CQ_MULTI_PF / rb;
    const uint8_t *pf = m->data + (r + ahead) * rb, *pf_end = m->data + m->rows * rb;
    const int fetch = pf + CQ_MULTI_R * rb <= pf_end;
    MULTI_VEC a[CQ_MULTI_R][CQ_MULTI];
    for (size_t i = 0; i < CQ_MULTI_R; i++)
        for (size_t k = 0; k < J; k++) a[i][k] = MULTI_ZERO();
    for (size_t c = 0; c < cv; c += MULTI_LANES) {
        if (fetch && (c * eb) % 64 == 0)
            for (size_t i = 0; i < CQ_MULTI_R; i++) _mm_prefetch((const char *)(pf + i * rb + c * eb), _MM_HINT_T0);
        MULTI_VEC w[CQ_MULTI_R];
        for (size_t i = 0; i < CQ_MULTI_R; i++) w[i] = multi_w(q8, p[i], c);
        for (size_t k = 0; k < J; k++) {
            const MULTI_VEC xv = MULTI_LOAD(x[k] + c);
            for (size_t i = 0; i < CQ_MULTI_R; i++) a[i][k] = MULTI_FMA(w[i], xv, a[i][k]);
        }
    }
    for (size_t i = 0; i < nrow; i++)
        for (size_t k = 0; k < J; k++) {
            float v = MULTI_HSUM(a[i][k]);
            for (size_t c = cv; c < cols; c++)
                v += (q8 ? (float)((const int8_t *)(const void *)p[i])[c] : ((const float *)(const void *)p[i])[c]) * x[k][c];
            Y[k * ldy + r + i] = q8 ? v * m->aux[r + i] : v;
        }
}
#define CQ_MULTI_CASE(J)                                                                 \
    case J:                                                                              \
        if (q8) multi_tile(m, 1, r, nrow, x, J, Y + j0 * ldy, ldy);                      \
        else multi_tile(m, 0, r, nrow, x, J, Y + j0 * ldy, ldy);                         \
        break;
/* Rows [r0, r0 + nr) against inputs xs[0 .. t): Y[j * ldy + r]. */
static void rows_multi(const cq_qmat *m, size_t r0, size_t nr, const float *const *xs, size_t t, float *Y,
                       size_t ldy) {
    const int q8 = m->dtype == CQ_DT_Q8_ROW;
    for (size_t r = r0; r < r0 + nr; r += CQ_MULTI_R) {
        const size_t nrow = r0 + nr - r < CQ_MULTI_R ? r0 + nr - r : CQ_MULTI_R;
        for (size_t j0 = 0; j0 < t; j0 += CQ_MULTI) {
            const float *const *x = xs + j0;
            switch (t - j0 < CQ_MULTI ? t - j0 : CQ_MULTI) {
                CQ_MULTI_CASE(1) CQ_MULTI_CASE(2) CQ_MULTI_CASE(3) CQ_MULTI_CASE(4)
            }
        }
    }
}

