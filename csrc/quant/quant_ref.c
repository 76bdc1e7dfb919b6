/* quant_ref.c -- the CMF quantizers (CMF_FORMAT §7-§8), bit-exact with cortiq/cmf/quant.py.
 * All arithmetic is float32 in the order quant.py writes it (q8_2f's column RMS sums in
 * float64, row by row, as numpy's axis-0 mean does). Codes use rintf (ties to even under
 * the default rounding mode). Rows/groups are independent, so the OpenMP split changes
 * nothing in the output. Non-finite inputs, or values whose f16 scale would exceed 65504,
 * return CQ_ERR_ARG (quant.py refuses the same inputs). */
#include "cortiq.h"
#include "quant_common.h"

#ifdef CORTIQ_HAVE_OPENMP
#include <omp.h>
#endif

#define LIMIT_Q8 8319008.0f /* 65504 * 127 */
#define LIMIT_Q4 458528.0f  /* 65504 * 7 */

/* absmax of x[0..n); returns -1 when some value is not finite */
static inline float absmax_f32(const float *x, size_t n) {
    float m = 0.0f;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        bad |= !(a <= 3.4028234663852886e38f);
        m = a > m ? a : m;
    }
    return bad ? -1.0f : m;
}

static cq_status q8_row_ref(const float *w, size_t rows, size_t cols, uint8_t *out) {
    uint8_t *sc = out + rows * cols;
    int bad = 0;
    ptrdiff_t r;
#ifdef CORTIQ_HAVE_OPENMP
#pragma omp parallel for num_threads(cq_get_num_threads()) schedule(static) reduction(| : bad)
#endif
    for (r = 0; r < (ptrdiff_t)rows; r++) {
        const float *x = w + (size_t)r * cols;
        float am = absmax_f32(x, cols), s;
        if (am < 0.0f || am > LIMIT_Q8) {
            bad |= 1;
            continue;
        }
        cq_put_u16(sc + 2 * (size_t)r, cq_scale_f16(am / 127.0f, &s));
        int8_t *q = (int8_t *)(out + (size_t)r * cols);
        for (size_t c = 0; c < cols; c++) {
            float v = rintf(x[c] / s);
            v = v < -128.0f ? -128.0f : (v > 127.0f ? 127.0f : v);
            q[c] = (int8_t)v;
        }
    }
    return bad ? CQ_ERR_ARG : CQ_OK;
}

static cq_status q8_2f_ref(const float *w, size_t rows, size_t cols, uint8_t *out,
                           double *acc, float *colv) {
    const size_t n = rows * cols;
    uint8_t *rsb = out + n, *colb = out + n + 2 * rows;
    int bad = 0;
    ptrdiff_t cb;
    const ptrdiff_t nblk = (ptrdiff_t)((cols + 255) / 256);
    /* column RMS: per column, sequential float64 sum over rows (numpy's axis-0 order) */
#ifdef CORTIQ_HAVE_OPENMP
#pragma omp parallel for num_threads(cq_get_num_threads()) schedule(static) reduction(| : bad)
#endif
    for (cb = 0; cb < nblk; cb++) {
        size_t c0 = (size_t)cb * 256, c1 = c0 + 256 < cols ? c0 + 256 : cols;
        for (size_t c = c0; c < c1; c++) acc[c] = 0.0;
        for (size_t r = 0; r < rows; r++) {
            const float *x = w + r * cols;
            for (size_t c = c0; c < c1; c++) {
                double d = (double)x[c];
                float a = fabsf(x[c]);
                bad |= !(a <= LIMIT_Q8);
                acc[c] += d * d;
            }
        }
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
#ifdef CORTIQ_HAVE_OPENMP
#pragma omp parallel for num_threads(cq_get_num_threads()) schedule(static)
#endif
    for (r = 0; r < (ptrdiff_t)rows; r++) {
        const float *x = w + (size_t)r * cols;
        float am = 0.0f, s;
        for (size_t c = 0; c < cols; c++) {
            float a = fabsf(x[c] / colv[c]);
            am = a > am ? a : am;
        }
        am = am > 1e-12f ? am : 1e-12f;
        cq_put_u16(rsb + 2 * (size_t)r, cq_scale_f16(am / 127.0f, &s));
        int8_t *q = (int8_t *)(out + (size_t)r * cols);
        for (size_t c = 0; c < cols; c++) {
            float v = rintf((x[c] / colv[c]) / s);
            v = v < -127.0f ? -127.0f : (v > 127.0f ? 127.0f : v);
            q[c] = (int8_t)v;
        }
    }
    return CQ_OK;
}

/* One group of 32 (zero-padded past n): 16 nibble bytes + the f16 scale bits. */
static inline int q4_group(const float *x, size_t len, uint8_t *nib, uint16_t *scale) {
    float g[32] = {0};
    for (size_t i = 0; i < len; i++) g[i] = x[i];
    float am = absmax_f32(g, 32), s;
    if (am < 0.0f || am > LIMIT_Q4) return 1;
    *scale = cq_scale_f16(am / 7.0f, &s);
    for (int k = 0; k < 16; k++) {
        float lo = rintf(g[2 * k] / s), hi = rintf(g[2 * k + 1] / s);
        lo = lo < -8.0f ? -8.0f : (lo > 7.0f ? 7.0f : lo);
        hi = hi < -8.0f ? -8.0f : (hi > 7.0f ? 7.0f : hi);
        nib[k] = (uint8_t)((uint8_t)(lo + 8.0f) | ((uint8_t)(hi + 8.0f) << 4));
    }
    return 0;
}

static cq_status q4_any_ref(const float *w, size_t n, uint8_t *out, int tiled) {
    const size_t G = (n + 31) / 32;
    int bad = 0;
    ptrdiff_t g;
#ifdef CORTIQ_HAVE_OPENMP
#pragma omp parallel for num_threads(cq_get_num_threads()) schedule(static) reduction(| : bad)
#endif
    for (g = 0; g < (ptrdiff_t)G; g++) {
        size_t i0 = (size_t)g * 32, len = n - i0 < 32 ? n - i0 : 32;
        uint16_t s = 0;
        uint8_t *nib = tiled ? out + 18 * (size_t)g + 2 : out + 16 * (size_t)g;
        if (q4_group(w + i0, len, nib, &s)) {
            bad |= 1;
            continue;
        }
        cq_put_u16(tiled ? out + 18 * (size_t)g : out + 16 * G + 2 * (size_t)g, s);
    }
    return bad ? CQ_ERR_ARG : CQ_OK;
}

static cq_status q4_block_ref(const float *w, size_t n, uint8_t *out) {
    return q4_any_ref(w, n, out, 0);
}

static cq_status q4_tiled_ref(const float *w, size_t n, uint8_t *out) {
    return q4_any_ref(w, n, out, 1);
}

static void f32_to_f16_ref(const float *x, uint8_t *out, size_t n) {
    for (size_t i = 0; i < n; i++) cq_put_u16(out + 2 * i, cq_f32_to_f16(x[i]));
}

static void f16_to_f32_ref(const uint8_t *x, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = cq_f16_to_f32((uint16_t)(x[2 * i] | (x[2 * i + 1] << 8)));
}

const cq_quant_ops cq_quant_ref = {
    q8_row_ref, q8_2f_ref, q4_block_ref, q4_tiled_ref, f32_to_f16_ref, f16_to_f32_ref,
};
