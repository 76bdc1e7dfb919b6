/* quant_drivers.h -- the loops of the CMF quantizers (rows, column blocks, groups of
 * 32, OpenMP split, scale rule and output layout), compiled once per ISA file. The
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
 * Rows, column blocks and groups are independent, so the OpenMP split changes nothing. */
#ifndef CQ_QUANT_DRIVERS_H
#define CQ_QUANT_DRIVERS_H
#include "cortiq.h"
#include "quant_common.h"
#ifdef CORTIQ_HAVE_OPENMP
#include <omp.h>
/* the loops below: independent rows, blocks or groups on the configured threads; a
 * refused input sets `bad` in any of them */
#define CQ_QUANT_FOR _Pragma("omp parallel for num_threads(cq_get_num_threads()) schedule(static)")
#define CQ_QUANT_FOR_BAD \
    _Pragma("omp parallel for num_threads(cq_get_num_threads()) schedule(static) reduction(| : bad)")
#else
#define CQ_QUANT_FOR
#define CQ_QUANT_FOR_BAD
#endif

static cq_status drv_q8_row(const float *w, size_t rows, size_t cols, uint8_t *out) {
    uint8_t *sc = out + rows * cols;
    int bad = 0;
    ptrdiff_t r;
    CQ_QUANT_FOR_BAD
    for (r = 0; r < (ptrdiff_t)rows; r++) {
        const float *x = w + (size_t)r * cols;
        int rb = 0;
        float am = absmax(x, cols, LIMIT_Q8, &rb), s;
        if (rb) {
            bad |= 1;
            continue;
        }
        cq_put_u16(sc + 2 * (size_t)r, cq_scale_f16(am / 127.0f, &s));
        codes(x, NULL, cols, s, -128.0f, (int8_t *)(out + (size_t)r * cols));
    }
    return bad ? CQ_ERR_ARG : CQ_OK;
}

static cq_status drv_q8_2f(const float *w, size_t rows, size_t cols, uint8_t *out, double *acc,
                           float *colv) {
    const size_t n = rows * cols;
    uint8_t *rsb = out + n, *colb = out + n + 2 * rows;
    int bad = 0;
    ptrdiff_t cb;
    const ptrdiff_t nblk = (ptrdiff_t)((cols + 255) / 256);
    /* column RMS: per column, sequential float64 sum over rows (numpy's axis-0 order) */
    CQ_QUANT_FOR_BAD
    for (cb = 0; cb < nblk; cb++) {
        size_t c0 = (size_t)cb * 256, c1 = c0 + 256 < cols ? c0 + 256 : cols;
        for (size_t c = c0; c < c1; c++) acc[c] = 0.0;
        for (size_t r = 0; r < rows; r++) bad |= colsq(w + r * cols, c0, c1, acc);
        for (size_t c = c0; c < c1; c++) {
            double ms = rows ? acc[c] / (double)rows : 0.0;
            double rms = sqrt(ms);
            float v;
            cq_put_u16(colb + 2 * c, cq_scale_f16((float)(rms > 1e-12 ? rms : 1e-12), &v));
            colv[c] = v;
        }
    }
    if (bad) return CQ_ERR_ARG;
    ptrdiff_t r;
    CQ_QUANT_FOR
    for (r = 0; r < (ptrdiff_t)rows; r++) {
        const float *x = w + (size_t)r * cols;
        float am = absmax_div(x, colv, cols), s;
        am = am > 1e-12f ? am : 1e-12f;
        cq_put_u16(rsb + 2 * (size_t)r, cq_scale_f16(am / 127.0f, &s));
        codes(x, colv, cols, s, -127.0f, (int8_t *)(out + (size_t)r * cols));
    }
    return CQ_OK;
}

static cq_status drv_q4(const float *w, size_t n, uint8_t *out, int tiled) {
    const size_t G = (n + 31) / 32;
    int bad = 0;
    ptrdiff_t g;
    CQ_QUANT_FOR_BAD
    for (g = 0; g < (ptrdiff_t)G; g++) {
        size_t i0 = (size_t)g * 32, len = n - i0 < 32 ? n - i0 : 32;
        float pad[32];
        const float *src = w + i0;
        if (len < 32) { /* the last group, zero-padded */
            for (size_t i = 0; i < 32; i++) pad[i] = i < len ? src[i] : 0.0f;
            src = pad;
        }
        uint16_t s = 0;
        uint8_t *nib = tiled ? out + 18 * (size_t)g + 2 : out + 16 * (size_t)g;
        if (group4(src, nib, &s)) {
            bad |= 1;
            continue;
        }
        cq_put_u16(tiled ? out + 18 * (size_t)g : out + 16 * G + 2 * (size_t)g, s);
    }
    return bad ? CQ_ERR_ARG : CQ_OK;
}

static cq_status drv_q4_block(const float *w, size_t n, uint8_t *out) { return drv_q4(w, n, out, 0); }
static cq_status drv_q4_tiled(const float *w, size_t n, uint8_t *out) { return drv_q4(w, n, out, 1); }

#define CQ_QUANT_OPS(name, f32_to_f16, f16_to_f32) \
    const cq_quant_ops name = {drv_q8_row, drv_q8_2f, drv_q4_block, drv_q4_tiled, f32_to_f16, f16_to_f32}

#endif
