/* qmat.h -- CMF payload layout helpers shared by the matvec reference and its SIMD
 * twins (static inline, so each ISA file compiles its own copy).
 * Layouts: docs/cmf-format.md §7. */
#ifndef CQ_QMAT_H
#define CQ_QMAT_H
#include "../cortiq.h"
#include <string.h>

#define CQ_GROUP 32

/* Software prefetch distance (bytes) of the weight streams, into L2 (_MM_HINT_T1):
 * the hardware prefetchers alone leave a one-stream matvec well short of the read
 * bandwidth on the virtual machines measured (docs/PERFORMANCE.md, "Prefetch"). */
#ifndef CQ_PF_DIST /* (overridable for benchmarks/ab_variants.sh) */
#define CQ_PF_DIST 8192
#endif
/* ... and 1 KiB ahead into L1 (_MM_HINT_T0), so the demand loads hit L1 rather than
 * wait on L2 (a few points of the read bandwidth). */
#ifndef CQ_PF_NEAR /* (overridable for benchmarks/ab_variants.sh) */
#define CQ_PF_NEAR 1024
#endif
/* Several streams per core (matvec_drivers.h: CQ_ROW_STREAMS; readbw.c): each stream
 * reads this many bytes of a panel before the panel moves on. On Zen 3, 128 KiB lanes
 * read faster from DRAM than 16 KiB ones; 64 KiB to 1 MiB are level, 4 and 8 KiB
 * slower (docs/PERFORMANCE.md, "Memory streams"). */
#ifndef CQ_LANE_BYTES /* (overridable for benchmarks/ab_variants.sh) */
#define CQ_LANE_BYTES 131072
#endif
/* The four-stream kernels prefetch only this far ahead, into L1: with CQ_PF_DIST and
 * CQ_PF_NEAR (the one-stream kernels' pair, four streams x 8 KiB ahead) the same
 * matvecs ran 15-30 % slower. */
#ifndef CQ_LANE_PF_NEAR /* (overridable for benchmarks/ab_variants.sh) */
#define CQ_LANE_PF_NEAR 256
#endif

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

/* Where the weights of columns [c0, c1) of row r start (*p) and how many bytes they
 * take, scales aside: what to prefetch ahead of decoding them. The grouped layouts
 * count groups over the flat element index (docs/cmf-format.md §7: q4_block and q4_tiled
 * groups run across rows when cols % 32 != 0). 0 for the layouts whose rows have no
 * fixed place (vbit, vbit_ro). A hint only: never read through it. */
static inline size_t cq_row_span(const cq_qmat *m, size_t r, size_t c0, size_t c1, const uint8_t **p) {
    size_t per; /* bytes an element, or (grouped) a group of CQ_GROUP */
    switch (m->dtype) {
    case CQ_DT_F32: per = 4; break;
    case CQ_DT_F16: case CQ_DT_BF16: per = 2; break;
    case CQ_DT_Q8_ROW: case CQ_DT_Q8_2F: per = 1; break;
    case CQ_DT_Q4_BLOCK: case CQ_DT_Q4TP: per = 16; break;
    case CQ_DT_Q4_TILED: per = 18; break;
    case CQ_DT_Q2TP: per = 8; break;
    default: return 0;
    }
    const size_t e0 = r * m->cols + c0, e1 = r * m->cols + c1;
    if (per < 8) {
        *p = m->data + per * e0;
        return per * (e1 - e0);
    }
    *p = m->data + per * (e0 / CQ_GROUP);
    return per * (cq_ceil32(e1) - e0 / CQ_GROUP);
}

/* x quantized for the int8-activation path (cq_set_int8_act), one layout for every
 * ISA so all of them see the same integers. d[g] = max|x[group g]| / 127 and
 * xq = round(x / d[g]) (a non-finite input gives d = that value and xq = 0, so the
 * row's result is NaN as the float32 path's would be). Groups go in blocks of four
 * (padded with zero groups), 128 bytes a block b:
 *   q[128b + 16j + k]      = xq of element 2k of group 4b+j    (the low nibbles')
 *   q[128b + 64 + 16j + k] = xq of element 2k+1 of group 4b+j  (the high nibbles')
 * so one 64-byte load of four groups' nibbles, split into low and high nibbles, meets
 * the two halves lane by lane. Per 4-byte lane L (0..15) of a block:
 *   bias[16b + L] = -8 * (the 4 low-half plus the 4 high-half bytes of lane L)
 *                   (the nibbles' -8, summed where maddubs+madd / VNNI sum them)
 *   dl[16b + L]   = d[4b + L/4]  (the scale per lane) */
typedef struct cq_xq {
    const int8_t *q;
    const int32_t *bias;
    const float *d, *dl;
} cq_xq;
size_t cq_xq_bytes(size_t cols);
/* buf: cq_xq_bytes(cols) bytes at a 64-byte boundary; cols % 32 == 0. */
void cq_xq_build(const float *x, size_t cols, void *buf, cq_xq *xq);
/* The pieces of cq_xq_build, for SIMD twins that must produce its exact bytes:
 * the sections of buf (with the padding groups written), and group g from its 32
 * floats (xg NULL: a zero group). */
void cq_xq_view(void *buf, size_t cols, cq_xq *xq);
void cq_xq_group(const cq_xq *xq, size_t g, const float *xg);
#endif
