/* quant_ref.c -- the CMF quantizers (docs/cmf-format.md §7-§8), bit-exact with
 * src/cortiq/cmf/quant.py.
 * All arithmetic is float32 in the order quant.py writes it (q8_2f's column RMS sums in
 * float64, row by row, as numpy's axis-0 mean does). Codes use rintf (ties to even under
 * the default rounding mode). Non-finite inputs, or values whose f16 scale would exceed
 * 65504, return CQ_ERR_ARG (quant.py refuses the same inputs). The loops, the thread
 * split and the layouts are quant_drivers.h's; here are the kernels on the values. */
#include "cortiq.h"
#include "quant_common.h"

static float absmax(const float *x, size_t n, float limit, int *bad) {
    return sc_absmax(x, 0, n, limit, 0.0f, bad);
}

static void codes(const float *x, const float *colv, size_t n, float s, float lo, int8_t *q) {
    sc_codes(x, colv, 0, n, s, lo, q);
}

static int colsq(const float *x, size_t c0, size_t c1, double *acc) { return sc_colsq(x, c0, c1, acc); }

static float absmax_div(const float *x, const float *colv, size_t n) { return sc_absmax_div(x, colv, 0, n, 0.0f); }

/* One zero-padded group of 32: 16 nibble bytes (element 2k low, 2k+1 high) + f16 scale. */
static int group4(const float *g, uint8_t *nib, uint16_t *scale) {
    int bad = 0;
    float am = absmax(g, 32, LIMIT_Q4, &bad), s;
    if (bad) return 1;
    *scale = cq_scale_f16(am / 7.0f, &s);
    for (int k = 0; k < 16; k++) {
        float lo = rintf(g[2 * k] / s), hi = rintf(g[2 * k + 1] / s);
        lo = lo < -8.0f ? -8.0f : (lo > 7.0f ? 7.0f : lo);
        hi = hi < -8.0f ? -8.0f : (hi > 7.0f ? 7.0f : hi);
        nib[k] = (uint8_t)((uint8_t)(lo + 8.0f) | ((uint8_t)(hi + 8.0f) << 4));
    }
    return 0;
}

static void f32_to_f16_ref(const float *x, uint8_t *out, size_t n) {
    for (size_t i = 0; i < n; i++) cq_put_u16(out + 2 * i, cq_f32_to_f16(x[i]));
}

static void f16_to_f32_ref(const uint8_t *x, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = cq_f16_to_f32((uint16_t)(x[2 * i] | (x[2 * i + 1] << 8)));
}

#include "quant_drivers.h"

CQ_QUANT_OPS(cq_quant_ref, f32_to_f16_ref, f16_to_f32_ref);
