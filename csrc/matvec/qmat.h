/* qmat.h -- CMF payload layout helpers shared by the matvec reference and its SIMD
 * twins (static inline, so each ISA file compiles its own copy). Layouts: CMF_FORMAT §7. */
#ifndef CQ_QMAT_H
#define CQ_QMAT_H
#include "../cortiq.h"
#include <string.h>

#define CQ_GROUP 32

/* IEEE half -> float, exact for every input (subnormals, inf, NaN). */
static inline float cq_h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: man * 2^-24 */
        float f = (float)man * 5.9604644775390625e-8f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float cq_bf2f(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t cq_ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static inline float cq_ldf32(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

/* Groups per row and code-bytes per row of q4tp/q2tp. */
static inline size_t cq_tp_gpr(size_t cols) { return cols / CQ_GROUP; }
static inline size_t cq_tp_stride(size_t cols) { return (5 * (cols / CQ_GROUP) + 7) / 8; }
static inline size_t cq_tp_tile(int dtype) { return dtype == CQ_DT_Q4TP ? 16 : 8; }
static inline size_t cq_ceil32(size_t n) { return (n + CQ_GROUP - 1) / CQ_GROUP; }

/* Size of the per-call scratch a SIMD driver may want per thread (floats). */
#endif
