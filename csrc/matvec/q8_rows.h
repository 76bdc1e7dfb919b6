/* q8_rows.h -- the q8 rows (q8_row, q8_2f) of the AVX-512 table (the AVX2 table reads
 * four rows side by side instead: dot_lanes in matvec_avx2.c): one row by
 * one segment loop, and the chunked walk of rows too wide for x to stay in L1. The
 * including file defines, before including it:
 *   static void q8_segment(p, x, far, near, n, float *acc): acc (64 floats, 64-byte
 *       aligned: the row's accumulators) += the n columns (a multiple of 64) at p
 *       against x, prefetching far into L2 and near into L1, both stepping with p
 *       (stepping pointers: CQ_STEPPING in matvec_avx2_impl.h);
 *   static float q8_finish(acc, p, x, c, cols): the row's dot from its accumulators
 *       and its columns c .. cols-1;
 * and gets q8_row_dot(m, r, x) (one row, for its dot_row), q8_wide(m), rows_grain(m)
 * (CQ_HAVE_ROWS_GRAIN) and dot_rows (CQ_HAVE_DOT_ROWS), which sends wide q8 matrices
 * to q8_rows_chunked and the others to dot_row.
 *
 * Why: with x over about three quarters of L1 (4 bytes a column against the weights'
 * 1), each row refetched most of x from L2 while the weights streamed in, and such
 * matrices read markedly slower from DRAM than narrower ones. So a panel of rows goes
 * chunk by chunk over the columns, each x chunk (at most half of L1) staying in L1, the
 * rows' accumulators parked between chunks, and both prefetches follow the order of
 * access (the same columns of the next row of the panel, then the panel's next chunk,
 * then the next panel), not the row: chunking without access-order prefetches reads
 * slower than not chunking at all (docs/PERFORMANCE.md, "Wide q8 rows"). Chunks are whole
 * 64-column steps and depend on cols (and the machine's L1) only, and row_dot /
 * rows_dot come here too, so a row's result is the same through every entry point and
 * thread count. */
#ifndef CQ_Q8_ROWS_H
#define CQ_Q8_ROWS_H

#include <string.h>
#if defined(_MSC_VER)
#define CQ_ALIGNED64 __declspec(align(64))
#else
#define CQ_ALIGNED64 __attribute__((aligned(64)))
#endif

static float dot_row(const cq_qmat *m, size_t r, const float *x); /* the file's, q8 rows by q8_row_dot */

#define Q8_PANEL 32
#define Q8_NEAR 1024 /* bytes ahead into L1 */

/* Wide: x over three quarters of L1 (36 KiB of 48). */
static int q8_wide(const cq_qmat *m) {
    return (m->dtype == CQ_DT_Q8_ROW || m->dtype == CQ_DT_Q8_2F) && m->cols * sizeof(float) * 4 > cq_l1d_bytes() * 3;
}

static void q8_rows_chunked(const cq_qmat *m, size_t r0, size_t nr, const float *x, float *out) {
    const size_t cols = m->cols, c64 = cols & ~(size_t)63, chunk_bytes = cq_l1d_bytes() / 2;
    const size_t nch = (cols * sizeof(float) + chunk_bytes - 1) / chunk_bytes;
    const size_t chunk = ((c64 + nch - 1) / nch + 63) & ~(size_t)63;
    CQ_ALIGNED64 float st[Q8_PANEL][64];
    for (size_t p0 = 0; p0 < nr; p0 += Q8_PANEL) {
        const size_t np = nr - p0 < Q8_PANEL ? nr - p0 : Q8_PANEL;
        memset(st, 0, np * sizeof(st[0]));
        for (size_t c0 = 0; c0 < c64; c0 += chunk) {
            const size_t c1 = c0 + chunk < c64 ? c0 + chunk : c64;
            for (size_t k = 0; k < np; k++) {
                const uint8_t *p = m->data + (r0 + p0 + k) * cols;
                /* pn + c: column c's byte in the segment read next (the next row's,
                 * the panel's next chunk, or the next panel's first row) */
                const uint8_t *pn = k + 1 < np ? p + cols
                                  : c1 < c64 ? m->data + (r0 + p0) * cols + chunk
                                  : p0 + np < nr ? m->data + (r0 + p0 + np) * cols - c0
                                  : p;
                /* into L1, Q8_NEAR bytes ahead in the order of access: this segment's
                 * bytes up to `mid`, then the next segment's */
                const size_t mid = c1 - c0 > Q8_NEAR ? c1 - Q8_NEAR : c0;
                q8_segment(p + c0, x + c0, pn + c0, p + c0 + Q8_NEAR, mid - c0, st[k]);
                q8_segment(p + mid, x + mid, pn + mid, pn + c0, c1 - mid, st[k]);
            }
        }
        for (size_t k = 0; k < np; k++) {
            const size_t r = r0 + p0 + k;
            out[p0 + k] = q8_finish(st[k], m->data + r * cols, x, c64, cols) * m->aux[r];
        }
    }
}

/* One q8 row whole (not wide): the segment loop with the usual prefetch distances. */
static inline float q8_row_dot(const cq_qmat *m, size_t r, const float *x) {
    const size_t cols = m->cols, c64 = cols & ~(size_t)63;
    const uint8_t *p = m->data + r * cols;
    CQ_ALIGNED64 float acc[64] = {0};
    q8_segment(p, x, p + CQ_PF_DIST, p + CQ_PF_NEAR, c64, acc);
    return q8_finish(acc, p, x, c64, cols) * m->aux[r];
}

#define CQ_HAVE_ROWS_GRAIN
static size_t rows_grain(const cq_qmat *m) { return q8_wide(m) ? Q8_PANEL : 1; }

#define CQ_HAVE_DOT_ROWS
static void dot_rows(const cq_qmat *m, size_t r0, size_t nr, const float *xp, float *out) {
    if (q8_wide(m)) {
        q8_rows_chunked(m, r0, nr, xp, out);
        return;
    }
    for (size_t j = 0; j < nr; j++) out[j] = dot_row(m, r0 + j, xp);
}
#endif
