/* i8_x.h -- the int8-activation x of the matvec drivers (included by matvec_drivers.h,
 * after x_kind_of): what a matrix with act = CQ_ACT_INT8 reads instead of float32 x
 * (qmat.h: cq_xq), and the int8 matmat hooks with their reference versions. Serial
 * helpers only: the drivers call them outside their parallel regions.
 *
 * Hooks a table may define first (else the portable versions below serve):
 *   CQ_HAVE_XQ_BUILD: xq_build(family, x, cols, buf, xq) -- cq_xq_build's bytes, faster
 *   CQ_HAVE_I8_MM: i8_mm_takes(m), i8_mm_pack_bytes(m, t), i8_mm_pack(m, X, t, buf),
 *     i8_mm_scratch_bytes(m, t), i8_mm_block(m, r0, nr, buf, t, Y, ldy, scratch):
 *     matmat with int8 activations. i8_mm_takes(m) == 0 sends the matrix to the
 *     float32 matmat (a table with no integer kernel that pays there). */
#ifndef CQ_I8_X_H
#define CQ_I8_X_H

#ifndef CQ_HAVE_XQ_BUILD
#define xq_build cq_xq_build
#endif

static size_t i8_up64(size_t n) { return (n + 63) & ~(size_t)63; }

/* q8_2f quantizes col * x (its column scale folded into x, as the float32 path's
 * prep_x does), so it needs cols floats of its own beside the quantized x. */
static size_t i8_x_bytes(const cq_qmat *m) {
    return cq_xq_bytes(cq_xq_family(m->dtype), m->cols) + (m->dtype == CQ_DT_Q8_2F ? i8_up64(m->cols * sizeof(float)) : 0);
}

/* buf: i8_x_bytes(m) bytes at a 64-byte boundary. */
static void i8_x_build(const cq_qmat *m, const float *x, void *buf, cq_xq *xq) {
    const int fam = cq_xq_family(m->dtype);
    if (m->dtype == CQ_DT_Q8_2F) {
        float *xp = (float *)(void *)((uint8_t *)buf + cq_xq_bytes(fam, m->cols));
        const float *col = m->aux + m->rows;
        for (size_t c = 0; c < m->cols; c++) xp[c] = col[c] * x[c];
        x = xp;
    }
    xq_build(fam, x, m->cols, buf, xq);
}

/* matvec_many: one quantized x per family, shared by its matrices, and one of its own
 * for each q8_2f matrix. */
static size_t i8_many_bytes(const cq_qmat *ms, size_t n) {
    size_t bytes = 0;
    int seen = 0;
    for (size_t i = 0; i < n; i++) {
        if (!i8_takes(&ms[i])) continue;
        const int fam = cq_xq_family(ms[i].dtype);
        if (ms[i].dtype == CQ_DT_Q8_2F) bytes += i8_x_bytes(&ms[i]);
        else if (!(seen & (1 << fam))) {
            seen |= 1 << fam;
            bytes += cq_xq_bytes(fam, ms[i].cols);
        }
    }
    return bytes;
}

/* Fills xv[i].q for every matrix that takes int8 (buf: i8_many_bytes, 64-aligned). */
static void i8_many_build(const cq_qmat *ms, size_t n, const float *x, uint8_t *buf, drv_x *xv) {
    cq_xq fam_xq[CQ_XQ_FAMILIES];
    int built = 0;
    for (size_t i = 0; i < n; i++) {
        if (!i8_takes(&ms[i])) continue;
        const int fam = cq_xq_family(ms[i].dtype);
        if (ms[i].dtype == CQ_DT_Q8_2F) {
            i8_x_build(&ms[i], x, buf, &xv[i].q);
            buf += i8_x_bytes(&ms[i]);
            continue;
        }
        if (!(built & (1 << fam))) {
            built |= 1 << fam;
            xq_build(fam, x, ms[i].cols, buf, &fam_xq[fam]);
            buf += cq_xq_bytes(fam, ms[i].cols);
        }
        xv[i].q = fam_xq[fam];
    }
}

#ifndef CQ_HAVE_I8_MM
/* The portable int8 matmat: X quantized input by input in the matvec layout, and
 * Y[i][j] the int8 row of input i, so matmat equals t int8 matvecs bit for bit. */
static int i8_mm_takes(const cq_qmat *m) { return i8_takes(m); }
static size_t i8_mm_pack_bytes(const cq_qmat *m, size_t t) {
    return t * i8_x_bytes(m) + i8_up64(t * sizeof(cq_xq));
}
static void i8_mm_pack(const cq_qmat *m, const float *X, size_t t, uint8_t *buf) {
    const size_t per = i8_x_bytes(m);
    cq_xq *xqs = (cq_xq *)(void *)(buf + t * per);
    for (size_t i = 0; i < t; i++) i8_x_build(m, X + i * m->cols, buf + i * per, &xqs[i]);
}
static size_t i8_mm_scratch_bytes(const cq_qmat *m, size_t t) {
    (void)m;
    (void)t;
    return 64;
}
static void i8_mm_block(const cq_qmat *m, size_t r0, size_t nr, const uint8_t *buf, size_t t, float *Y, size_t ldy,
                        float *scratch) {
    const cq_xq *xqs = (const cq_xq *)(const void *)(buf + t * i8_x_bytes(m));
    (void)scratch;
    for (size_t i = 0; i < t; i++) i8_dot_rows(m, r0, nr, &xqs[i], Y + i * ldy);
}
#endif
#endif
