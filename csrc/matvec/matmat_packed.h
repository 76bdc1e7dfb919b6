/* matmat_packed.h -- the prefill GEMM of the SIMD tables, Y = X W^T with the vectors
 * running over the inputs, written once over a vector of MM_VL floats. The including
 * file defines, before including it:
 *   MM_VL                       floats per vector (8: AVX2, 16: AVX-512)
 *   mm_vec, mm_load(p), mm_store(p, v), mm_set1(f), mm_fma(a, b, c), mm_zero()
 *   mm_idx, mm_gather_idx(stride) and mm_gather(idx, base, live): the first `live`
 *       lanes of base[lane * stride], the others 0
 *   optionally MM_HAVE_PACK_BLOCK and mm_pack_block(src, cols, live, dst, wd): columns
 *       0 .. MM_VL-1 of the first `live` rows of src (row stride cols; the other rows 0)
 *       into dst[c * wd + lane] (for tables whose mm_column is the natural order)
 *   MM_SHAPES(X)                the register tiles as X(MR, NV): MR rows x NV vectors,
 *                               one per NV = 1 .. MM_NV (MR a divisor of CQ_MM_ROWS)
 *   MM_NV                       vectors per panel (MM_NI = MM_NV * MM_VL inputs)
 *   static void mm_decode(const cq_qmat *m, size_t r, size_t c0, size_t c1, float *out)
 *       columns [c0, c1) of row r (c0, c1 multiples of MM_KC, or c1 = cols), in the
 *       order mm_column(m, c) names
 *   static size_t mm_column(const cq_qmat *m, size_t c)  the column decoded c-th
 * and optionally, for dtypes whose per-group scales are worth decoding once per row
 * rather than once per chunk (AVX-512's grouped q4 and q2):
 *   MM_ROW_SCALES(m)            floats of a row's decoded scales (0: none)
 *   mm_row_scales(m, r, sc)     decode them
 *   mm_decode_sc(m, r, c0, c1, out, sc)  mm_decode given row r's scales
 * and gets the CQ_HAVE_MM_PACK hooks of matvec_drivers.h.
 *
 * The driver packs X once per call into panels of up to MM_NI inputs, xt[c][i]
 * (inputs zero-padded to a multiple of MM_VL). A thread takes CQ_MM_ROWS weight rows
 * at a time and walks their columns in chunks of MM_KC: it decodes the chunk (24 x
 * 128 floats, 12 KiB) and runs register tiles over it and the panels' chunk (at most
 * 128 x 64 floats, 32 KiB), all in L1. A tile takes, per column, NV panel loads, MR
 * broadcasts and MR*NV FMAs, so the FMA ports, not the loads, set the pace; its
 * partial sums wait in `part` between chunks. Each Y[i][j] is one lane summed over
 * the columns in order: no horizontal sums, no column tails, and the same bits for
 * any thread count. It runs about twice as fast as a kernel with lanes over the columns
 * and whole rows decoded into L2 first (docs/PERFORMANCE.md §9, "matmat"). */
#ifndef CQ_MATMAT_PACKED_H
#define CQ_MATMAT_PACKED_H

#define CQ_MM_ROWS 24
#define MM_KC 128
#define MM_NI (MM_NV * MM_VL)
#define CQ_HAVE_MM_PACK
/* A line into L2 (a table may define its own; this is the x86 one). */
#ifndef MM_PREFETCH_L2
#define MM_PREFETCH_L2(a) _mm_prefetch((const char *)(a), _MM_HINT_T1)
#endif
#ifndef MM_ROW_SCALES
#define MM_ROW_SCALES(m) ((void)(m), (size_t)0)
#define mm_row_scales(m, r, sc) ((void)0)
#define mm_decode_sc(m, r, c0, c1, out, sc) ((void)(sc), mm_decode(m, r, c0, c1, out))
#endif

static size_t mm_up(size_t n) { return (n + MM_VL - 1) / MM_VL * MM_VL; }

/* Floats of the packed X: panel g (inputs MM_NI g ..) holds cols x its width. */
static size_t mm_pack_floats(size_t t, size_t cols) { return mm_up(t) * cols; }

/* Columns [c0, c1) of every panel: xt[MM_NI g cols + c wd + i] = X[MM_NI g + i][mm_column(c)]. */
static void mm_pack(const cq_qmat *m, const float *X, size_t t, size_t cols, size_t c0, size_t c1, float *xt) {
    const mm_idx at = mm_gather_idx(cols);
    for (size_t g0 = 0; g0 < t; g0 += MM_NI) {
        const size_t n = t - g0 < MM_NI ? t - g0 : MM_NI, wd = mm_up(n);
        float *pg = xt + g0 * cols;
        for (size_t i0 = 0; i0 < wd; i0 += MM_VL) {
            const size_t live = n - i0 < MM_VL ? n - i0 : MM_VL;
            const float *src = X + (g0 + i0) * cols;
            size_t c = c0;
#ifdef MM_HAVE_PACK_BLOCK
            for (; c + MM_VL <= c1; c += MM_VL) mm_pack_block(src + c, cols, live, pg + c * wd + i0, wd);
#endif
            for (; c < c1; c++) mm_store(pg + c * wd + i0, mm_gather(at, src + mm_column(m, c), live));
        }
    }
}

/* Whole rows per chunk where the decoder cannot start mid-row. */
static size_t mm_chunk(const cq_qmat *m) {
    switch (m->dtype) {
    case CQ_DT_F32: case CQ_DT_F16: case CQ_DT_BF16: case CQ_DT_Q8_ROW: case CQ_DT_Q8_2F: return MM_KC;
    default: return grouped_fast(m) ? MM_KC : m->cols;
    }
}

/* Floats of per-thread scratch: the decoded chunk, the partial sums, the rows' scales. */
static size_t mm_scratch_floats(const cq_qmat *m, size_t t) {
    return CQ_MM_ROWS * (mm_chunk(m) + mm_up(t) + MM_ROW_SCALES(m)) + MM_VL;
}

/* One MR x NV tile over n columns: w[r * ldw + c], xp[c * wd + MM_VL v + lane],
 * part[r * ldp + MM_VL v + lane]. */
static inline __attribute__((always_inline)) void mm_tile(const float *w, size_t ldw, const float *xp,
                                                          size_t wd, size_t n, float *part, size_t ldp,
                                                          int first, const int MR, const int NV) {
    mm_vec acc[24];
#pragma GCC unroll 24
    for (int k = 0; k < MR * NV; k++)
        acc[k] = first ? mm_zero() : mm_load(part + (k / NV) * ldp + MM_VL * (k % NV));
    for (size_t c = 0; c < n; c++) {
        const float *xc = xp + c * wd;
        mm_vec xv[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) xv[v] = mm_load(xc + MM_VL * v);
#pragma GCC unroll 24
        for (int r = 0; r < MR; r++) {
            const mm_vec b = mm_set1(w[r * ldw + c]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r * NV + v] = mm_fma(b, xv[v], acc[r * NV + v]);
        }
    }
#pragma GCC unroll 24
    for (int k = 0; k < MR * NV; k++) mm_store(part + (k / NV) * ldp + MM_VL * (k % NV), acc[k]);
}

#define MM_TILE_FN(MR, NV)                                                                          \
    static void mm_tile_##MR##x##NV(const float *w, size_t ldw, const float *xp, size_t wd, size_t n, \
                                    float *part, size_t ldp, int first) {                          \
        mm_tile(w, ldw, xp, wd, n, part, ldp, first, MR, NV);                                      \
    }
MM_SHAPES(MM_TILE_FN)
#undef MM_TILE_FN

/* The weights of the chunk after [.., c1) of rows r0 .. r0+nr-1 into L2, before the
 * tiles over this one: the next chunk of the same rows, or after a block's last chunk
 * the first of the next block (the next this thread takes under schedule(static)).
 * Without it each chunk's decode waited on memory: 24 rows of 128 columns lie 24
 * pieces apart and no hardware prefetcher sees a stream (docs/PERFORMANCE.md §9,
 * "matmat"). Prefetching the next chunk a tile at a time (spread over the first panel's tiles) gained nothing over none. */
static void mm_prefetch_next(const cq_qmat *m, size_t r0, size_t nr, size_t c1, size_t kc) {
    size_t c0 = c1, c2 = c1 + kc < m->cols ? c1 + kc : m->cols;
    if (c1 >= m->cols) {
        r0 += nr;
        c0 = 0;
        c2 = kc < m->cols ? kc : m->cols;
        if (r0 >= m->rows) return;
        if (nr > m->rows - r0) nr = m->rows - r0;
    }
    for (size_t j = 0; j < nr; j++) {
        const uint8_t *p;
        const size_t n = cq_row_span(m, r0 + j, c0, c2, &p);
        for (size_t o = 0; o < n; o += 64) MM_PREFETCH_L2(p + o);
        if (n) MM_PREFETCH_L2(p + n - 1); /* a line the steps skipped */
    }
}

/* Y[i * ldy + j] = row r0 + j of m . X[i] for j < nr <= CQ_MM_ROWS, i < t; xt the
 * packed X, scratch mm_scratch_floats(m, t) floats. */
static void matmat_packed(const cq_qmat *m, size_t r0, size_t nr, const float *xt, size_t t, float *Y,
                          size_t ldy, float *scratch) {
    const size_t cols = m->cols, kc = mm_chunk(m), ldp = mm_up(t);
    const size_t ns = MM_ROW_SCALES(m);
    float *w = scratch, *part = scratch + CQ_MM_ROWS * kc, *sc = part + CQ_MM_ROWS * ldp;
    /* rows past nr: zeros the tiles multiply and nobody reads */
    memset(w + nr * kc, 0, (CQ_MM_ROWS - nr) * kc * sizeof(float));
    for (size_t j = 0; j < nr && ns; j++) mm_row_scales(m, r0 + j, sc + j * ns);
    const int direct = m->dtype == CQ_DT_F32 && nr == CQ_MM_ROWS && ((uintptr_t)m->data & 3) == 0;
    for (size_t c0 = 0; c0 < cols; c0 += kc) {
        const size_t c1 = c0 + kc < cols ? c0 + kc : cols, n = c1 - c0;
        const int first = c0 == 0;
        /* float32 rows need no decoding: a full block's tiles read them in place (no
         * copy; docs/PERFORMANCE.md §9, "matmat"); a partial block's tiles read rows
         * past nr, which are the scratch's zeros */
        const float *wt = w;
        size_t ldw = kc;
        if (direct) {
            wt = (const float *)(const void *)m->data + r0 * cols + c0;
            ldw = cols;
        } else {
            for (size_t j = 0; j < nr; j++) mm_decode_sc(m, r0 + j, c0, c1, w + j * kc, sc + j * ns);
        }
        mm_prefetch_next(m, r0, nr, c1, kc);
        for (size_t g0 = 0; g0 < t; g0 += MM_NI) {
            const size_t wd = mm_up(t - g0 < MM_NI ? t - g0 : MM_NI);
            const float *xp = xt + g0 * cols + c0 * wd;
            float *pg = part + g0;
            switch (wd / MM_VL) {
#define MM_TILE_CASE(MR, NV)                                                                 \
    case NV:                                                                                 \
        for (size_t r = 0; r < nr; r += MR) mm_tile_##MR##x##NV(wt + r * ldw, ldw, xp, wd, n, pg + r * ldp, ldp, first); \
        break;
                MM_SHAPES(MM_TILE_CASE)
#undef MM_TILE_CASE
            default: break; /* (not reached: MM_SHAPES covers 1 .. MM_NV) */
            }
        }
    }
    for (size_t i = 0; i < t; i++) /* row by row of Y: its stores fill lines, part's reads hit L1 */
        for (size_t j = 0; j < nr; j++) Y[i * ldy + j] = part[j * ldp + i];
}
#endif
