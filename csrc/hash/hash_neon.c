/* hash_neon.c -- hash64 with 2x64-bit lanes. NEON has no 64-bit lane multiply, so x*C
 * is lo(x)*lo(C) + ((hi(x)*lo(C) + lo(x)*hi(C)) << 32) with umull/umlal on the 32-bit
 * halves. Four vector accumulators (8 words = 64 bytes per iteration); scalar tail from
 * hash_common.h. AArch64 is little-endian in every ABI cortiq builds for. */
#include <arm_neon.h>

#include "cortiq.h"
#include "hash_common.h"

static inline uint64x2_t mul_const(uint64x2_t x, uint32x2_t clo, uint32x2_t chi) {
    const uint32x2_t xl = vmovn_u64(x), xh = vshrn_n_u64(x, 32);
    const uint64x2_t cross = vmlal_u32(vmull_u32(xh, clo), xl, chi);
    return vaddq_u64(vmull_u32(xl, clo), vshlq_n_u64(cross, 32));
}

static inline uint64x2_t fmix2(uint64x2_t x, uint32x2_t m1lo, uint32x2_t m1hi, uint32x2_t m2lo,
                               uint32x2_t m2hi) {
    x = veorq_u64(x, vshrq_n_u64(x, 33));
    x = mul_const(x, m1lo, m1hi);
    x = veorq_u64(x, vshrq_n_u64(x, 33));
    x = mul_const(x, m2lo, m2hi);
    return veorq_u64(x, vshrq_n_u64(x, 33));
}

static uint64_t hash64_neon(const uint8_t *p, size_t n) {
    size_t nw = n / 8, i = 0;
    const uint32x2_t m1lo = vdup_n_u32((uint32_t)(CQ_H_M1 & 0xffffffffu)), m1hi = vdup_n_u32((uint32_t)(CQ_H_M1 >> 32));
    const uint32x2_t m2lo = vdup_n_u32((uint32_t)(CQ_H_M2 & 0xffffffffu)), m2hi = vdup_n_u32((uint32_t)(CQ_H_M2 >> 32));
    const uint64_t G = CQ_H_G;
    /* lane j of g_k holds (i + 2k + j) * G; all advance by 8G per iteration */
    const uint64_t g01[2] = {0, G};
    uint64x2_t g0 = vld1q_u64(g01);
    uint64x2_t g1 = vaddq_u64(g0, vdupq_n_u64(2 * G)), g2 = vaddq_u64(g0, vdupq_n_u64(4 * G)),
               g3 = vaddq_u64(g0, vdupq_n_u64(6 * G));
    const uint64x2_t step = vdupq_n_u64(8 * G);
    uint64x2_t a0 = vdupq_n_u64(0), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 8 <= nw; i += 8) {
        const uint8_t *q = p + 8 * i;
        a0 = veorq_u64(a0, veorq_u64(fmix2(vreinterpretq_u64_u8(vld1q_u8(q)), m1lo, m1hi, m2lo, m2hi), g0));
        a1 = veorq_u64(a1, veorq_u64(fmix2(vreinterpretq_u64_u8(vld1q_u8(q + 16)), m1lo, m1hi, m2lo, m2hi), g1));
        a2 = veorq_u64(a2, veorq_u64(fmix2(vreinterpretq_u64_u8(vld1q_u8(q + 32)), m1lo, m1hi, m2lo, m2hi), g2));
        a3 = veorq_u64(a3, veorq_u64(fmix2(vreinterpretq_u64_u8(vld1q_u8(q + 48)), m1lo, m1hi, m2lo, m2hi), g3));
        g0 = vaddq_u64(g0, step);
        g1 = vaddq_u64(g1, step);
        g2 = vaddq_u64(g2, step);
        g3 = vaddq_u64(g3, step);
    }
    const uint64x2_t a = veorq_u64(veorq_u64(a0, a1), veorq_u64(a2, a3));
    return cq_h_finish(p, n, i, vgetq_lane_u64(a, 0) ^ vgetq_lane_u64(a, 1));
}

const cq_hash_ops cq_hash_neon = {hash64_neon};
