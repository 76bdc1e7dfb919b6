/* matvec_drivers.h -- the thread/row drivers of the matvec family, compiled once per
 * ISA file. The including file defines, before including this header:
 *   static float dot_row(const cq_qmat *m, size_t r, const float *xp);
 *   static void dequant_row(const cq_qmat *m, size_t r, float *out);
 *   static int needs_prep(const cq_qmat *m);           -- x must be transformed first
 *   static void prep_x(const cq_qmat *m, const float *x, float *xp);
 *   static void matmat_block(const float *w, size_t nr, size_t cols, const float *X,
 *                            size_t t, float *Y, size_t ldy);  -- Y[i*ldy + j] for j < nr
 *   #define CQ_MM_ROWS  rows decoded per block in matmat
 * and optionally (else the scalar spec / the portable build of x serve):
 *   #define CQ_HAVE_I8_ROWS + static void i8_dot_rows(m, r0, nr, const cq_xq *xq, out);
 *   #define CQ_HAVE_XQ_BUILD + static void xq_build(family, x, cols, buf, cq_xq *xq);
 *   #define CQ_HAVE_I8_MM + the int8 matmat hooks of i8_x.h (i8_mm_takes, ...).
 *   #define CQ_HAVE_ROWS_GRAIN + static size_t rows_grain(m): dot_rows wants rows in
 *       multiples of this many (a panel); threads claim rows in such multiples.
 *   #define CQ_ROW_STREAMS S (2..4) + static int row_streams(m): how many streams (1
 *       or S) m's rows are read as against a float32 x (int8-quantized x: always 1),
 *       and static void dot_lanes(m, r0, L, nk, xp, out): rows r0 + k*L (k < nk <= S)
 *       side by side, out[k*L] = row r0 + k*L; a row's bits must not depend on nk or
 *       on its neighbours. The drivers then read S weight streams at once (below).
 *   #define CQ_HAVE_ROWS_MULTI / CQ_HAVE_I8_MULTI: matvec_batch's multi-input row
 *       tiles for float32 / int8 x (at drv_matvec_batch).
 *   #define CQ_HAVE_MM_PACK + mm_pack_floats(t, cols), mm_pack(m, X, t, cols, c0, c1, xt),
 *       mm_scratch_floats(m, t), matmat_packed(m, r0, nr, xt, t, Y, ldy, scratch):
 *       matmat packs X once per call (its columns split over the threads) and each
 *       block of CQ_MM_ROWS rows decodes what it needs itself (no matmat_block).
 * Row r of every output is computed by exactly one thread, with the same code and
 * order whatever the thread count, so results are bit-identical for any count. */
#ifndef CQ_MATVEC_DRIVERS_H
#define CQ_MATVEC_DRIVERS_H
#include "qmat.h"
#include "../pool.h"
#include "../scratch.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Below this many weights a call stays on the calling thread (thread start-up would
 * cost more than the work). Does not change any result. */
#define CQ_PAR_MIN ((size_t)1 << 16)


static cq_status drv_check(const cq_qmat *m) {
    if (m->dtype == CQ_DT_VBIT || m->dtype == CQ_DT_VBIT_RO) /* validated by prepare_rows */
        return m->rowoff ? CQ_OK : CQ_ERR_ARG;
    size_t need = cq_qmat_nbytes(m->dtype, m->rows, m->cols);
    if (need == 0 && m->rows * m->cols != 0) return CQ_ERR_UNSUPPORTED;
    switch (m->dtype) {
    case CQ_DT_F32: case CQ_DT_F16: case CQ_DT_BF16: case CQ_DT_Q8_ROW: case CQ_DT_Q8_2F:
    case CQ_DT_Q4_BLOCK: case CQ_DT_Q4_TILED: case CQ_DT_Q4TP: case CQ_DT_Q2TP: break;
    case CQ_DT_GGML_Q4_0: case CQ_DT_GGML_Q4_1: case CQ_DT_GGML_Q5_0: case CQ_DT_GGML_Q5_1:
    case CQ_DT_GGML_Q8_0: case CQ_DT_GGML_IQ4_NL: break;
    default:
        if (!kq_is(m->dtype)) return CQ_ERR_UNSUPPORTED;
    }
    if (m->nbytes < need) return CQ_ERR_SHAPE;
    if (cq_qmat_aux_len(m->dtype, m->rows, m->cols) && !m->aux) return CQ_ERR_ARG;
    return CQ_OK;
}

#ifndef CQ_HAVE_ROWS_GRAIN
/* Rows a dot_rows call should get together, at least (claims are whole multiples). */
static size_t rows_grain(const cq_qmat *m) {
    (void)m;
    return 1;
}
#endif

#ifndef CQ_HAVE_DOT_ROWS
static void dot_rows(const cq_qmat *m, size_t r0, size_t nr, const float *xp, float *out) {
    for (size_t j = 0; j < nr; j++) out[j] = dot_row(m, r0 + j, xp);
}
#endif
#ifndef CQ_HAVE_I8_ROWS
static void i8_dot_rows(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *xq, float *out) {
    for (size_t j = 0; j < nr; j++) out[j] = ref_i8_row(m, r0 + j, xq);
}
#endif

/* One x as a row kernel reads it: float32 (xp) or int8-quantized (xq, when i8; q:
 * its storage in matvec_many). */
typedef struct {
    const float *xp;
    const cq_xq *xq;
    cq_xq q;
} drv_x;

static void drv_dot_rows(const cq_qmat *m, size_t r0, size_t nr, drv_x x, float *out) {
    if (x.xq) i8_dot_rows(m, r0, nr, x.xq, out);
    else dot_rows(m, r0, nr, x.xp, out);
}

/* The rows of one matrix, split over `parts` threads: thread t owns share t, one
 * contiguous range (one weight stream per thread: on the AVX-512 development machine four
 * rows read side by side were slower from DRAM; docs/PERFORMANCE.md).
 * Rows go out in claims of about CQ_CLAIM_BYTES; a thread claims its own share front to
 * back, then what is left of the others', so a thread whose memory runs slower in this
 * call (or that the OS delayed) does not hold the rest back. One cache line a share.
 *
 * Streams (CQ_ROW_STREAMS = S > 1, the AVX2 table): a share is read in panels of S
 * lanes of L rows (L = CQ_LANE_BYTES / row bytes, at least 1, so lanes start 128 KiB
 * apart), and claim position i is the S rows at the same place of each lane, read side
 * by side by one kernel call (dot_lanes): S weight streams per core; the last panel's
 * lanes are shortened so that it too keeps S streams. On Zen 3 one stream per core
 * leaves most of the memory parallelism unused, and four streams read markedly faster
 * (docs/PERFORMANCE.md, "Memory streams"); lanes of 128 KiB rather than 16 read faster
 * again (qmat.h: CQ_LANE_BYTES); four adjacent 4 KiB rows gain nothing. On the AVX-512
 * Xeon four rows side by side were slower, so the AVX-512 table keeps one stream
 * (S = 1: a claim is plain rows). */
#ifndef CQ_CLAIM_BYTES
#define CQ_CLAIM_BYTES 65536
#endif
#ifndef CQ_ROW_STREAMS
#define CQ_ROW_STREAMS 1
#endif
#if CQ_ROW_STREAMS == 1
static int row_streams(const cq_qmat *m) {
    (void)m;
    return 1;
}
#endif
/* Streams for m against this kind of x: int8 rows are always read in row order. */
static size_t drv_streams(const cq_qmat *m, int i8) { return i8 ? 1 : (size_t)row_streams(m); }
typedef struct {
    size_t next, end;   /* claim cursor (a row, or a lane position) and its end */
    size_t first, last; /* the share's rows [first, last); with streams > 1 ... */
    size_t lane, full;  /* ... in `full` panels of `streams` lanes of `lane` rows, */
    size_t tail_lane;   /* then one panel of lanes of tail_lane rows */
    size_t streams;     /* 1: plain rows, claimed front to back */
} drv_share;            /* eight words: one cache line a share on 64-bit targets */

static void drv_share_set(const cq_qmat *m, drv_share *sh, size_t first, size_t last, size_t S) {
    const size_t n = last - first;
    sh->first = first;
    sh->last = last;
    sh->streams = S;
    if (S == 1) {
        sh->next = first;
        sh->end = last;
        return;
    }
    const size_t row_bytes = m->rows ? m->nbytes / m->rows : 0;
    size_t L = row_bytes ? CQ_LANE_BYTES / row_bytes : 1; /* qmat.h */
    if (L < 1) L = 1;
    if (L > (n + S - 1) / S) L = (n + S - 1) / S;
    sh->lane = L;
    sh->full = L ? n / (S * L) : 0;
    sh->tail_lane = (n - sh->full * S * L + S - 1) / S;
    sh->next = 0;
    sh->end = sh->full * L + sh->tail_lane;
}

static void drv_shares_init(const cq_qmat *m, drv_share *s, size_t parts, size_t streams) {
    for (size_t t = 0; t < parts; t++) drv_share_set(m, &s[t], m->rows * t / parts, m->rows * (t + 1) / parts, streams);
}

#if CQ_ROW_STREAMS > 1
/* Lane positions [a, b) of share sh: at each, the rows of every lane that has one;
 * row r's result goes to y[r - base]. x is float32 (drv_streams). */
static void drv_lanes(const cq_qmat *m, const float *xp, const drv_share *sh, size_t a, size_t b, float *y,
                      size_t base) {
    const size_t L = sh->lane, S = sh->streams;
    for (size_t i = a; i < b; i++) {
        size_t r0, stride, nk = S;
        if (i < sh->full * L) { /* a full panel */
            r0 = sh->first + (i / L) * S * L + i % L;
            stride = L;
        } else { /* the last panel: its lanes may not all have a row here */
            stride = sh->tail_lane;
            r0 = sh->first + sh->full * S * L + (i - sh->full * L);
            nk = (sh->last - r0 + stride - 1) / stride;
            if (nk > S) nk = S;
        }
        dot_lanes(m, r0, stride, (int)nk, xp, y + (r0 - base));
    }
}
#endif

/* The first row of the next n of share s (at or past s->end when none are left). */
static size_t drv_claim(drv_share *s, size_t n) { return cq_pool_claim(&s->next, n); }

/* Slot t of `parts`: y[r] for the rows of m it claims (its own share first). No
 * barrier at the end: matvec_many's matrices follow one another. */
/* Claim positions of m in one claim of about CQ_CLAIM_BYTES (a position is `streams`
 * rows; at least one, a multiple of the row grain). m->rows > 0. */
static size_t drv_claim_size(const cq_qmat *m, const drv_share *s) {
    const size_t pos_bytes = m->nbytes / m->rows * s[0].streams, grain = rows_grain(m);
    size_t per = pos_bytes >= CQ_CLAIM_BYTES ? 1 : CQ_CLAIM_BYTES / (pos_bytes ? pos_bytes : 1);
    return (per + grain - 1) / grain * grain;
}

static void drv_rows(const cq_qmat *m, drv_x x, float *y, drv_share *s, size_t parts, size_t t) {
    size_t per = m->rows; /* one thread: one claim */
    if (parts > 1 && m->rows) per = drv_claim_size(m, s);
    for (size_t k = 0; k < parts; k++) {
        drv_share *sh = &s[(t + k) % parts];
        for (;;) {
            const size_t a = drv_claim(sh, per);
            if (a >= sh->end) break;
            const size_t nr = sh->end - a < per ? sh->end - a : per;
#if CQ_ROW_STREAMS > 1
            if (sh->streams > 1) {
                drv_lanes(m, x.xp, sh, a, a + nr, y, 0);
                continue;
            }
#endif
            drv_dot_rows(m, a, nr, x, y + a);
        }
    }
}

/* x as the row kernels read it: prepared by prep_x (q8_2f's column scale, the grouped
 * dtypes' permutation), quantized (int8 activations), or, when it is off a 64-byte
 * boundary, copied to one: once x outgrows L1 every split load costs two L2 lines
 * (docs/PERFORMANCE.md §9, "x alignment"). */
#define CQ_ALIGN 64
static size_t up_align(size_t n) { return (n + CQ_ALIGN - 1) & ~(size_t)(CQ_ALIGN - 1); }
static int x_misaligned(const float *x) { return ((uintptr_t)x & (CQ_ALIGN - 1)) != 0; }

/* n floats at a 64-byte boundary inside a malloc'd block (*raw, for free). */
static float *aligned_floats(size_t n, void **raw) {
    *raw = malloc((n ? n : 1) * sizeof(float) + CQ_ALIGN);
    if (!*raw) return NULL;
    return (float *)(((uintptr_t)*raw + CQ_ALIGN - 1) & ~(uintptr_t)(CQ_ALIGN - 1));
}

static void x_for(const cq_qmat *m, const float *x, float *xp) {
    if (needs_prep(m)) prep_x(m, x, xp);
    else memcpy(xp, x, m->cols * sizeof(float));
}

/* How a matrix reads x: as given (or its aligned copy), prepared for it alone, or
 * int8-quantized (one quantized x serves every matrix that takes it). */
typedef enum { X_PLAIN, X_PREP, X_I8 } x_kind;
static x_kind x_kind_of(const cq_qmat *m) {
    if (i8_takes(m)) return X_I8;
    return needs_prep(m) ? X_PREP : X_PLAIN;
}
#include "i8_x.h"

/* One matvec_many call as pool slots: slot t walks every matrix in order. */
typedef struct {
    const cq_qmat *ms;
    size_t n;
    const drv_x *xv;
    float *const *ys;
    drv_share *shares;
    size_t parts;
} mv_job;

static void mv_slot(void *arg, size_t t, size_t nslots) {
    const mv_job *j = (const mv_job *)arg;
    (void)nslots;
    for (size_t i = 0; i < j->n; i++) drv_rows(&j->ms[i], j->xv[i], j->ys[i], j->shares + i * j->parts, j->parts, t);
}

static cq_status drv_matvec_many(const cq_qmat *ms, size_t n, const float *x, float *const *ys) {
    if (n == 0) return CQ_OK;
    for (size_t i = 0; i < n; i++) {
        cq_status st = drv_check(&ms[i]);
        if (st != CQ_OK) return st;
        if (ms[i].cols != ms[0].cols) return CQ_ERR_SHAPE;
    }
    size_t total = 0, nprep = 0;
    int any_plain = 0, any_i8 = 0;
    drv_x xs_[16];
    drv_x *xv = n <= 16 ? xs_ : (drv_x *)malloc(n * sizeof(*xv));
    if (!xv) return CQ_ERR_NOMEM;
    /* each matrix's kind read once: the int8 switch may flip on another thread */
    x_kind kinds_[16], *kinds = n <= 16 ? kinds_ : (x_kind *)malloc(n * sizeof(*kinds));
    if (!kinds) {
        if (xv != xs_) free(xv);
        return CQ_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        total += ms[i].rows * ms[i].cols;
        switch (kinds[i] = x_kind_of(&ms[i])) {
        case X_PREP: nprep++; break;
        case X_I8: any_i8 = 1; break;
        default: any_plain = 1;
        }
    }
    const size_t cols = ms[0].cols, fbytes = up_align(cols * sizeof(float));
    const int copy_x = any_plain && x_misaligned(x);
    /* one block: [plain copy][prepared x per X_PREP matrix][quantized x per family] */
    size_t bytes = fbytes * (nprep + (size_t)copy_x) + (any_i8 ? i8_many_bytes(ms, n) : 0);
    void *raw = NULL;
    uint8_t *buf = NULL;
    if (bytes) {
        buf = (uint8_t *)aligned_floats(bytes / sizeof(float) + 1, &raw);
        if (!buf) {
            if (xv != xs_) free(xv);
            if (kinds != kinds_) free(kinds);
            return CQ_ERR_NOMEM;
        }
    }
    const float *xa = x;
    uint8_t *next = buf;
    if (copy_x) {
        memcpy(next, x, cols * sizeof(float));
        xa = (const float *)next;
        next += fbytes;
    }
    if (any_i8) i8_many_build(ms, n, x, next + fbytes * nprep, xv);
    for (size_t i = 0; i < n; i++) {
        xv[i].xp = xa;
        xv[i].xq = kinds[i] == X_I8 ? &xv[i].q : NULL;
        switch (kinds[i]) {
        case X_PREP:
            prep_x(&ms[i], x, (float *)next);
            xv[i].xp = (const float *)next;
            next += fbytes;
            break;
        default: break;
        }
    }
    const int par = total >= CQ_PAR_MIN;
    const size_t parts = par ? (size_t)cq_get_num_threads() : 1;
    drv_share shares_[32], *shares = n * parts <= 32 ? shares_ : (drv_share *)malloc(n * parts * sizeof(drv_share));
    if (!shares) {
        free(raw);
        if (xv != xs_) free(xv);
        if (kinds != kinds_) free(kinds);
        return CQ_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++)
        drv_shares_init(&ms[i], shares + i * parts, parts, drv_streams(&ms[i], kinds[i] == X_I8));
    mv_job job = {ms, n, xv, ys, shares, parts};
    cq_pool_run(parts, mv_slot, &job);
    if (shares != shares_) free(shares);
    free(raw);
    if (xv != xs_) free(xv);
    if (kinds != kinds_) free(kinds);
    return CQ_OK;
}

static cq_status drv_matvec(const cq_qmat *m, const float *x, float *y) {
    return drv_matvec_many(m, 1, x, &y);
}

/* matvec_batch: t inputs against n matrices, ys[i][j * rows_i + r] = (ms[i] X[j])[r],
 * with the weights streamed from memory once for all t: a thread claims about
 * CQ_CLAIM_BYTES of rows and runs every input over them while they sit in its cache.
 * This is the decode step of several sequences at once (continuous batching), where
 * matmat's register tiles would be mostly padding. Each x is read as matvec_many
 * reads it, and where the table has multi-input row tiles (t > 1) each weight is
 * loaded and decoded once per tile for several inputs:
 *   CQ_HAVE_ROWS_MULTI: rows_multi_takes(m), rows_multi(m, r0, nr, xs, t, Y, ldy) for a
 *     float32 x (rows_multi.h): equal to matvec within float32 rounding, not bitwise;
 *   CQ_HAVE_I8_MULTI: i8_multi_takes(m), i8_multi_prep_words(m), i8_multi_prep(m, xq,
 *     words) (what the tiles want of each int8 x beyond xq: made once per call, at a
 *     64-byte boundary), i8_rows_multi(m, r0, nr, xqs, preps, t, Y, ldy) for int8 x:
 *     each input's integer sums and float operations are its matvec row's, so rows
 *     are bit-identical to the int8 matvec of that input.
 * Elsewhere rows are matvec's own, input by input (bit-identical). */
#ifndef CQ_HAVE_ROWS_MULTI
static int rows_multi_takes(const cq_qmat *m) {
    (void)m;
    return 0;
}
static void rows_multi(const cq_qmat *m, size_t r0, size_t nr, const float *const *xs, size_t t, float *Y,
                       size_t ldy) {
    (void)m, (void)r0, (void)nr, (void)xs, (void)t, (void)Y, (void)ldy;
}
#endif
#ifndef CQ_HAVE_I8_MULTI
static int i8_multi_takes(const cq_qmat *m) {
    (void)m;
    return 0;
}
static size_t i8_multi_prep_words(const cq_qmat *m) {
    (void)m;
    return 0;
}
static void i8_multi_prep(const cq_qmat *m, const cq_xq *xq, int32_t *words) { (void)m, (void)xq, (void)words; }
static void i8_rows_multi(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *const *xqs,
                          const int32_t *const *preps, size_t t, float *Y, size_t ldy) {
    (void)m, (void)r0, (void)nr, (void)xqs, (void)preps, (void)t, (void)Y, (void)ldy;
}
#endif

/* How matvec_batch runs a matrix's rows: every input at once through the multi-input
 * tiles (xs: float32 inputs; xqs: int8 ones, with their i8_multi_prep words), or (xs
 * and xqs NULL) input by input. */
typedef struct {
    const float *const *xs;
    const cq_xq *const *xqs;
    const int32_t *const *preps;
} drv_multi;

static void drv_rows_batch(const cq_qmat *m, const drv_x *xv, size_t t, float *Y, drv_share *s,
                           size_t parts, size_t slot, drv_multi multi) {
    const size_t per = m->rows ? drv_claim_size(m, s) : 1;
    for (size_t k = 0; k < parts; k++) {
        drv_share *sh = &s[(slot + k) % parts];
        for (;;) {
            const size_t a = drv_claim(sh, per);
            if (a >= sh->end) break;
            const size_t nr = sh->end - a < per ? sh->end - a : per;
            if (multi.xs) { /* plain rows (one stream), every input at once */
                rows_multi(m, a, nr, multi.xs, t, Y, m->rows);
                continue;
            }
            if (multi.xqs) {
                i8_rows_multi(m, a, nr, multi.xqs, multi.preps, t, Y, m->rows);
                continue;
            }
            for (size_t j = 0; j < t; j++) {
                float *y = Y + j * m->rows;
#if CQ_ROW_STREAMS > 1
                if (sh->streams > 1) {
                    drv_lanes(m, xv[j].xp, sh, a, a + nr, y, 0);
                    continue;
                }
#endif
                drv_dot_rows(m, a, nr, xv[j], y + a);
            }
        }
    }
}

typedef struct {
    const cq_qmat *ms;
    size_t n, t;
    const drv_x *xv; /* [n][t] */
    float *const *ys;
    drv_share *shares;
    size_t parts;
    const drv_multi *multi; /* per matrix */
} mvb_job;

static void mvb_slot(void *arg, size_t slot, size_t nslots) {
    const mvb_job *j = (const mvb_job *)arg;
    (void)nslots;
    for (size_t i = 0; i < j->n; i++)
        drv_rows_batch(&j->ms[i], j->xv + i * j->t, j->t, j->ys[i], j->shares + i * j->parts, j->parts, slot,
                       j->multi[i]);
}

/* Whether matvec_batch runs m's rows through the int8 multi-input tiles. */
static int drv_i8_multi(const cq_qmat *m, x_kind kind, size_t t) { return t > 1 && kind == X_I8 && i8_multi_takes(m); }

static cq_status drv_matvec_batch(const cq_qmat *ms, size_t n, const float *X, size_t t, float *const *ys) {
    if (n == 0 || t == 0) return CQ_OK;
    for (size_t i = 0; i < n; i++) {
        cq_status st = drv_check(&ms[i]);
        if (st != CQ_OK) return st;
        if (ms[i].cols != ms[0].cols) return CQ_ERR_SHAPE;
    }
    const size_t cols = ms[0].cols, fbytes = up_align(cols * sizeof(float));
    size_t total = 0, nprep = 0, pwords = 0;
    int any_i8 = 0;
    cq_status st = CQ_ERR_NOMEM;
    void *raw = NULL, *praw = NULL;
    drv_share *shares = NULL;
    drv_multi *multi = NULL;
    const cq_xq **xqs = NULL;
    const int32_t **preps = NULL;
    x_kind *kinds = (x_kind *)malloc(n * sizeof(*kinds));
    drv_x *xv = (drv_x *)malloc(n * t * sizeof(*xv));
    drv_x *one = (drv_x *)calloc(n, sizeof(*one));
    const float **xps = (const float **)malloc(t * sizeof(*xps)); /* each plain x, for rows_multi */
    if (!kinds || !xv || !one || !xps) goto done;
    for (size_t i = 0; i < n; i++) { /* each kind read once: the int8 switch may flip */
        total += ms[i].rows * ms[i].cols;
        kinds[i] = x_kind_of(&ms[i]);
        if (kinds[i] == X_PREP) nprep++;
        if (kinds[i] == X_I8) any_i8 = 1;
        if (drv_i8_multi(&ms[i], kinds[i], t)) pwords += (i8_multi_prep_words(&ms[i]) + 15) & ~(size_t)15;
    }
    /* per input: [aligned copy][prepared x per X_PREP matrix][quantized x per family] */
    const size_t i8b = any_i8 ? i8_many_bytes(ms, n) : 0, per_x = fbytes * (nprep + 1) + up_align(i8b);
    uint8_t *buf = (uint8_t *)aligned_floats(t * per_x / sizeof(float) + 1, &raw);
    const int par = total * t >= CQ_PAR_MIN;
    const size_t parts = par ? (size_t)cq_get_num_threads() : 1;
    shares = (drv_share *)malloc(n * parts * sizeof(drv_share));
    multi = (drv_multi *)calloc(n, sizeof(*multi));
    xqs = (const cq_xq **)malloc(n * t * sizeof(*xqs));        /* [n][t]: each int8 x */
    preps = (const int32_t **)calloc(n * t, sizeof(*preps)); /* [n][t]: its i8_multi_prep words */
    int32_t *pbuf = pwords ? (int32_t *)(void *)aligned_floats(pwords * t, &praw) : NULL;
    if (!buf || !shares || !multi || !xqs || !preps || (pwords && !pbuf)) goto done;
    for (size_t j = 0; j < t; j++) {
        const float *x = X + j * cols;
        uint8_t *next = buf + j * per_x;
        const float *xa = x;
        if (x_misaligned(x)) {
            memcpy(next, x, cols * sizeof(float));
            xa = (const float *)next;
        }
        xps[j] = xa;
        next += fbytes;
        if (any_i8) i8_many_build(ms, n, x, next + fbytes * nprep, one);
        for (size_t i = 0; i < n; i++) {
            drv_x *d = &xv[i * t + j];
            d->xp = xa;
            d->q = one[i].q;
            d->xq = kinds[i] == X_I8 ? &d->q : NULL;
            xqs[i * t + j] = d->xq;
            if (kinds[i] == X_PREP) {
                prep_x(&ms[i], x, (float *)next);
                d->xp = (const float *)next;
                next += fbytes;
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        const int many_f = t > 1 && kinds[i] == X_PLAIN && rows_multi_takes(&ms[i]);
        const int many_q = drv_i8_multi(&ms[i], kinds[i], t);
        multi[i].xs = many_f ? xps : NULL;
        multi[i].xqs = many_q ? xqs + i * t : NULL;
        multi[i].preps = many_q ? preps + i * t : NULL;
        if (many_q) { /* one prep per quantized x: matrices that share an x share it */
            const size_t words = (i8_multi_prep_words(&ms[i]) + 15) & ~(size_t)15;
            size_t same = 0;
            while (same < i && !(multi[same].xqs && xqs[same * t]->q == xqs[i * t]->q)) same++;
            for (size_t j = 0; j < t && words; j++) {
                if (same < i) {
                    preps[i * t + j] = preps[same * t + j];
                    continue;
                }
                i8_multi_prep(&ms[i], xqs[i * t + j], pbuf);
                preps[i * t + j] = pbuf;
                pbuf += words;
            }
        }
        drv_shares_init(&ms[i], shares + i * parts, parts,
                        many_f || many_q ? 1 : drv_streams(&ms[i], kinds[i] == X_I8));
    }
    mvb_job job = {ms, n, t, xv, ys, shares, parts, multi};
    cq_pool_run(parts, mvb_slot, &job);
    st = CQ_OK;
done:
    free(xps);
    free(multi);
    free(xqs);
    free(preps);
    free(praw);
    free(shares);
    free(raw);
    free(kinds);
    free(xv);
    free(one);
    return st;
}

/* One matmat call as pool work: each slot decodes blocks of CQ_MM_ROWS rows, claimed
 * from `next`, into its own scratch (allocated on the slot's first block, kept for the
 * call). With int8 activations (qx set) every block takes all t inputs at once. */
typedef struct {
    const cq_qmat *m;
    const float *X;
    float *Y;
    size_t rows, cols, t, nblocks, next, scratch_bytes;
    float **w; /* per slot */
    int failed;
    const uint8_t *qx; /* X quantized and packed once (i8_x.h), or NULL */
#ifdef CQ_HAVE_MM_PACK
    float *xt;           /* the packed piece of X */
    size_t t0, tn;       /* the piece: inputs [t0, t0 + tn) */
#endif
} mm_job;

static float *mm_scratch(mm_job *j, size_t slot) {
    if (!j->w[slot]) j->w[slot] = cq_thread_scratch(j->scratch_bytes, &j->failed);
    return j->w[slot];
}

static void mm_blocks(void *arg, size_t slot, size_t nslots) {
    mm_job *j = (mm_job *)arg;
    (void)nslots;
    for (;;) {
        const size_t b = cq_pool_claim(&j->next, 1);
        if (b >= j->nblocks) return;
        float *w = mm_scratch(j, slot);
        if (!w) return;
        const size_t r0 = b * CQ_MM_ROWS, nr = j->rows - r0 < CQ_MM_ROWS ? j->rows - r0 : CQ_MM_ROWS;
        if (j->qx) {
            i8_mm_block(j->m, r0, nr, j->qx, j->t, j->Y + r0, j->rows, w);
            continue;
        }
#ifdef CQ_HAVE_MM_PACK
        matmat_packed(j->m, r0, nr, j->xt, j->tn, j->Y + j->t0 * j->rows + r0, j->rows, w);
#else
        for (size_t k = 0; k < nr; k++) dequant_row(j->m, r0 + k, w + k * j->cols);
        matmat_block(w, nr, j->cols, j->X, j->t, j->Y + r0, j->rows);
#endif
    }
}

#ifdef CQ_HAVE_MM_PACK
/* Columns [64 * k0, 64 * k1) of the current piece of X into xt. */
static void mm_pack_cols(void *arg, size_t k0, size_t k1) {
    const mm_job *j = (const mm_job *)arg;
    for (size_t k = k0; k < k1; k++) {
        const size_t c0 = k * 64, c1 = c0 + 64 < j->cols ? c0 + 64 : j->cols;
        mm_pack(j->m, j->X + j->t0 * j->cols, j->tn, j->cols, c0, c1, j->xt);
    }
}
#endif

static cq_status drv_matmat(const cq_qmat *m, const float *X, size_t t, float *Y) {
    cq_status st = drv_check(m);
    if (st != CQ_OK) return st;
    size_t rows = m->rows, cols = m->cols;
    if (rows == 0 || t == 0) return CQ_OK;
    if (cols == 0) {
        memset(Y, 0, t * rows * sizeof(float));
        return CQ_OK;
    }
    const size_t nblocks = (rows + CQ_MM_ROWS - 1) / CQ_MM_ROWS;
    const int par = rows * cols >= CQ_PAR_MIN / 4 && nblocks > 1;
    const size_t threads = (size_t)cq_get_num_threads();
    const size_t slots = !par ? 1 : threads < nblocks ? threads : nblocks;
    mm_job j = {m, X, Y, rows, cols, t, nblocks, 0, 0, NULL, 0, NULL};
    j.w = (float **)calloc(slots, sizeof(float *));
    if (!j.w) return CQ_ERR_NOMEM;
    if (i8_mm_takes(m)) { /* int8 activations: X quantized once, here, for every block */
        void *qraw = NULL;
        uint8_t *qx = (uint8_t *)aligned_floats(i8_mm_pack_bytes(m, t) / sizeof(float) + 1, &qraw);
        if (!qx) {
            free(j.w);
            return CQ_ERR_NOMEM;
        }
        i8_mm_pack(m, X, t, qx);
        j.qx = qx;
        j.scratch_bytes = i8_mm_scratch_bytes(m, t);
        cq_pool_run(slots, mm_blocks, &j);
        free(qraw);
    } else {
#ifdef CQ_HAVE_MM_PACK
        /* Inputs in pieces of 16-64, so that a packed piece (about 1 MiB) stays in L2
         * beside the rows being decoded, and any t costs a bounded copy of X. The rows
         * are decoded again per piece; pieces that spill to L3 ran slower than the
         * re-decoding costs. */
        const size_t fit = ((size_t)1 << 20) / (sizeof(float) * cols), piece = (fit + 15) / 16 * 16;
        const size_t tc = t < piece ? t : piece < 16 ? 16 : piece > 64 ? 64 : piece;
        void *xraw = NULL;
        j.xt = aligned_floats(mm_pack_floats(tc, cols), &xraw);
        j.scratch_bytes = mm_scratch_floats(m, tc) * sizeof(float);
        if (!j.xt) {
            free(j.w);
            return CQ_ERR_NOMEM;
        }
        const size_t npack = (cols + 63) / 64;
        for (size_t t0 = 0; t0 < t && !j.failed; t0 += tc) {
            j.t0 = t0;
            j.tn = t - t0 < tc ? t - t0 : tc;
            cq_pool_for(npack, 1, par, mm_pack_cols, &j); /* every block reads all of xt */
            j.next = 0;
            cq_pool_run(slots, mm_blocks, &j);
        }
        free(xraw);
#else
        j.scratch_bytes = CQ_MM_ROWS * cols * sizeof(float) + 64;
        cq_pool_run(slots, mm_blocks, &j);
#endif
    }
    for (size_t s = 0; s < slots; s++) free(j.w[s]);
    free(j.w);
    return j.failed ? CQ_ERR_NOMEM : CQ_OK;
}

/* Rows [r0 + j0, r0 + j1) of a dequant_rows call. */
typedef struct {
    const cq_qmat *m;
    size_t r0;
    float *out;
} dq_job;

static void dq_range(void *arg, size_t j0, size_t j1) {
    const dq_job *d = (const dq_job *)arg;
    for (size_t k = j0; k < j1; k++) dequant_row(d->m, d->r0 + k, d->out + k * d->m->cols);
}

static cq_status drv_dequant_rows(const cq_qmat *m, size_t r0, size_t nr, float *out) {
    cq_status st = drv_check(m);
    if (st != CQ_OK) return st;
    if (r0 > m->rows || nr > m->rows - r0) return CQ_ERR_ARG;
    dq_job d = {m, r0, out};
    cq_pool_for(nr, 16, nr * m->cols >= CQ_PAR_MIN, dq_range, &d);
    return CQ_OK;
}

/* Rows r0 .. r0+nr-1 on this thread (as lanes when the ISA reads several streams). */
static void drv_rows_serial(const cq_qmat *m, size_t r0, size_t nr, drv_x x, float *out) {
#if CQ_ROW_STREAMS > 1
    const size_t S = drv_streams(m, x.xq != NULL);
    if (S > 1) {
        drv_share sh;
        drv_share_set(m, &sh, r0, r0 + nr, S);
        drv_lanes(m, x.xp, &sh, 0, sh.end, out, r0);
        return;
    }
#endif
    drv_dot_rows(m, r0, nr, x, out);
}

/* Serial: rows r0 .. r0+nr-1 against one x. The prepared, quantized or aligned x
 * lives on the stack up to CQ_XSTACK bytes (no allocation for the usual widths). */
#define CQ_XSTACK 20480
static cq_status drv_rows_dot(const cq_qmat *m, size_t r0, size_t nr, const float *x, float *out) {
    cq_status st = drv_check(m);
    if (st != CQ_OK) return st;
    if (r0 > m->rows || nr > m->rows - r0) return CQ_ERR_ARG;
    if (nr == 0) return CQ_OK;
    const x_kind kind = x_kind_of(m);
    drv_x xv = {x, NULL};
    if (kind == X_PLAIN && !x_misaligned(x)) {
        drv_rows_serial(m, r0, nr, xv, out);
        return CQ_OK;
    }
    size_t bytes = kind == X_I8 ? i8_x_bytes(m) : m->cols * sizeof(float);
    float stackbuf[CQ_XSTACK / sizeof(float) + CQ_ALIGN / sizeof(float)];
    void *raw = NULL;
    float *buf;
    if (bytes <= CQ_XSTACK) {
        buf = (float *)(((uintptr_t)stackbuf + CQ_ALIGN - 1) & ~(uintptr_t)(CQ_ALIGN - 1));
    } else {
        buf = aligned_floats(bytes / sizeof(float) + 1, &raw);
        if (!buf) return CQ_ERR_NOMEM;
    }
    cq_xq xq;
    if (kind == X_I8) {
        i8_x_build(m, x, buf, &xq);
        xv.xq = &xq;
    } else {
        x_for(m, x, buf);
        xv.xp = buf;
    }
    drv_rows_serial(m, r0, nr, xv, out);
    free(raw);
    return CQ_OK;
}

static cq_status drv_row_dot(const cq_qmat *m, size_t r, const float *x, float *res) {
    return drv_rows_dot(m, r, 1, x, res);
}

static int drv_matmat_int8(int dtype) {
    cq_qmat m;
    memset(&m, 0, sizeof m);
    m.dtype = dtype;
    m.rows = 1;
    m.cols = 256;
    m.act = CQ_ACT_INT8;
    return i8_mm_takes(&m);
}

#define CQ_MATVEC_OPS(name) \
    const cq_matvec_ops name = {drv_matvec, drv_matvec_many, drv_matmat, drv_dequant_rows, drv_row_dot, \
                                drv_rows_dot, drv_matvec_batch, drv_matmat_int8}

#endif
