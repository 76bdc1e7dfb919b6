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

/* x quantized for the int8-activation path (cq_qmat.act == CQ_ACT_INT8), one layout
 * per weight family and the same bytes on every ISA. Per group g of 32 columns:
 * d[g] = max|x| / 127 and xq = rint(x * (127 / max|x|)) in float32, ties to even (a
 * non-finite input gives d = that value and xq = 0, so the row's result is NaN/inf as
 * the float32 path's would be; an all-zero group gives d = 0, xq = 0). The families
 * differ only in where each xq byte goes, chosen so that the weights' natural SIMD
 * load meets x lane by lane, and in the per-lane bias that folds the weights' offset
 * into the integer sum (u8 x s8 products: vpmaddubsw / vpdpbusd):
 *
 * CQ_XQ_Q4 (q4_block, q4_tiled, q4tp; weights are nibbles u = q + 8): groups in blocks
 *   of four, 128 bytes a block b:
 *     q[128b + 16j + k]      = xq of element 2k of group 4b+j    (the low nibbles')
 *     q[128b + 64 + 16j + k] = xq of element 2k+1 of group 4b+j  (the high nibbles')
 *   so one 64-byte load of four groups' nibbles, split into low and high nibbles,
 *   meets the two halves lane by lane. Per 4-byte lane L (0..15) of a block:
 *     bias[16b + L] = -8 * (the 4 low-half plus the 4 high-half bytes of lane L)
 *     dl[16b + L]   = d[4b + L/4].
 * CQ_XQ_Q8 (q8_row; q8_2f on col * x): natural order, q[c] = xq of column c, padded to
 *   pairs of groups (64 bytes); dl[c/4] = d[c/32]; no bias (signed weights: the
 *   kernels take |w| and xq with w's sign).
 * CQ_XQ_Q2 (q2tp; weights as u = 2v = (2v - 3) + 3, v the 2-bit code): groups in
 *   blocks of eight, 256 bytes a block b, one 64-byte phase per bit pair j (0..3):
 *     q[256b + 64j + 8i + k] = xq of element 4k + j of group 8b + i  (k < 8)
 *   so phase j meets (codes >> 2j) & 3 of the block's 64 code bytes lane by lane.
 *   Per 4-byte lane L (0..15): bias[16b + L] = -3 * (the sum over the four phases of
 *   lane L's bytes: xq of the half group 16 (L % 2) .. of group 8b + L/2),
 *   dl[16b + L] = d[8b + L/2].
 * CQ_XQ_G32 (the ggml block formats, ggml_q32_*.h and ggml_kq_*.h): the CQ_XQ_Q8 layout
 *   (natural order, q[c] = xq of column c, padded to pairs of groups; dl[c/4] =
 *   d[c/32]) plus the sums a weight offset or min needs: per half group h (16
 *   columns) bias[2g + h] = sum of xq over columns 32g + 16h .. 32g + 16h + 15, so a
 *   group's sum is bias[2g] + bias[2g + 1]. x is quantized per 32 columns, which is
 *   the sub-block of the 32-weight formats and divides the K-quants' 256-weight
 *   superblocks (their 16- and 32-weight scale groups read d[c/32] and the sums). */
enum { CQ_XQ_Q4 = 0, CQ_XQ_Q8 = 1, CQ_XQ_Q2 = 2, CQ_XQ_G32 = 3 };
#define CQ_XQ_FAMILIES 4
typedef struct cq_xq {
    const int8_t *q;
    const int32_t *bias; /* NULL for CQ_XQ_Q8 */
    const float *d, *dl;
    int family;
} cq_xq;
/* The family of a dtype that takes int8 activations, -1 for the others. */
static inline int cq_xq_family(int dtype) {
    switch (dtype) {
    case CQ_DT_Q4_BLOCK: case CQ_DT_Q4_TILED: case CQ_DT_Q4TP: return CQ_XQ_Q4;
    case CQ_DT_Q8_ROW: case CQ_DT_Q8_2F: return CQ_XQ_Q8;
    case CQ_DT_Q2_K: case CQ_DT_Q3_K: case CQ_DT_Q4_K: case CQ_DT_Q5_K: case CQ_DT_Q6_K: case CQ_DT_IQ4_XS:
        return CQ_XQ_G32; /* ggml_kq_scalar.h: kq_ref_i8_row */
    case CQ_DT_Q2TP: return CQ_XQ_Q2;
    default: return -1;
    }
}
/* Bytes of a family's buffer for cols columns (a multiple of 64). */
size_t cq_xq_bytes(int family, size_t cols);
/* buf: cq_xq_bytes(family, cols) bytes at a 64-byte boundary; cols % 32 == 0. */
void cq_xq_build(int family, const float *x, size_t cols, void *buf, cq_xq *xq);
/* The pieces of cq_xq_build, for SIMD twins that must produce its exact bytes: the
 * sections of buf (with the padding groups written); one group's 32 floats quantized
 * (returns d; q[32] the xq in column order); group g placed from them; and group g
 * from its 32 floats (xg NULL: a zero group). */
void cq_xq_view(int family, void *buf, size_t cols, cq_xq *xq);
float cq_xq_quant32(const float *xg, int8_t *q);
void cq_xq_put(const cq_xq *xq, size_t g, const int8_t *q, float d);
void cq_xq_group(const cq_xq *xq, size_t g, const float *xg);
#endif
