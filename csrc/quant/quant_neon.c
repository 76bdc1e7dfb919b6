/* quant_neon.c -- NEON twin of quant_ref.c's kernels, bit-exact with them: the same
 * IEEE float32 divisions (fdiv), round-to-nearest-even (frintn), clamps and f16 scale
 * rule; the q8_2f column sums stay float64, row by row, with separate multiply and add
 * (no FMA). Scalar code handles the tails; the loops are quant_drivers.h's. */
#include <arm_neon.h>

#include "cortiq.h"
#include "quant_common.h"

/* max |x| over n floats; *bad set when some |x| is not <= limit (NaN included) */
static float absmax(const float *x, size_t n, float limit, int *bad) {
    const float32x4_t lim = vdupq_n_f32(limit);
    float32x4_t m = vdupq_n_f32(0.0f);
    uint32x4_t ok = vdupq_n_u32(0xffffffffu);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t a = vabsq_f32(vld1q_f32(x + i));
        ok = vandq_u32(ok, vcleq_f32(a, lim)); /* false for NaN */
        m = vmaxq_f32(m, a);                   /* (a NaN here is refused through ok) */
    }
    *bad |= vminvq_u32(ok) == 0;
    return sc_absmax(x, i, n, limit, vmaxvq_f32(m), bad);
}

/* rint(v / s) clamped to [lo, 127], as int32 */
static inline int32x4_t qvec(float32x4_t v, float32x4_t s, float32x4_t lo, float32x4_t hi) {
    const float32x4_t q = vminq_f32(vmaxq_f32(vrndnq_f32(vdivq_f32(v, s)), lo), hi);
    return vcvtq_s32_f32(q); /* exact: q is an integer in range */
}

static inline int8x16_t pack16(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d) {
    const int16x8_t ab = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
    const int16x8_t cd = vcombine_s16(vqmovn_s32(c), vqmovn_s32(d));
    return vcombine_s8(vqmovn_s16(ab), vqmovn_s16(cd));
}

/* 16 columns at a time; colv (q8_2f) divides x first, as the reference does */
static void codes(const float *x, const float *colv, size_t n, float s, float lo_f, int8_t *q) {
    const float32x4_t sv = vdupq_n_f32(s), lo = vdupq_n_f32(lo_f), hi = vdupq_n_f32(127.0f);
    size_t c = 0;
#define CQ_XV(k) (colv ? vdivq_f32(vld1q_f32(x + c + (k)), vld1q_f32(colv + c + (k))) : vld1q_f32(x + c + (k)))
    for (; c + 16 <= n; c += 16)
        vst1q_s8(q + c, pack16(qvec(CQ_XV(0), sv, lo, hi), qvec(CQ_XV(4), sv, lo, hi),
                               qvec(CQ_XV(8), sv, lo, hi), qvec(CQ_XV(12), sv, lo, hi)));
#undef CQ_XV
    sc_codes(x, colv, c, n, s, lo_f, q);
}

static int colsq(const float *x, size_t c0, size_t c1, double *acc) {
    const float32x4_t lim = vdupq_n_f32(LIMIT_Q8);
    uint32x4_t ok = vdupq_n_u32(0xffffffffu);
    size_t c = c0;
    for (; c + 4 <= c1; c += 4) {
        const float32x4_t xv = vld1q_f32(x + c);
        ok = vandq_u32(ok, vcleq_f32(vabsq_f32(xv), lim));
        const float64x2_t lo = vcvt_f64_f32(vget_low_f32(xv)), hi = vcvt_high_f64_f32(xv);
        vst1q_f64(acc + c, vaddq_f64(vld1q_f64(acc + c), vmulq_f64(lo, lo)));
        vst1q_f64(acc + c + 2, vaddq_f64(vld1q_f64(acc + c + 2), vmulq_f64(hi, hi)));
    }
    return sc_colsq(x, c, c1, acc) | (vminvq_u32(ok) == 0);
}

static float absmax_div(const float *x, const float *colv, size_t n) {
    float32x4_t mv = vdupq_n_f32(0.0f);
    size_t c = 0;
    for (; c + 4 <= n; c += 4) mv = vmaxq_f32(mv, vabsq_f32(vdivq_f32(vld1q_f32(x + c), vld1q_f32(colv + c))));
    return sc_absmax_div(x, colv, c, n, vmaxvq_f32(mv));
}

/* one zero-padded group of 32 floats -> 16 nibble bytes + f16 scale bits */
static int group4(const float *g, uint8_t *nib, uint16_t *scale_bits) {
    const float32x4_t lim = vdupq_n_f32(LIMIT_Q4);
    float32x4_t mv = vdupq_n_f32(0.0f);
    uint32x4_t ok = vdupq_n_u32(0xffffffffu);
    for (int k = 0; k < 32; k += 4) { /* absmax over the whole group (no tail) */
        const float32x4_t a = vabsq_f32(vld1q_f32(g + k));
        ok = vandq_u32(ok, vcleq_f32(a, lim));
        mv = vmaxq_f32(mv, a);
    }
    if (vminvq_u32(ok) == 0) return 1;
    float am = vmaxvq_f32(mv), s;
    *scale_bits = cq_scale_f16(am / 7.0f, &s);
    const float32x4_t sv = vdupq_n_f32(s), lo = vdupq_n_f32(-8.0f), hi = vdupq_n_f32(7.0f);
    const int8x16_t eight = vdupq_n_s8(8);
    const uint8x16_t a = vreinterpretq_u8_s8(vaddq_s8(
        pack16(qvec(vld1q_f32(g), sv, lo, hi), qvec(vld1q_f32(g + 4), sv, lo, hi),
               qvec(vld1q_f32(g + 8), sv, lo, hi), qvec(vld1q_f32(g + 12), sv, lo, hi)), eight));
    const uint8x16_t b = vreinterpretq_u8_s8(vaddq_s8(
        pack16(qvec(vld1q_f32(g + 16), sv, lo, hi), qvec(vld1q_f32(g + 20), sv, lo, hi),
               qvec(vld1q_f32(g + 24), sv, lo, hi), qvec(vld1q_f32(g + 28), sv, lo, hi)), eight));
    /* byte k: element 2k (low nibble) and 2k+1 (high) */
    vst1q_u8(nib, vorrq_u8(vuzp1q_u8(a, b), vshlq_n_u8(vuzp2q_u8(a, b), 4)));
    return 0;
}

/* FCVT rounds to nearest even (the default FPCR mode), overflows to inf and keeps a
 * NaN's top payload bits with the quiet bit set: cq_f32_to_f16's bits exactly. */
static void f32_to_f16_neon(const float *x, uint8_t *out, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float16x8_t h = vcombine_f16(vcvt_f16_f32(vld1q_f32(x + i)), vcvt_f16_f32(vld1q_f32(x + i + 4)));
        vst1q_u8(out + 2 * i, vreinterpretq_u8_f16(h));
    }
    for (; i < n; i++) cq_put_u16(out + 2 * i, cq_f32_to_f16(x[i]));
}

/* Exact for every value; a signalling NaN comes back quiet (as with F16C on x86). */
static void f16_to_f32_neon(const uint8_t *x, float *out, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float16x8_t h = vreinterpretq_f16_u8(vld1q_u8(x + 2 * i));
        vst1q_f32(out + i, vcvt_f32_f16(vget_low_f16(h)));
        vst1q_f32(out + i + 4, vcvt_high_f32_f16(h));
    }
    for (; i < n; i++) out[i] = cq_f16_to_f32((uint16_t)(x[2 * i] | (x[2 * i + 1] << 8)));
}

#include "quant_drivers.h"

CQ_QUANT_OPS(cq_quant_neon, f32_to_f16_neon, f16_to_f32_neon);
