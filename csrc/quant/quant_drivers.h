/* quant_drivers.h -- the loops of the CMF quantizers (rows, column blocks, groups of
 * 32, thread split, scale rule and output layout), compiled once per ISA file. The
 * including file defines, before including this header at its end, the kernels that touch the
 * values (each must compute exactly what quant_ref.c's does, bit for bit):
 *   float absmax(const float *x, size_t n, float limit, int *bad);
 *       max |x[i]|; *bad |= some |x[i]| not <= limit (NaN included)
 *   void codes(const float *x, const float *colv, size_t n, float s, float lo, int8_t *q);
 *       q[i] = clamp(rint((colv ? x[i] / colv[i] : x[i]) / s), lo, 127)
 *   int colsq(const float *x, size_t c0, size_t c1, double *acc);
 *       acc[c] += (double)x[c]^2 for c0 <= c < c1; nonzero when some |x| > LIMIT_Q8
 *   float absmax_div(const float *x, const float *colv, size_t n);  max |x[i] / colv[i]|
 *   int group4(const float *g32, uint8_t *nib, uint16_t *scale_bits);
 *       one zero-padded group of 32 -> 16 nibble bytes + f16 scale; nonzero if refused
 * Rows, column blocks and groups are independent, so the thread split changes nothing. */
#ifndef CQ_QUANT_DRIVERS_H
#define CQ_QUANT_DRIVERS_H
#include "cortiq.h"
#include "quant_common.h"
#include "../pool.h"

/* One quantizer call: its independent rows, column blocks or groups are pool pieces;
 * a refused input in any of them sets `bad`. */
typedef struct {
    const float *w;
    size_t rows, cols, n;
    uint8_t *out;
    double *acc;
    float *colv;
    int tiled, bad;
} qjob;

/* Rows at least this long (or groups this many) make a call parallel. */
#define CQ_QUANT_PAR ((size_t)1 << 15)

static void q8_row_rows(void *arg, size_t r0, size_t r1) {
    qjob *j = (qjob *)arg;
    uint8_t *sc = j->out + j->rows * j->cols;
    for (size_t r = r0; r < r1; r++) {
        const float *x = j->w + r * j->cols;
        int rb = 0;
        float am = absmax(x, j->cols, LIMIT_Q8, &rb), s;
        if (rb) {
            cq_pool_flag(&j->bad);
            continue;
        }
        cq_put_u16(sc + 2 * r, cq_scale_f16(am / 127.0f, &s));
        codes(x, NULL, j->cols, s, -128.0f, (int8_t *)(j->out + r * j->cols));
    }
}

static cq_status drv_q8_row(const float *w, size_t rows, size_t cols, uint8_t *out) {
    qjob j = {w, rows, cols, rows * cols, out, NULL, NULL, 0, 0};
    cq_pool_for(rows, 1, j.n >= CQ_QUANT_PAR, q8_row_rows, &j);
    return j.bad ? CQ_ERR_ARG : CQ_OK;
}

/* Column RMS of blocks of 256 columns: per column, a sequential float64 sum over rows
 * (numpy's axis-0 order). */
static void q8_2f_colblocks(void *arg, size_t b0, size_t b1) {
    qjob *j = (qjob *)arg;
    uint8_t *colb = j->out + j->n + 2 * j->rows;
    for (size_t cb = b0; cb < b1; cb++) {
        size_t c0 = cb * 256, c1 = c0 + 256 < j->cols ? c0 + 256 : j->cols;
        int bad = 0;
        for (size_t c = c0; c < c1; c++) j->acc[c] = 0.0;
        for (size_t r = 0; r < j->rows; r++) bad |= colsq(j->w + r * j->cols, c0, c1, j->acc);
        if (bad) cq_pool_flag(&j->bad);
        for (size_t c = c0; c < c1; c++) {
            double ms = j->rows ? j->acc[c] / (double)j->rows : 0.0;
            double rms = sqrt(ms);
            float v;
            cq_put_u16(colb + 2 * c, cq_scale_f16((float)(rms > 1e-12 ? rms : 1e-12), &v));
            j->colv[c] = v;
        }
    }
}

static void q8_2f_rows(void *arg, size_t r0, size_t r1) {
    qjob *j = (qjob *)arg;
    uint8_t *rsb = j->out + j->n;
    for (size_t r = r0; r < r1; r++) {
        const float *x = j->w + r * j->cols;
        float am = absmax_div(x, j->colv, j->cols), s;
        am = am > 1e-12f ? am : 1e-12f;
        cq_put_u16(rsb + 2 * r, cq_scale_f16(am / 127.0f, &s));
        codes(x, j->colv, j->cols, s, -127.0f, (int8_t *)(j->out + r * j->cols));
    }
}

static cq_status drv_q8_2f(const float *w, size_t rows, size_t cols, uint8_t *out, double *acc,
                           float *colv) {
    qjob j = {w, rows, cols, rows * cols, out, acc, colv, 0, 0};
    const int par = j.n >= CQ_QUANT_PAR;
    cq_pool_for((cols + 255) / 256, 1, par, q8_2f_colblocks, &j);
    if (j.bad) return CQ_ERR_ARG;
    cq_pool_for(rows, 1, par, q8_2f_rows, &j);
    return CQ_OK;
}

static void q4_groups(void *arg, size_t g0, size_t g1) {
    qjob *j = (qjob *)arg;
    const size_t G = (j->n + 31) / 32;
    for (size_t g = g0; g < g1; g++) {
        size_t i0 = g * 32, len = j->n - i0 < 32 ? j->n - i0 : 32;
        float pad[32];
        const float *src = j->w + i0;
        if (len < 32) { /* the last group, zero-padded */
            for (size_t i = 0; i < 32; i++) pad[i] = i < len ? src[i] : 0.0f;
            src = pad;
        }
        uint16_t s = 0;
        uint8_t *nib = j->tiled ? j->out + 18 * g + 2 : j->out + 16 * g;
        if (group4(src, nib, &s)) {
            cq_pool_flag(&j->bad);
            continue;
        }
        cq_put_u16(j->tiled ? j->out + 18 * g : j->out + 16 * G + 2 * g, s);
    }
}

static cq_status drv_q4(const float *w, size_t n, uint8_t *out, int tiled) {
    qjob j = {w, 0, 0, n, out, NULL, NULL, tiled, 0};
    cq_pool_for((n + 31) / 32, 256, n >= CQ_QUANT_PAR, q4_groups, &j);
    return j.bad ? CQ_ERR_ARG : CQ_OK;
}

static cq_status drv_q4_block(const float *w, size_t n, uint8_t *out) { return drv_q4(w, n, out, 0); }
static cq_status drv_q4_tiled(const float *w, size_t n, uint8_t *out) { return drv_q4(w, n, out, 1); }

#define CQ_QUANT_OPS(name, f32_to_f16, f16_to_f32) \
    const cq_quant_ops name = {drv_q8_row, drv_q8_2f, drv_q4_block, drv_q4_tiled, f32_to_f16, f16_to_f32}

#endif
