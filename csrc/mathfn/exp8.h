/* exp8.h -- the scalar Cephes-style exp shared by the reference kernels and the
 * scalar tails of the SIMD twins (so a tail element equals its reference). */
#ifndef CQ_EXP8_H
#define CQ_EXP8_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#define CQ_EXP_LO (-87.0f)
#define CQ_EXP_HI 88.0f
#define CQ_LOG2E 1.44269504088896341f
#define CQ_EXP_C1 0.693359375f    /* ln 2 split in two for an exact n*ln2 */
#define CQ_EXP_C2 (-2.12194440e-4f)
#define CQ_EXP_P0 1.9875691500e-4f
#define CQ_EXP_P1 1.3981999507e-3f
#define CQ_EXP_P2 8.3334519073e-3f
#define CQ_EXP_P3 4.1665795894e-2f
#define CQ_EXP_P4 1.6666665459e-1f
#define CQ_EXP_P5 5.0000001201e-1f

static inline float cq_exp1(float x) {
    if (x != x) return x;  /* NaN propagates */
    float v = x < CQ_EXP_LO ? CQ_EXP_LO : (x > CQ_EXP_HI ? CQ_EXP_HI : x);
    float n = floorf(v * CQ_LOG2E + 0.5f);
    float g = v - n * CQ_EXP_C1 - n * CQ_EXP_C2;
    float p = CQ_EXP_P0;
    p = p * g + CQ_EXP_P1;
    p = p * g + CQ_EXP_P2;
    p = p * g + CQ_EXP_P3;
    p = p * g + CQ_EXP_P4;
    p = p * g + CQ_EXP_P5;
    p = p * g * g + g + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, 4);
    return p * two_n;
}
#endif
