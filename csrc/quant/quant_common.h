/* quant_common.h -- f16 conversion and the scale rule shared by the quantizers.
 * f32 -> f16 is round-to-nearest-even (as numpy's astype(float16)); the scale rule of
 * every CMF quantizer is f16_floor(x) = max(f16(x), 2^-14) (docs/cmf-format.md §8). */
#ifndef CQ_QUANT_COMMON_H
#define CQ_QUANT_COMMON_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#define CQ_F16_MIN_NORMAL_BITS 0x0400u
#define CQ_F16_MAX 65504.0f
#define LIMIT_Q8 8319008.0f /* 65504 * 127: the largest |w| whose q8 scale fits f16 */
#define LIMIT_Q4 458528.0f  /* 65504 * 7 */

static inline uint16_t cq_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf / NaN (quiet the NaN, keep top payload bits) */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                                   /* f16 subnormal or zero */
        uint32_t e = ax >> 23;
        if (e < 102) return (uint16_t)sign; /* < 2^-25: rounds to 0 */
        uint32_t m = (ax & 0x7fffffu) | 0x800000u, s = 126 - e;
        uint32_t r = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t h = (((ax >> 23) - 112) << 10) | ((ax & 0x7fffffu) >> 13);
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

static inline float cq_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0) {
        float v = (float)m * (1.0f / 16777216.0f); /* m * 2^-24, exact */
        memcpy(&x, &v, 4);
        x |= sign;
    } else if (e == 31) {
        x = sign | 0x7f800000u | (m << 13);
    } else {
        x = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* f16_floor: round to f16, floor at 2^-14. Returns the f16 bits; *val gets the value. */
static inline uint16_t cq_scale_f16(float x, float *val) {
    uint16_t b = cq_f32_to_f16(x);
    float v = cq_f16_to_f32(b);
    if (!(v >= 6.103515625e-05f)) { /* also catches -0.0 */
        b = CQ_F16_MIN_NORMAL_BITS;
        v = 6.103515625e-05f;
    }
    *val = v;
    return b;
}

/* The scalar kernels of the quantizers over elements i0 .. n-1: quant_ref.c runs them
 * whole, its SIMD twins on their tails, so both compute the same bits. */
static inline float sc_absmax(const float *x, size_t i0, size_t n, float limit, float m, int *bad) {
    int b = 0;
    for (size_t i = i0; i < n; i++) {
        float a = fabsf(x[i]);
        b |= !(a <= limit);
        m = a > m ? a : m;
    }
    *bad |= b;
    return m;
}

static inline void sc_codes(const float *x, const float *colv, size_t i0, size_t n, float s, float lo,
                            int8_t *q) {
    for (size_t c = i0; c < n; c++) {
        float v = rintf((colv ? x[c] / colv[c] : x[c]) / s);
        v = v < lo ? lo : (v > 127.0f ? 127.0f : v);
        q[c] = (int8_t)v;
    }
}

static inline int sc_colsq(const float *x, size_t c0, size_t c1, double *acc) {
    int bad = 0;
    for (size_t c = c0; c < c1; c++) {
        double d = (double)x[c];
        bad |= !(fabsf(x[c]) <= LIMIT_Q8);
        acc[c] += d * d;
    }
    return bad;
}

static inline float sc_absmax_div(const float *x, const float *colv, size_t i0, size_t n, float am) {
    for (size_t c = i0; c < n; c++) {
        float a = fabsf(x[c] / colv[c]);
        am = a > am ? a : am;
    }
    return am;
}

static inline void cq_put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}
#endif
