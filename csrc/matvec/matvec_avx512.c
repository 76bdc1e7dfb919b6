/* matvec_avx512.c -- AVX-512 twin of the matvec family: the q8 (q8_row, q8_2f), q4
 * (q4_block, q4_tiled, q4tp) and q2tp row dots, the int8-activation rows of all six,
 * the matmat block and the int8 matmat (matmat_i8_avx512.h) run 16 lanes, faster than
 * the AVX2 code for these; f32/f16/bf16 (16 lanes read slower from DRAM), vbit and the
 * row decoders are the AVX2 code of matvec_avx2_impl.h (docs/PERFORMANCE.md §9,
 * "AVX-512 kernel choices"). Same contracts as the reference. */
#include "matvec_avx2_impl.h"

static inline __m512 z_i8(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* The nibbles of four q4_tiled tiles, p at the first one's nibbles (tile + 2): tile k's
 * 16 bytes start 18k bytes on, so 128-bit lane k comes from a load at p + 2k (three
 * blends, which any vector port runs, instead of a vpermt2b: 2 cycles on port 5 here).
 * The VBMI paths take it; the plain ones keep q4_nibbles4's inserts (in q4_nibbles4 it
 * slowed the code generated for the int8 rows). */
static inline __m512i q4_tiles4(const uint8_t *p) {
    const __m512i ab = _mm512_mask_blend_epi32(0x00F0, _mm512_loadu_si512((const void *)p),
                                               _mm512_loadu_si512((const void *)(p + 2)));
    const __m512i cd = _mm512_mask_blend_epi32(0xF000, _mm512_loadu_si512((const void *)(p + 4)),
                                               _mm512_loadu_si512((const void *)(p + 6)));
    return _mm512_mask_blend_epi32(0xFF00, ab, cd);
}

/* The nibbles of groups g .. g+n-1 (n <= 4) of a row, zero past n. */
static inline __m512i q4_nibbles4(const uint8_t *p, size_t gs, size_t n) {
    if (gs == 16) /* q4_block, q4tp: contiguous */
        return n >= 4 ? _mm512_loadu_si512((const void *)p) : _mm512_maskz_loadu_epi8((1ULL << (16 * n)) - 1, p);
    __m512i v = _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)p)); /* q4_tiled: 18-byte tiles */
    if (n > 1) v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + gs)), 1);
    if (n > 2) v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 2 * gs)), 2);
    if (n > 3) v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 3 * gs)), 3);
    return v;
}

/* One q4 group on 16 lanes (the groups past a row's last block of four; matmat's
 * decoder uses the same table): the group's scale goes into a 16-entry table of its decoded weights,
 * lut[k] = (k - 8) * scale (exactly the reference's float32 weight), and vpermps looks
 * the nibbles up (it reads the low 4 bits of each lane, so the low nibbles need no
 * mask). The 16 bytes widen once; low nibbles (even elements) meet xg[0..15], high
 * nibbles (odd elements) xg[16..31]. Against convert-then-scale this dropped the mask,
 * two subtracts, two converts and the scale multiply-add per group (10 -> 7 vector
 * uops). */
#define Q4_LUT(sc) _mm512_mul_ps(lut8, _mm512_set1_ps(sc))
#define Q4_G(nib, xg, lut, A, B)                                                     \
    do {                                                                             \
        __m512i b_ = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(nib)));  \
        A = _mm512_fmadd_ps(_mm512_permutexvar_ps(b_, lut), _mm512_loadu_ps(xg), A); \
        B = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(b_, 4), lut),    \
                            _mm512_loadu_ps((xg) + 16), B);                          \
    } while (0)

#if defined(__GNUC__) || defined(__clang__)
#define CQ_HAVE_VBMI_CODES 1
/* q4tp scales with VBMI, 16 groups at a time: their 16 five-bit codes fill 10 bytes (bit
 * 5j, low bit first); vpermb gives qword i bytes from 10i / 8 on, vpmultishiftqb moves
 * the bits of codes 2i and 2i + 1 to the low bytes of its two dwords, and vpermt2ps
 * looks them up in the row's 32-entry ladder (it reads 5 bits). Three port-5 uops for
 * 16 groups against about 14 uops in the 64-bit shift decoder below. Returns the
 * groups done (a multiple of 16). */
__attribute__((target("avx512vbmi"))) static size_t tp_scales_vbmi(const uint8_t *cb, const float *ladder,
                                                                    size_t ng, float *sw) {
    static const uint8_t place[64] = {0, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 8,
                                      2, 3, 4, 5, 6, 7, 8, 9, 3, 4, 5, 6, 7, 8, 9, 10,
                                      5, 6, 7, 8, 9, 10, 11, 12, 6, 7, 8, 9, 10, 11, 12, 13,
                                      7, 8, 9, 10, 11, 12, 13, 14, 8, 9, 10, 11, 12, 13, 14, 15};
    /* qword i starts at bit 8 * (10i / 8); its codes sit at (10i) % 8 and 5 more */
    const __m512i at = _mm512_loadu_si512((const void *)place);
    const __m512i shift = _mm512_set_epi64(0x0000000b00000006LL, 0x0000000900000004LL, 0x0000000700000002LL,
                                           0x0000000500000000LL, 0x0000000b00000006LL, 0x0000000900000004LL,
                                           0x0000000700000002LL, 0x0000000500000000LL);
    const __m512 l0 = _mm512_loadu_ps(ladder), l1 = _mm512_loadu_ps(ladder + 16);
    size_t k = 0;
    for (; k + 16 <= ng; k += 16) {
        /* 10 bytes, no further: an 8-byte and a 2-byte load (a byte-masked load of the 10
         * cost about as much as the row's dot products on Zen 4) */
        const uint8_t *p = cb + 5 * (k / 8);
        uint16_t tail;
        memcpy(&tail, p + 8, 2);
        const __m512i raw = _mm512_zextsi128_si512(_mm_insert_epi16(_mm_loadl_epi64((const __m128i *)p), tail, 4));
        const __m512i c = _mm512_multishift_epi64_epi8(shift, _mm512_permutexvar_epi8(at, raw));
        _mm512_storeu_ps(sw + k, _mm512_permutex2var_ps(l0, c, l1));
    }
    return k;
}
#endif

/* sw[0 .. ng) = the scales of groups g0 .. g0+ng-1 of row r: 16 at a time here, the
 * rest by the AVX2 decoder (avx2_group_scales). */
static void group_scales(const cq_qmat *m, size_t r, size_t g0, size_t ng, float *sw) {
    size_t k = 0;
    switch (m->dtype) {
    case CQ_DT_Q4_BLOCK:
        for (const uint8_t *sp = q4b_scale_at(m, r, g0); k + 16 <= ng; k += 16)
            _mm512_storeu_ps(sw + k, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sp + 2 * k))));
        break;
    case CQ_DT_Q4_TILED: { /* each tile starts with its half: gather 16 of them */
        const uint8_t *tp = m->data + 18 * (r * (m->cols / CQ_GROUP) + g0);
        const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32(18));
        for (; k + 16 <= ng; k += 16) {
            __m512i h = _mm512_i32gather_epi32(at, (const void *)(tp + 18 * k), 1);
            _mm512_storeu_ps(sw + k, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)));
        }
        break;
    }
    default: { /* q4tp, q2tp: 8 codes per 5 bytes, looked up in the row's 32-entry ladder */
        const size_t gpr = m->cols / CQ_GROUP, stride = cq_tp_stride(m->cols);
        const uint8_t *cb = m->data + m->rows * gpr * cq_tp_tile(m->dtype) + 4 * m->rows + r * stride + 5 * (g0 / 8);
        const float *ladder = m->aux + 32 * r;
#ifdef CQ_HAVE_VBMI_CODES
        if (cq_cpu_features() & CQ_CPU_AVX512VBMI) {
            k = tp_scales_vbmi(cb, ladder, ng, sw);
            break;
        }
#endif
        const __m512 l0 = _mm512_loadu_ps(ladder), l1 = _mm512_loadu_ps(ladder + 16);
        const __m512i sh = _mm512_setr_epi64(0, 5, 10, 15, 20, 25, 30, 35), m31 = _mm512_set1_epi64(31);
        for (; k + 16 <= ng; k += 16) {
            const uint8_t *p = cb + 5 * (k / 8);
            uint32_t w0, w1; /* 4 + 1 byte loads: a 5-byte memcpy into a stack qword stalled on store forwarding */
            memcpy(&w0, p, 4);
            memcpy(&w1, p + 5, 4);
            uint64_t v0 = w0 | (uint64_t)p[4] << 32, v1 = w1 | (uint64_t)p[9] << 32;
            __m256i c0 = _mm512_cvtepi64_epi32(_mm512_and_si512(_mm512_srlv_epi64(_mm512_set1_epi64((long long)v0), sh), m31));
            __m256i c1 = _mm512_cvtepi64_epi32(_mm512_and_si512(_mm512_srlv_epi64(_mm512_set1_epi64((long long)v1), sh), m31));
            __m512i c = _mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1);
            _mm512_storeu_ps(sw + k, _mm512_permutex2var_ps(l0, c, l1));
        }
    }
    }
    if (k < ng) avx2_group_scales(m, r, g0 + k, ng - k, sw + k);
}

/* q4_block / q4_tiled / q4tp rows (cols % 32 == 0), four groups at a time. One
 * 64-byte load holds their 128 nibbles as 16 dwords (dword j: 8 nibbles of group j/4);
 * nibble k of every dword is (v >> 4k) & 15, and vpermps reads just those 4 low bits
 * out of a table of q - 8, so each 16 weights cost a shift, a lookup and an FMA against
 * x laid out to match (grouped_prep: xp[128b + 16k + j] = x[128b + 8j + k]). The lanes of a
 * vector span the four groups, so the sum over the 8 nibbles is scaled once per block
 * by the groups' scales spread 4 lanes each. Against a scaled table per group (a widen,
 * two lookups, a shift, two FMAs and the table's multiply per 32 weights: 7 uops on the
 * two 512-bit ports) this is 26 per 128 weights instead of 28, and no lane widening on
 * port 5 (two blocks an iteration read slower from DRAM). Groups past the last block of
 * four take the per-group table (Q4_G), x laid out per group (evens, odds). */
static inline __m512 q4_sum4(__m512i v, const float *xb, __m512 lut8) {
    __m512 t0 = _mm512_mul_ps(_mm512_permutexvar_ps(v, lut8), _mm512_loadu_ps(xb));
    __m512 t1 = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut8), _mm512_loadu_ps(xb + 16));
    t0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 8), lut8), _mm512_loadu_ps(xb + 32), t0);
    t1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 12), lut8), _mm512_loadu_ps(xb + 48), t1);
    t0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 16), lut8), _mm512_loadu_ps(xb + 64), t0);
    t1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 20), lut8), _mm512_loadu_ps(xb + 80), t1);
    t0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 24), lut8), _mm512_loadu_ps(xb + 96), t0);
    t1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 28), lut8), _mm512_loadu_ps(xb + 112), t1);
    return _mm512_add_ps(t0, t1);
}
#define Q4_LUT8 _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7)
#define Q4_SPREAD _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)

static float q4_dot512(const cq_qmat *m, size_t r, const float *x) {
    const size_t gpr = m->cols / CQ_GROUP, gs = m->dtype == CQ_DT_Q4_TILED ? 18 : 16;
    const uint8_t *nb = m->data + gs * r * gpr + (gs == 18 ? 2 : 0);
    const __m512 lut8 = Q4_LUT8;
    const __m512i spread = Q4_SPREAD;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, tail0 = acc0, tail1 = acc0;
    float sw[64];
    for (size_t g0 = 0; g0 < gpr; g0 += 64) {
        const size_t ng = gpr - g0 < 64 ? gpr - g0 : 64;
        group_scales(m, r, g0, ng, sw);
        const uint8_t *p = nb + gs * g0;
        const float *xg = x + 32 * g0;
        size_t g = 0;
        for (; g + 4 <= ng; g += 4) {
            const uint8_t *pb = p + gs * g;
            if (gs == 18) CQ_STREAM_PF_SPAN(pb, 72);
            else CQ_STREAM_PF(pb);
            const __m512 d = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_loadu_ps(sw + g)));
            const __m512 t = q4_sum4(q4_nibbles4(pb, gs, 4), xg + 32 * g, lut8);
            if (g & 4) acc1 = _mm512_fmadd_ps(t, d, acc1);
            else acc0 = _mm512_fmadd_ps(t, d, acc0);
        }
        for (; g < ng; g++) Q4_G(p + gs * g, xg + 32 * g, Q4_LUT(sw[g]), tail0, tail1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(tail0, tail1)));
}

/* q2tp rows (cols % 32 == 0), eight groups at a time: one 64-byte load holds their 256
 * two-bit codes as 16 dwords (dword j: codes 0..15 of elements 16j .. 16j + 15 of the
 * block), and code c of every dword is (v >> 2c), which vpermps looks up in a table of
 * v - 1.5 (it reads 4 bits, so the table repeats every 4 entries), against x laid out to
 * match (grouped_prep: xp[256b + 16c + j] = x[256b + 16j + c]); the block's sum is scaled
 * once by its eight scales spread two lanes each. A shift, a lookup and an FMA per 16
 * weights, as in q4_sum4, against the AVX2 group kernel's widen, four masks and four
 * converts per 32 weights (about three times as fast in L2). Groups
 * past the last block of eight take that AVX2 kernel (q2_gdot, x laid out per group as
 * avx2_prep_x does). */
static inline __m512 q2_sum8(__m512i v, const float *xb) {
    const __m512 lut = _mm512_setr_ps(-1.5f, -0.5f, 0.5f, 1.5f, -1.5f, -0.5f, 0.5f, 1.5f,
                                      -1.5f, -0.5f, 0.5f, 1.5f, -1.5f, -0.5f, 0.5f, 1.5f);
    __m512 t0 = _mm512_mul_ps(_mm512_permutexvar_ps(v, lut), _mm512_loadu_ps(xb));
    __m512 t1 = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 2), lut), _mm512_loadu_ps(xb + 16));
#pragma GCC unroll 7
    for (int c = 2; c < 16; c += 2) {
        t0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 2 * c), lut), _mm512_loadu_ps(xb + 16 * c), t0);
        t1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 2 * c + 2), lut),
                             _mm512_loadu_ps(xb + 16 * c + 16), t1);
    }
    return _mm512_add_ps(t0, t1);
}

static float q2_dot512(const cq_qmat *m, size_t r, const float *x) {
    const size_t gpr = m->cols / CQ_GROUP;
    const uint8_t *body = m->data + 8 * r * gpr;
    const __m512i spread = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    __m256 tail = _mm256_setzero_ps();
    float sw[64];
    for (size_t g0 = 0; g0 < gpr; g0 += 64) {
        const size_t ng = gpr - g0 < 64 ? gpr - g0 : 64;
        group_scales(m, r, g0, ng, sw);
        size_t g = 0;
        for (; g + 8 <= ng; g += 8) {
            const uint8_t *pb = body + 8 * (g0 + g);
            CQ_STREAM_PF(pb);
            const __m512 d = _mm512_permutexvar_ps(spread, _mm512_castps256_ps512(_mm256_loadu_ps(sw + g)));
            const __m512 t = q2_sum8(_mm512_loadu_si512((const void *)pb), x + 32 * (g0 + g));
            if (g & 8) acc1 = _mm512_fmadd_ps(t, d, acc1);
            else acc0 = _mm512_fmadd_ps(t, d, acc0);
        }
        for (; g < ng; g++) /* q2_gdot sums 2v - 3 */
            tail = _mm256_fmadd_ps(q2_gdot(body + 8 * (g0 + g), x + 32 * (g0 + g)), _mm256_set1_ps(sw[g]), tail);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + 0.5f * cq_hsum8(tail);
}

/* q4_block, q4_tiled, q4tp with whole groups: the dtypes q4_dot512 and matmat's
 * 16-lane decoder take. */
static int q4_grouped(const cq_qmat *m) {
    return (m->dtype == CQ_DT_Q4_BLOCK || m->dtype == CQ_DT_Q4_TILED || m->dtype == CQ_DT_Q4TP) && grouped_fast(m);
}
/* q2tp with whole groups: q2_dot512 and matmat's 8-lane q2 decoder. */
static int q2_grouped(const cq_qmat *m) { return m->dtype == CQ_DT_Q2TP && grouped_fast(m); }

/* x for q4_dot512 and q2_dot512, whose 64-byte blocks hold n = 8 nibbles (q4, four
 * groups) or n = 16 codes (q2, eight groups) per dword: blocks transposed, xp[16n b +
 * 16k + j] = x[16n b + n j + k], then the groups past the last block as avx2_prep_x
 * lays them (q4: evens, odds; q2: code k of bytes 0..7). */
static void grouped_prep(const cq_qmat *m, const float *x, float *xp) {
    const int q2 = m->dtype == CQ_DT_Q2TP, n = q2 ? 16 : 8;
    const size_t gpr = m->cols / CQ_GROUP, nblk = gpr / (n / 2);
    const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(n));
    for (size_t b = 0; b < nblk; b++)
        for (int k = 0; k < n; k++)
            _mm512_storeu_ps(xp + 16 * n * b + 16 * k, _mm512_i32gather_ps(at, x + 16 * n * b + k, 4));
    for (size_t g = nblk * (n / 2); g < gpr; g++) {
        const float *xg = x + 32 * g;
        float *o = xp + 32 * g;
        for (int i = 0; i < 32; i++) o[i] = q2 ? xg[4 * (i & 7) + i / 8] : xg[2 * (i & 15) + i / 16];
    }
}
static void prep_x(const cq_qmat *m, const float *x, float *xp) {
    if (q4_grouped(m) || q2_grouped(m)) grouped_prep(m, x, xp);
    else avx2_prep_x(m, x, xp);
}



/* ---- int8 activations (cq_qmat.act; spec: ref_i8_row) ----
 * q4: four groups per 512-bit register: one 64-byte load of their nibbles, split into low
 * and high nibbles, meets xq's block of four lane by lane (qmat.h); u8 x s8 products
 * summed per 4-byte lane (maddubs + madd, or VNNI dpbusd) start from xq's bias (the
 * nibbles' -8); lanes 4j..4j+3 then hold group j, scaled by scale * d in float. */

/* cq_xq_build on 16 lanes, byte for byte the same: the same float32 operations
 * (|x| max, 127 / amax, x * id) and _mm512_cvtps_epi32 rounds to nearest-even as
 * lrintf does in the default rounding mode. The scalar build took ~10 us for 4096
 * columns, more than a 32 x 4096 q4 matvec itself. Non-finite groups go through
 * cq_xq_group. */
#define CQ_HAVE_XQ_BUILD
/* One group of 32 of x in two registers and its max |x|; 0 when the group is one the
 * scalar builder must take: a NaN (max drops it, so asked apart), an inf, or all zero. */
static inline int xq_group_load(const float *xg, __m512 *a, __m512 *b, float *amax) {
    *a = _mm512_loadu_ps(xg);
    *b = _mm512_loadu_ps(xg + 16);
    *amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(*a), _mm512_abs_ps(*b)));
    return !(_mm512_cmp_ps_mask(*a, *a, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(*b, *b, _CMP_UNORD_Q)) &&
           *amax <= 3.4028234663852886e38f && *amax != 0.0f;
}

static void xq_build_q8(const float *x, size_t cols, void *buf, cq_xq *xq);
static void xq_build(int family, const float *x, size_t cols, void *buf, cq_xq *xq) {
    if (family == CQ_XQ_Q8) {
        xq_build_q8(x, cols, buf, xq);
        return;
    }
    if (family != CQ_XQ_Q4) { /* q2: the 8-lane quantizer, then cq_xq_put's transposition */
        avx2_xq_build(family, x, cols, buf, xq);
        return;
    }
    const size_t ng = cols / CQ_GROUP;
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    const __m512i pick = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    cq_xq_view(CQ_XQ_Q4, buf, cols, xq);
    for (size_t g = 0; g < ng; g++) {
        const float *xg = x + CQ_GROUP * g;
        __m512 a, b;
        float amax;
        if (!xq_group_load(xg, &a, &b, &amax)) {
            cq_xq_group(xq, g, xg);
            continue;
        }
        __m512 id = _mm512_set1_ps(127.0f / amax);
        __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, id)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, id));
        __m512i e = _mm512_permutex2var_epi32(qa, ev, qb), o = _mm512_permutex2var_epi32(qa, od, qb);
        int8_t *qe = (int8_t *)xq->q + 128 * (g / 4) + 16 * (g % 4);
        _mm_storeu_si128((__m128i *)qe, _mm512_cvtepi32_epi8(e));
        _mm_storeu_si128((__m128i *)(qe + 64), _mm512_cvtepi32_epi8(o));
        __m512i s = _mm512_add_epi32(e, o); /* lane k: the pair k; four pairs per 4-byte lane */
        s = _mm512_add_epi32(s, _mm512_shuffle_epi32(s, _MM_PERM_CDAB));
        s = _mm512_add_epi32(s, _mm512_shuffle_epi32(s, _MM_PERM_BADC));
        s = _mm512_mullo_epi32(_mm512_permutexvar_epi32(pick, s), _mm512_set1_epi32(-8));
        _mm_storeu_si128((__m128i *)(xq->bias + 4 * g), _mm512_castsi512_si128(s));
        const float dg = amax / 127.0f;
        _mm_storeu_ps((float *)xq->dl + 4 * g, _mm_set1_ps(dg));
        ((float *)xq->d)[g] = dg;
    }
}

/* CQ_XQ_Q8 on 16 lanes: natural order, so a group is two converts and two narrowing
 * stores. */
static void xq_build_q8(const float *x, size_t cols, void *buf, cq_xq *xq) {
    const size_t ng = cols / CQ_GROUP;
    cq_xq_view(CQ_XQ_Q8, buf, cols, xq);
    for (size_t g = 0; g < ng; g++) {
        const float *xg = x + CQ_GROUP * g;
        __m512 a, b;
        float amax;
        if (!xq_group_load(xg, &a, &b, &amax)) {
            cq_xq_group(xq, g, xg);
            continue;
        }
        __m512 id = _mm512_set1_ps(127.0f / amax);
        int8_t *q = (int8_t *)xq->q + CQ_GROUP * g;
        _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(a, id))));
        _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(b, id))));
        const float dg = amax / 127.0f;
        _mm256_storeu_ps((float *)xq->dl + 8 * g, _mm256_set1_ps(dg));
        ((float *)xq->d)[g] = dg;
    }
}

/* The int8 q4 rows fold four blocks (16 groups) at a time: each block's integer sums
 * (lanes 4j..4j+3 of block b: group 4b + j) are added across their four lanes by two
 * rounds of unpack + add (exact integers), which leaves lane 4j + b holding group
 * 4b + j whole; one vpermd puts the 16 groups in column order, and a single convert,
 * scale multiply (scale * d, 16 groups) and FMA per 16 groups replace the per-block
 * spread, multiply, convert and FMA over lanes that repeated each group four times.
 * Chunks start at multiples of 16 groups of the row; the accumulator is one register
 * and the row ends with its horizontal sum. Every AVX-512 int8 q4 kernel (q4i8_tile on
 * 1, 2 or 4 rows, the VBMI q4_tiled rows, the multi-input tiles) does these float
 * operations in this order, so they agree bit for bit. */
static const int32_t Q4_GROUP_ORDER[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
static inline __m512i q4_pair(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
static inline __m512i q4_quad(__m512i ab, __m512i cd) {
    return _mm512_permutexvar_epi32(_mm512_loadu_si512((const void *)Q4_GROUP_ORDER),
                                    _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd)));
}
/* f + (the 16 groups' integer sums) * (sc * d), n of them valid (the rest are zero) */
static inline __m512 q4_fold16(__m512 f, __m512i ab, __m512i cd, __m512 sc, const float *d, size_t n) {
    const __mmask16 k = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(q4_quad(ab, cd)), _mm512_mul_ps(sc, _mm512_maskz_loadu_ps(k, d)), f);
}
static inline __m512 q4_scales16(const float *sw, size_t n) {
    return _mm512_maskz_loadu_ps(n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1), sw);
}

/* One block of four groups of one row against xq: the integer sums (bias included). */
#define Q4_BLOCK_SUM(DOT, v, xa, xb, bias)                                                        \
    DOT(DOT(bias, _mm512_and_si512(v, m0f), xa), _mm512_and_si512(_mm512_srli_epi16(v, 4), m0f), xb)

/* The scales of the 16 groups g .. g+15 of row r, decoded in registers (no store and
 * reload through a scale row): q4_block's 16 halves are contiguous; q4tp's 16 codes
 * fill 10 bytes (tp_code16, tp_code16_vbmi); q4_tiled's halves are gathered (the VBMI
 * kernels spread them from the tiles instead). */
static inline __m512 tp_code16(const uint8_t *p, __m512 l0, __m512 l1) {
    const __m512i sh = _mm512_setr_epi64(0, 5, 10, 15, 20, 25, 30, 35), m31 = _mm512_set1_epi64(31);
    uint32_t w0, w1; /* 4 + 1 byte loads: a 5-byte memcpy into a stack qword stalled on store forwarding */
    memcpy(&w0, p, 4);
    memcpy(&w1, p + 5, 4);
    const uint64_t v0 = w0 | (uint64_t)p[4] << 32, v1 = w1 | (uint64_t)p[9] << 32;
    const __m256i c0 = _mm512_cvtepi64_epi32(_mm512_and_si512(_mm512_srlv_epi64(_mm512_set1_epi64((long long)v0), sh), m31));
    const __m256i c1 = _mm512_cvtepi64_epi32(_mm512_and_si512(_mm512_srlv_epi64(_mm512_set1_epi64((long long)v1), sh), m31));
    return _mm512_permutex2var_ps(l0, _mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1), l1);
}
#ifdef CQ_HAVE_VBMI_CODES
/* tp_scales_vbmi's step for one 16 codes */
__attribute__((target("avx512vbmi"))) static inline __m512 tp_code16_vbmi(const uint8_t *p, __m512 l0, __m512 l1) {
    static const uint8_t place[64] = {0, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 8,
                                      2, 3, 4, 5, 6, 7, 8, 9, 3, 4, 5, 6, 7, 8, 9, 10,
                                      5, 6, 7, 8, 9, 10, 11, 12, 6, 7, 8, 9, 10, 11, 12, 13,
                                      7, 8, 9, 10, 11, 12, 13, 14, 8, 9, 10, 11, 12, 13, 14, 15};
    const __m512i shift = _mm512_set_epi64(0x0000000b00000006LL, 0x0000000900000004LL, 0x0000000700000002LL,
                                           0x0000000500000000LL, 0x0000000b00000006LL, 0x0000000900000004LL,
                                           0x0000000700000002LL, 0x0000000500000000LL);
    uint16_t tail;
    memcpy(&tail, p + 8, 2);
    const __m512i raw = _mm512_zextsi128_si512(_mm_insert_epi16(_mm_loadl_epi64((const __m128i *)p), tail, 4));
    const __m512i c = _mm512_multishift_epi64_epi8(shift, _mm512_permutexvar_epi8(_mm512_loadu_si512((const void *)place), raw));
    return _mm512_permutex2var_ps(l0, c, l1);
}
#endif

/* Rows r .. r+R-1 (R <= Q4I8_R) of q4_block / q4_tiled / q4tp against one xq: per chunk
 * of 16 groups, each block's xq and bias loads are shared by the R rows (R weight
 * streams side by side: on the Zen 4 VM four rows a tile computed 3-16 % more in
 * cache than two, and one core reads DRAM fastest as four streams, bench_matvec (a)),
 * and each row folds its chunk with q4_fold16, its scales decoded in registers. The
 * loops carry unroll pragmas: GCC left the row loop rolled, its sums spilled. Variants:
 * DOT (vpdpbusd or vpmaddubsw + vpmaddwd: the same integers) and VBMI (q4tp's codes
 * decoded by tp_code16_vbmi: the same scales). */
/* q4i8_tile's whole chunks of 16 groups of q4tp rows: the general chunk's loads,
 * integer sums, scales and fold with the dtype, the group stride and the chunk's
 * length constants and no per-block tests (the same bits; the general loop takes the
 * row's last, partial chunk). Every test and switch in the general chunk stood between
 * the vpdpbusd chains of its rows. */
#define Q4I8_TP_FULL_CHUNKS(DOT, VBMI)                                                                    \
    const uint8_t *cb0 = m->data + m->rows * gpr * 16 + 4 * m->rows + r * cq_tp_stride(m->cols);         \
    for (; g0 + 16 <= gpr; g0 += 16) {                                                                    \
        __m512i P[4][2]; /* [row][blocks 0-1, 2-3] paired */                                              \
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {                                             \
            __m512i s[4][2];                                                                              \
            _Pragma("GCC unroll 2") for (int b = 0; b < 2; b++) {                                         \
                const size_t blk = (g0 + 8 * (size_t)h + 4 * (size_t)b) / 4;                              \
                const int8_t *q = xq->q + 128 * blk;                                                      \
                const __m512i xa = _mm512_load_si512((const void *)q);                                    \
                const __m512i xb = _mm512_load_si512((const void *)(q + 64));                             \
                const __m512i bias = _mm512_load_si512((const void *)(xq->bias + 16 * blk));              \
                _Pragma("GCC unroll 4") for (int i = 0; i < R; i++) {                                     \
                    const uint8_t *p = nb + 16 * (i * gpr + 4 * blk);                                     \
                    CQ_STREAM_PF(p);                                                                      \
                    s[i][b] = Q4_BLOCK_SUM(DOT, _mm512_loadu_si512((const void *)p), xa, xb, bias);       \
                }                                                                                         \
            }                                                                                             \
            _Pragma("GCC unroll 4") for (int i = 0; i < R; i++) P[i][h] = q4_pair(s[i][0], s[i][1]);      \
        }                                                                                                 \
        _Pragma("GCC unroll 4") for (int i = 0; i < R; i++) {                                             \
            const uint8_t *cb = cb0 + i * cq_tp_stride(m->cols) + 5 * (g0 / 8);                          \
            const float *ladder = m->aux + 32 * (r + i);                                                  \
            const __m512 l0 = _mm512_loadu_ps(ladder), l1 = _mm512_loadu_ps(ladder + 16);                 \
            const __m512 sc = VBMI ? Q4I8_TP_VBMI(cb, l0, l1) : tp_code16(cb, l0, l1);                    \
            f[i] = q4_fold16(f[i], P[i][0], P[i][1], sc, xq->d + g0, 16);                                 \
        }                                                                                                 \
    }

#ifndef Q4I8_R /* (overridable for an A/B build: -DQ4I8_R=1, 2 or 4) */
#define Q4I8_R 4
#endif
#define Q4I8_VARIANT(SUF, TARGET, DOT, VBMI)                                                               \
    static inline __attribute__((always_inline, target(TARGET))) __m512 q4i8_scales_##SUF(                 \
        const cq_qmat *m, size_t r, size_t g) {                                                           \
        const size_t gpr = m->cols / CQ_GROUP;                                                            \
        switch (m->dtype) {                                                                               \
        case CQ_DT_Q4_BLOCK: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)q4b_scale_at(m, r, g))); \
        case CQ_DT_Q4_TILED: {                                                                            \
            const __m512i at = _mm512_mullo_epi32(                                                        \
                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(18)); \
            const __m512i h = _mm512_i32gather_epi32(at, (const void *)(m->data + 18 * (r * gpr + g)), 1);  \
            return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));                                             \
        }                                                                                                 \
        default: {                                                                                        \
            const uint8_t *cb = m->data + m->rows * gpr * 16 + 4 * m->rows + r * cq_tp_stride(m->cols) + 5 * (g / 8); \
            const float *ladder = m->aux + 32 * r;                                                        \
            const __m512 l0 = _mm512_loadu_ps(ladder), l1 = _mm512_loadu_ps(ladder + 16);                 \
            return VBMI ? Q4I8_TP_VBMI(cb, l0, l1) : tp_code16(cb, l0, l1);                               \
        }                                                                                                 \
        }                                                                                                 \
    }                                                                                                     \
    static inline __attribute__((always_inline, target(TARGET))) void q4i8_tile_##SUF(                     \
        const cq_qmat *m, size_t r, const cq_xq *xq, float *out, const int R) {                           \
        const size_t gpr = m->cols / CQ_GROUP;                                                            \
        const int tiled = m->dtype == CQ_DT_Q4_TILED;                                                     \
        const size_t gs = tiled ? 18 : 16;                                                                \
        const uint8_t *nb = m->data + gs * r * gpr + (tiled ? 2 : 0);                                     \
        const __m512i m0f = _mm512_set1_epi8(0x0F);                                                       \
        __m512 f[4];                                                                                       \
        _Pragma("GCC unroll 4") for (int i = 0; i < R; i++) f[i] = _mm512_setzero_ps();                                           \
        size_t g0 = 0;                                                                                    \
        if (m->dtype == CQ_DT_Q4TP) {                                                                     \
            Q4I8_TP_FULL_CHUNKS(DOT, VBMI)                                                                \
        }                                                                                                 \
        for (; g0 < gpr; g0 += 16) {                                                                      \
            const size_t n = gpr - g0;                                                                    \
            __m512i P[4][2];       /* [row][blocks 0-1, 2-3] paired */                                     \
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {                                         \
                __m512i s[4][2];                                                                           \
                _Pragma("GCC unroll 2") for (int b = 0; b < 2; b++) {                                     \
                    const size_t gb = 8 * (size_t)h + 4 * (size_t)b, blk = (g0 + gb) / 4;                 \
                    if (gb >= n) {                                                                        \
                        _Pragma("GCC unroll 4") for (int i = 0; i < R; i++) s[i][b] = _mm512_setzero_si512(); \
                        continue;                                                                         \
                    }                                                                                     \
                    const int8_t *q = xq->q + 128 * blk;                                                  \
                    const __m512i xa = _mm512_load_si512((const void *)q);                                \
                    const __m512i xb = _mm512_load_si512((const void *)(q + 64));                         \
                    const __m512i bias = _mm512_load_si512((const void *)(xq->bias + 16 * blk));          \
                    _Pragma("GCC unroll 4") for (int i = 0; i < R; i++) {                                 \
                        const uint8_t *p = nb + gs * (i * gpr + g0 + gb);                                 \
                        if (tiled) CQ_STREAM_PF_SPAN(p, 72);                                              \
                        else CQ_STREAM_PF(p);                                                             \
                        const __m512i v = VBMI && tiled && n - gb >= 4 ? q4_tiles4(p) : q4_nibbles4(p, gs, n - gb); \
                        s[i][b] = Q4_BLOCK_SUM(DOT, v, xa, xb, bias);                                     \
                    }                                                                                     \
                }                                                                                         \
                _Pragma("GCC unroll 4") for (int i = 0; i < R; i++) P[i][h] = q4_pair(s[i][0], s[i][1]);  \
            }                                                                                             \
            _Pragma("GCC unroll 4") for (int i = 0; i < R; i++) {                                                                 \
                __m512 sc;                                                                                \
                if (n >= 16) {                                                                            \
                    sc = q4i8_scales_##SUF(m, r + i, g0);                                                 \
                } else {                                                                                  \
                    float sw[16] = {0};                                                                   \
                    group_scales(m, r + i, g0, n, sw);                                                    \
                    sc = _mm512_loadu_ps(sw);                                                             \
                }                                                                                         \
                f[i] = q4_fold16(f[i], P[i][0], P[i][1], sc, xq->d + g0, n);                              \
            }                                                                                             \
        }                                                                                                 \
        _Pragma("GCC unroll 4") for (int i = 0; i < R; i++) out[i] = _mm512_reduce_add_ps(f[i]);                                  \
    }                                                                                                     \
    __attribute__((target(TARGET))) static void q4i8_rows_##SUF(const cq_qmat *m, size_t r0, size_t nr,  \
                                                                const cq_xq *xq, float *out) {            \
        size_t j = 0;                                                                                     \
        for (; Q4I8_R >= 4 && j + 4 <= nr; j += 4) q4i8_tile_##SUF(m, r0 + j, xq, out + j, 4);                           \
        for (; Q4I8_R >= 2 && j + 2 <= nr; j += 2) q4i8_tile_##SUF(m, r0 + j, xq, out + j, 2);                           \
        for (; j < nr; j++) q4i8_tile_##SUF(m, r0 + j, xq, out + j, 1);                                   \
    }

static inline __m512i dot_bw(__m512i acc, __m512i u8, __m512i s8) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u8, s8), _mm512_set1_epi16(1)));
}
#define Q4I8_TP_VBMI(cb, l0, l1) tp_code16(cb, l0, l1)
Q4I8_VARIANT(bw, "avx512bw", dot_bw, 0)
#if defined(__GNUC__) || defined(__clang__)
#define CQ_HAVE_VNNI_FN 1
Q4I8_VARIANT(vnni, "avx512vnni", _mm512_dpbusd_epi32, 0)
#ifdef CQ_HAVE_VBMI_CODES
#undef Q4I8_TP_VBMI
#define Q4I8_TP_VBMI(cb, l0, l1) tp_code16_vbmi(cb, l0, l1)
Q4I8_VARIANT(vbmi, "avx512vnni,avx512vbmi", _mm512_dpbusd_epi32, 1)
#endif
#endif

/* q8_row / q8_2f with int8 x, two groups (64 bytes) a step: |w| (u8) against xq with
 * w's sign (a masked subtract: AVX-512 has no vpsignb), lanes 0-7 group g, 8-15 group
 * g+1, scaled by d per lane (CQ_XQ_Q8's dl); the row's scale at the end. A row whose
 * group count is odd ends with a 32-byte masked load (xq is zero past the row). */
#define I8_Q8_BODY(DOT)                                                                           \
    const size_t cols = m->cols;                                                                  \
    const uint8_t *w = m->data + r * cols;                                                        \
    const __m512i zero = _mm512_setzero_si512();                                                  \
    __m512 f0 = _mm512_setzero_ps(), f1 = f0;                                                     \
    for (size_t c = 0; c < cols; c += 64) {                                                       \
        const uint8_t *p = w + c;                                                                 \
        CQ_STREAM_PF(p);                                                                          \
        const __m512i v = c + 64 <= cols ? _mm512_loadu_si512((const void *)p)                    \
                                         : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, p);              \
        const __m512i x = _mm512_load_si512((const void *)(xq->q + c));                           \
        const __m512i xs = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(v), zero, x);              \
        const __m512i isum = DOT(zero, _mm512_abs_epi8(v), xs);                                   \
        const __m512 dl = _mm512_load_ps(xq->dl + c / 4);                                         \
        if (c & 64) f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dl, f1);                       \
        else f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dl, f0);                              \
    }                                                                                             \
    return _mm512_reduce_add_ps(_mm512_add_ps(f0, f1)) * m->aux[r]

/* q2tp with int8 x, eight groups (64 code bytes, a CQ_XQ_Q2 block) a step: each of
 * the four phases' u8 weights 2v (Q2_PHASE) against its 64 xq bytes, summed per
 * 4-byte lane from the bias (-3 * the sum of xq); lane L holds half of group L/2,
 * scaled by tile scale * 0.5 * d. */
#define I8_Q2_BODY(DOT)                                                                           \
    const size_t gpr = m->cols / CQ_GROUP;                                                        \
    const uint8_t *body = m->data + 8 * r * gpr;                                                  \
    const __m512i m6 = _mm512_set1_epi8(6);                                                       \
    const __m512i spread = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);     \
    __m512 f0 = _mm512_setzero_ps(), f1 = f0;                                                     \
    float sw[64 + 8];                                                                             \
    for (size_t g0 = 0; g0 < gpr; g0 += 64) {                                                     \
        const size_t ng = gpr - g0 < 64 ? gpr - g0 : 64;                                          \
        group_scales(m, r, g0, ng, sw);                                                           \
        for (size_t k = 0; k < ng; k++) sw[k] *= 0.5f;                                            \
        for (int k = 0; k < 8; k++) sw[ng + k] = 0.0f;                                            \
        for (size_t gi = 0; gi < ng; gi += 8) {                                                   \
            const size_t g = g0 + gi, n = ng - gi < 8 ? ng - gi : 8, blk = g / 8;                 \
            const uint8_t *p = body + 8 * g;                                                      \
            CQ_STREAM_PF(p);                                                                      \
            const __m512i v = n == 8 ? _mm512_loadu_si512((const void *)p)                        \
                                     : _mm512_maskz_loadu_epi8((1ull << (8 * n)) - 1, p);         \
            const int8_t *q = xq->q + 256 * blk;                                                  \
            __m512i isum = _mm512_load_si512((const void *)(xq->bias + 16 * blk));                \
            isum = DOT(isum, Q2_PHASE(_mm512_slli_epi16, _mm512_srli_epi16, _mm512_and_si512, v, 0, m6), \
                       _mm512_load_si512((const void *)q));                                       \
            isum = DOT(isum, Q2_PHASE(_mm512_slli_epi16, _mm512_srli_epi16, _mm512_and_si512, v, 1, m6), \
                       _mm512_load_si512((const void *)(q + 64)));                                \
            isum = DOT(isum, Q2_PHASE(_mm512_slli_epi16, _mm512_srli_epi16, _mm512_and_si512, v, 2, m6), \
                       _mm512_load_si512((const void *)(q + 128)));                               \
            isum = DOT(isum, Q2_PHASE(_mm512_slli_epi16, _mm512_srli_epi16, _mm512_and_si512, v, 3, m6), \
                       _mm512_load_si512((const void *)(q + 192)));                               \
            const __m512 sc = _mm512_mul_ps(_mm512_permutexvar_ps(spread, _mm512_castps256_ps512(_mm256_loadu_ps(sw + gi))), \
                                            _mm512_load_ps(xq->dl + 16 * blk));                   \
            if (gi & 8) f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, f1);                   \
            else f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, f0);                          \
        }                                                                                         \
    }                                                                                             \
    return _mm512_reduce_add_ps(_mm512_add_ps(f0, f1))

static float q8_i8_row_bw(const cq_qmat *m, size_t r, const cq_xq *xq) { I8_Q8_BODY(dot_bw); }
static float q2_i8_row_bw(const cq_qmat *m, size_t r, const cq_xq *xq) { I8_Q2_BODY(dot_bw); }
#ifdef CQ_HAVE_VNNI_FN
__attribute__((target("avx512vnni"))) static float q8_i8_row_vnni(const cq_qmat *m, size_t r, const cq_xq *xq) {
    I8_Q8_BODY(_mm512_dpbusd_epi32);
}
__attribute__((target("avx512vnni"))) static float q2_i8_row_vnni(const cq_qmat *m, size_t r, const cq_xq *xq) {
    I8_Q2_BODY(_mm512_dpbusd_epi32);
}
#endif

#ifdef CQ_HAVE_VNNI_FN
/* q4_tiled with VBMI: the four halves of a block of four tiles lie in its first 64
 * bytes (offsets 0, 18, 36, 54), so one masked vpermb moves them to words 4b..4b+3 of
 * the chunk's 16 halves, and q4_tiles4 blends the nibbles out of four loads; without
 * VBMI a row of scales is gathered first (group_scales) and the rest is the same. The
 * same integers, scales and float operations in the same order as q4i8_tile: bit for bit
 * its result. A chunk that runs past the row's end (cols % 512 != 0) takes its scales
 * one at a time and its nibbles from q4_nibbles4, which reads no byte past the row. */
/* byte 8b + 2k + e of the halves from byte 18k + e of block b's first 64 */
static const uint8_t TILE_HALVES[64] = {0, 1, 18, 19, 36, 37, 54, 55, 0, 1, 18, 19, 36, 37, 54, 55,
                                        0, 1, 18, 19, 36, 37, 54, 55, 0, 1, 18, 19, 36, 37, 54, 55};

/* The scales of a partial chunk of q4_tiled (n < 16 groups from tile p), zero past n. */
static inline __m512 q4t_tail_scales(const uint8_t *p, size_t n) {
    float s[16] = {0};
    for (size_t k = 0; k < n; k++) s[k] = h2f_hw(p + 18 * k);
    return _mm512_loadu_ps(s);
}

/* f folded with row r's last chunk, groups g0 .. gpr-1 (fewer than 16, from tile tl) */
__attribute__((target("avx512vnni"))) static __m512 q4t_i8_tail(const cq_qmat *m, const uint8_t *tl, size_t g0,
                                                                const cq_xq *xq, __m512 f) {
    const size_t n = m->cols / CQ_GROUP - g0;
    const __m512i m0f = _mm512_set1_epi8(0x0F);
    __m512i s[4];
    for (size_t b = 0; b < 4; b++) {
        const size_t blk = (g0 + 4 * b) / 4;
        if (4 * b >= n) {
            s[b] = _mm512_setzero_si512();
            continue;
        }
        const int8_t *q = xq->q + 128 * blk;
        s[b] = Q4_BLOCK_SUM(_mm512_dpbusd_epi32, q4_nibbles4(tl + 18 * (g0 + 4 * b) + 2, 18, n - 4 * b),
                            _mm512_load_si512((const void *)q), _mm512_load_si512((const void *)(q + 64)),
                            _mm512_load_si512((const void *)(xq->bias + 16 * blk)));
    }
    return q4_fold16(f, q4_pair(s[0], s[1]), q4_pair(s[2], s[3]), q4t_tail_scales(tl + 18 * g0, n), xq->d + g0, n);
}

__attribute__((target("avx512vnni,avx512vbmi"))) static float q4t_i8_row_vbmi(const cq_qmat *m, size_t r,
                                                                             const cq_xq *xq) {
    const size_t gpr = m->cols / CQ_GROUP, full = gpr / 16 * 16;
    const uint8_t *tl = m->data + 18 * r * gpr;
    const __m512i m0f = _mm512_set1_epi8(0x0F);
    const __m512i hidx = _mm512_loadu_si512((const void *)TILE_HALVES);
    __m512 f = _mm512_setzero_ps();
    for (size_t g0 = 0; g0 < full; g0 += 16) {
        __m512i s[4], h = _mm512_setzero_si512();
        for (int b = 0; b < 4; b++) {
            const size_t blk = g0 / 4 + (size_t)b;
            const uint8_t *p = tl + 72 * blk;
            CQ_STREAM_PF_SPAN(p, 72);
            h = _mm512_mask_permutexvar_epi8(h, 0xFFull << (8 * b), hidx, _mm512_loadu_si512((const void *)p));
            const int8_t *q = xq->q + 128 * blk;
            s[b] = Q4_BLOCK_SUM(_mm512_dpbusd_epi32, q4_tiles4(p + 2), _mm512_load_si512((const void *)q),
                                _mm512_load_si512((const void *)(q + 64)),
                                _mm512_load_si512((const void *)(xq->bias + 16 * blk)));
        }
        f = q4_fold16(f, q4_pair(s[0], s[1]), q4_pair(s[2], s[3]), _mm512_cvtph_ps(_mm512_castsi512_si256(h)),
                      xq->d + g0, 16);
    }
    if (full < gpr) f = q4t_i8_tail(m, tl, full, xq, f);
    return _mm512_reduce_add_ps(f);
}
#endif

#ifdef CQ_HAVE_VNNI_FN
/* A block of four q4_tiled tiles (72 bytes from p) from two loads, bytes 0-63 (a) and
 * 8-71 (b), never past the block: one vpermt2b gathers the four nibble runs (tile k's
 * 16 bytes from 2 + 18k into 128-bit lane k) where q4_tiles4 takes four loads, each
 * split over two cache lines, and three blends. */
static const uint8_t TILE_NIB_AB[64] = {
    2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
    20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35,
    38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53,
    56, 57, 58, 59, 60, 61, 62, 63, 64 + 56, 64 + 57, 64 + 58, 64 + 59, 64 + 60, 64 + 61, 64 + 62, 64 + 63};

/* Two rows of q4_tiled with VBMI at once, as q4i8_tile for the others: each row's
 * operations are q4t_i8_row_vbmi's in its order (bit for bit), xq's loads are shared;
 * each row's last partial chunk (cols % 512 != 0) is q4t_i8_tail's. */
__attribute__((target("avx512vnni,avx512vbmi"))) static void q4t_i8_rows2_vbmi(const cq_qmat *m, size_t r,
                                                                              const cq_xq *xq, float *out) {
    const size_t gpr = m->cols / CQ_GROUP, full = gpr / 16 * 16;
    const uint8_t *t0 = m->data + 18 * r * gpr, *t1 = t0 + 18 * gpr;
    const __m512i m0f = _mm512_set1_epi8(0x0F);
    const __m512i hidx = _mm512_loadu_si512((const void *)TILE_HALVES);
    const __m512i nidx = _mm512_loadu_si512((const void *)TILE_NIB_AB);
    __m512 f = _mm512_setzero_ps(), e = f;
    for (size_t g0 = 0; g0 < full; g0 += 16) {
        __m512i s[4], t[4], h0 = _mm512_setzero_si512(), h1 = h0;
        for (int b = 0; b < 4; b++) {
            const size_t blk = g0 / 4 + (size_t)b;
            const uint8_t *p0 = t0 + 72 * blk, *p1 = t1 + 72 * blk;
            CQ_STREAM_PF_SPAN(p0, 72);
            CQ_STREAM_PF_SPAN(p1, 72);
            const __m512i a0 = _mm512_loadu_si512((const void *)p0), a1 = _mm512_loadu_si512((const void *)p1);
            const __m512i v0 = _mm512_permutex2var_epi8(a0, nidx, _mm512_loadu_si512((const void *)(p0 + 8)));
            const __m512i v1 = _mm512_permutex2var_epi8(a1, nidx, _mm512_loadu_si512((const void *)(p1 + 8)));
            h0 = _mm512_mask_permutexvar_epi8(h0, 0xFFull << (8 * b), hidx, a0);
            h1 = _mm512_mask_permutexvar_epi8(h1, 0xFFull << (8 * b), hidx, a1);
            const int8_t *q = xq->q + 128 * blk;
            const __m512i xa = _mm512_load_si512((const void *)q), xb = _mm512_load_si512((const void *)(q + 64));
            const __m512i bias = _mm512_load_si512((const void *)(xq->bias + 16 * blk));
            s[b] = Q4_BLOCK_SUM(_mm512_dpbusd_epi32, v0, xa, xb, bias);
            t[b] = Q4_BLOCK_SUM(_mm512_dpbusd_epi32, v1, xa, xb, bias);
        }
        f = q4_fold16(f, q4_pair(s[0], s[1]), q4_pair(s[2], s[3]), _mm512_cvtph_ps(_mm512_castsi512_si256(h0)),
                      xq->d + g0, 16);
        e = q4_fold16(e, q4_pair(t[0], t[1]), q4_pair(t[2], t[3]), _mm512_cvtph_ps(_mm512_castsi512_si256(h1)),
                      xq->d + g0, 16);
    }
    if (full < gpr) {
        f = q4t_i8_tail(m, t0, full, xq, f);
        e = q4t_i8_tail(m, t1, full, xq, e);
    }
    out[0] = _mm512_reduce_add_ps(f);
    out[1] = _mm512_reduce_add_ps(e);
}
#endif

/* the four halves of a block of four q4_tiled tiles spread four words each, for the
 * lanes of their groups */
static const uint8_t TILE_SCALE_SPREAD[64] = {0, 1, 0, 1, 0, 1, 0, 1, 18, 19, 18, 19, 18, 19, 18, 19,
                                              36, 37, 36, 37, 36, 37, 36, 37, 54, 55, 54, 55, 54, 55, 54, 55};

#ifdef CQ_HAVE_VNNI_FN
/* q4_tiled, float32 x, with VBMI: q4_dot512 with each block's scales spread by one
 * vpermb of its first 64 bytes (TILE_SCALE_SPREAD) instead of a gathered scale row and a
 * spread permute, and its nibbles from q4_tiles4, rather than two vpermt2b (2 cycles
 * each on port 5 here) for nibbles and halves. */
__attribute__((target("avx512vbmi"))) static float q4t_dot512_vbmi(const cq_qmat *m, size_t r, const float *x) {
    const size_t gpr = m->cols / CQ_GROUP;
    const uint8_t *tl = m->data + 18 * r * gpr;
    const __m512 lut8 = Q4_LUT8;
    const __m512i sidx = _mm512_loadu_si512((const void *)TILE_SCALE_SPREAD);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, tail0 = acc0, tail1 = acc0;
    size_t g = 0;
    for (; g + 4 <= gpr; g += 4) {
        const uint8_t *p = tl + 18 * g;
        CQ_STREAM_PF_SPAN(p, 72);
        const __m512i t0 = _mm512_loadu_si512((const void *)p);
        const __m512 d = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi8(sidx, t0)));
        const __m512 t = q4_sum4(q4_tiles4(p + 2), x + 32 * g, lut8);
        if (g & 4) acc1 = _mm512_fmadd_ps(t, d, acc1);
        else acc0 = _mm512_fmadd_ps(t, d, acc0);
    }
    for (; g < gpr; g++) Q4_G(tl + 18 * g + 2, x + 32 * g, Q4_LUT(h2f_hw(tl + 18 * g)), tail0, tail1);
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(tail0, tail1)));
}
#endif

/* q8 rows (q8_rows.h) on 16 lanes: acc is four accumulators (64 floats), a 64-column
 * step an iteration (as fast as a two-step loop from DRAM, and simpler). */
static inline void q8_segment(const uint8_t *p, const float *x, const uint8_t *far, const uint8_t *near, size_t n,
                              float *acc) {
    __m512 a0 = _mm512_load_ps(acc), a1 = _mm512_load_ps(acc + 16), a2 = _mm512_load_ps(acc + 32),
           a3 = _mm512_load_ps(acc + 48);
    for (const uint8_t *const e = p + n; p < e; p += 64, x += 64, far += 64, near += 64) {
        _mm_prefetch((const char *)far, _MM_HINT_T1);
        _mm_prefetch((const char *)near, _MM_HINT_T0);
        a0 = _mm512_fmadd_ps(z_i8(p), _mm512_loadu_ps(x), a0);
        a1 = _mm512_fmadd_ps(z_i8(p + 16), _mm512_loadu_ps(x + 16), a1);
        a2 = _mm512_fmadd_ps(z_i8(p + 32), _mm512_loadu_ps(x + 32), a2);
        a3 = _mm512_fmadd_ps(z_i8(p + 48), _mm512_loadu_ps(x + 48), a3);
    }
    _mm512_store_ps(acc, a0), _mm512_store_ps(acc + 16, a1), _mm512_store_ps(acc + 32, a2), _mm512_store_ps(acc + 48, a3);
}
/* ... and the row's tail and reduction */
static inline float q8_finish(const float *acc, const uint8_t *p, const float *x, size_t c, size_t cols) {
    __m512 a0 = _mm512_load_ps(acc);
    for (; c + 16 <= cols; c += 16) a0 = _mm512_fmadd_ps(z_i8(p + c), _mm512_loadu_ps(x + c), a0);
    float r = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, _mm512_load_ps(acc + 16)),
                                                 _mm512_add_ps(_mm512_load_ps(acc + 32), _mm512_load_ps(acc + 48))));
    for (; c < cols; c++) r += (float)(int8_t)p[c] * x[c];
    return r;
}
#include "q8_rows.h"
#include "ggml_kq_decode_avx512.h"

static float dot_row(const cq_qmat *m, size_t r, const float *x) {
    switch (m->dtype) {
    case CQ_DT_Q8_ROW:
    case CQ_DT_Q8_2F: return q8_row_dot(m, r, x); /* q8_2f: x pre-multiplied by col */
    case CQ_DT_Q4_TILED:
#ifdef CQ_HAVE_VNNI_FN
        if (grouped_fast(m) && (cq_cpu_features() & CQ_CPU_AVX512VBMI)) return q4t_dot512_vbmi(m, r, x);
#endif
        /* fall through */
    case CQ_DT_Q4_BLOCK:
    case CQ_DT_Q4TP:
        if (grouped_fast(m)) return q4_dot512(m, r, x);
        return avx2_dot_row(m, r, x);
    case CQ_DT_Q2TP:
        if (grouped_fast(m)) return q2_dot512(m, r, x);
        return avx2_dot_row(m, r, x);
    default:
        if (kq_is(m->dtype)) return kq_dot_row_avx512(m, r, x);
        return avx2_dot_row(m, r, x); /* f32/f16/bf16 measured faster on 8 lanes */
    }
}

#include "ggml_kq_avx512.h"
#include "ggml_q32_avx512.h"

#define CQ_HAVE_I8_ROWS
static void i8_dot_rows(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *xq, float *out) {
    if (kq_is(m->dtype)) {
        kq_i8_rows(m, r0, nr, xq, out);
        return;
    }
    if (ggml_q32_block_bytes(m->dtype)) {
        ggml_q32_i8_rows(m, r0, nr, xq, out);
        return;
    }
    const uint32_t f = cq_cpu_features();
    const int vnni = (f & CQ_CPU_AVX512VNNI) != 0;
    (void)vnni;
    switch (m->dtype) {
    case CQ_DT_Q8_ROW:
    case CQ_DT_Q8_2F:
#ifdef CQ_HAVE_VNNI_FN
        if (vnni) {
            for (size_t j = 0; j < nr; j++) out[j] = q8_i8_row_vnni(m, r0 + j, xq);
            return;
        }
#endif
        for (size_t j = 0; j < nr; j++) out[j] = q8_i8_row_bw(m, r0 + j, xq);
        return;
    case CQ_DT_Q2TP:
#ifdef CQ_HAVE_VNNI_FN
        if (vnni) {
            for (size_t j = 0; j < nr; j++) out[j] = q2_i8_row_vnni(m, r0 + j, xq);
            return;
        }
#endif
        for (size_t j = 0; j < nr; j++) out[j] = q2_i8_row_bw(m, r0 + j, xq);
        return;
    default: break;
    }
#ifdef CQ_HAVE_VNNI_FN
    if (m->dtype == CQ_DT_Q4_TILED && vnni && (f & CQ_CPU_AVX512VBMI)) {
        size_t j = 0;
        for (; j + 2 <= nr; j += 2) q4t_i8_rows2_vbmi(m, r0 + j, xq, out + j);
        for (; j < nr; j++) out[j] = q4t_i8_row_vbmi(m, r0 + j, xq);
        return;
    }
#ifdef CQ_HAVE_VBMI_CODES
    if (vnni && (f & CQ_CPU_AVX512VBMI)) {
        q4i8_rows_vbmi(m, r0, nr, xq, out);
        return;
    }
#endif
    if (vnni) {
        q4i8_rows_vnni(m, r0, nr, xq, out);
        return;
    }
#endif
    q4i8_rows_bw(m, r0, nr, xq, out);
}

/* ---- matvec_batch with int8 x: q8 rows against several inputs at once ----
 * (CQ_HAVE_I8_MULTI in matvec_drivers.h.) Tiles of Q8M_R rows by up to Q8M_J inputs:
 * each 64-byte step of a row is loaded and prepared once and meets every input's xq.
 * Each input's integer sums, their conversion and the multiply-adds into its two
 * accumulators (by c & 64) are I8_Q8_BODY's in its order, and the row ends as it does,
 * so every output equals q8_i8_row_* of that input bit for bit. Integer sums are
 * exact, so they may be formed differently: with VNNI the u8 operand is the weights
 * plus 128 (an xor per row step, shared by the tile's inputs), the s8 one xq as it
 * is, and the sum starts from the input's -128 * (each lane's four xq summed), made
 * once per call (i8_multi_prep): vpdpbusd, convert and multiply-add per row and
 * input, where I8_Q8_BODY's sign move would add a masked subtract. Without VNNI |w|
 * and w's sign mask are shared and the subtract stays. */
#include "i8_multi.h"
#define Q8M_R 2
#define Q8M_J 4
#define Q8M_STEP(DOT, VNNI, c, F)                                                                         \
    do {                                                                                                  \
        __m512i v_[Q8M_R], a_[Q8M_R];                                                                     \
        __mmask64 neg_[Q8M_R];                                                                            \
        for (int i = 0; i < R; i++) {                                                                     \
            const uint8_t *p_ = w + i * cols + (c);                                                       \
            CQ_STREAM_PF(p_);                                                                             \
            v_[i] = (c) + 64 <= cols ? _mm512_loadu_si512((const void *)p_)                               \
                                     : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, p_);                        \
            a_[i] = VNNI ? _mm512_xor_si512(v_[i], top) : _mm512_abs_epi8(v_[i]);                         \
            neg_[i] = VNNI ? 0 : _mm512_movepi8_mask(v_[i]);                                              \
        }                                                                                                 \
        for (int k = 0; k < J; k++) {                                                                     \
            const __m512i x_ = _mm512_load_si512((const void *)(xq[k]->q + (c)));                         \
            const __m512 dl_ = _mm512_load_ps(xq[k]->dl + (c) / 4);                                       \
            for (int i = 0; i < R; i++) {                                                                 \
                const __m512i s_ = VNNI ? DOT(_mm512_load_si512((const void *)(corr[k] + (c) / 4)), a_[i], x_) \
                                        : DOT(zero, a_[i], _mm512_mask_sub_epi8(x_, neg_[i], zero, x_));  \
                F[i][k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s_), dl_, F[i][k]);                          \
            }                                                                                             \
        }                                                                                                 \
    } while (0)
#define Q8M_VARIANT(SUF, TARGET, DOT, VNNI)                                                                \
    static inline __attribute__((always_inline, target(TARGET))) void q8m_tile_##SUF(                      \
        const cq_qmat *m, size_t r, const cq_xq *const *xq, const int32_t *const *corr, float *Y, size_t ldy, \
        const int R, const int J) {                                                                       \
        const size_t cols = m->cols;                                                                      \
        const uint8_t *w = m->data + r * cols;                                                            \
        const __m512i zero = _mm512_setzero_si512(), top = _mm512_set1_epi8((char)0x80);                  \
        __m512 f0[Q8M_R][Q8M_J], f1[Q8M_R][Q8M_J];                                                        \
        (void)zero, (void)top, (void)corr;                                                                \
        for (int i = 0; i < R; i++)                                                                       \
            for (int k = 0; k < J; k++) f0[i][k] = f1[i][k] = _mm512_setzero_ps();                        \
        for (size_t c = 0; c < cols; c += 128) {                                                          \
            Q8M_STEP(DOT, VNNI, c, f0);                                                                   \
            if (c + 64 < cols) Q8M_STEP(DOT, VNNI, c + 64, f1);                                           \
        }                                                                                                 \
        for (int i = 0; i < R; i++)                                                                       \
            for (int k = 0; k < J; k++)                                                                   \
                Y[k * ldy + r + i] = _mm512_reduce_add_ps(_mm512_add_ps(f0[i][k], f1[i][k])) * m->aux[r + i]; \
    }                                                                                                     \
    __attribute__((target(TARGET))) static void q8m_rows_##SUF(const cq_qmat *m, size_t r0, size_t nr,   \
                                                               const cq_xq *const *xq,                    \
                                                               const int32_t *const *corr, size_t t,      \
                                                               float *Y, size_t ldy) {                    \
        I8M_ROWS(q8m_tile_##SUF, Q8M_R)                                                                   \
    }

Q8M_VARIANT(bw, "avx512bw", dot_bw, 0)
#ifdef CQ_HAVE_VNNI_FN
Q8M_VARIANT(vnni, "avx512vnni", _mm512_dpbusd_epi32, 1)
#endif

/* q4_block, q4_tiled, q4tp with int8 x, several inputs: q4i8_tile's chunks of 16 groups,
 * each row's nibbles loaded once per block and met by every input's xq and bias, each
 * input's chunk folded as q4i8_tile folds it (its operations per input, in its order; the
 * VBMI q4_tiled row kernels are bit for bit q4i8_tile's too). */
#define Q4M_R 2
#define Q4M_VARIANT(SUF, TARGET, DOT)                                                                      \
    static inline __attribute__((always_inline, target(TARGET))) void q4m_tile_##SUF(                      \
        const cq_qmat *m, size_t r, const cq_xq *const *xq, const int32_t *const *corr, float *Y, size_t ldy, \
        const int R, const int J) {                                                                       \
        const size_t gpr = m->cols / CQ_GROUP;                                                            \
        const int tiled = m->dtype == CQ_DT_Q4_TILED;                                                     \
        const size_t gs = tiled ? 18 : 16;                                                                \
        const uint8_t *nb = m->data + gs * r * gpr + (tiled ? 2 : 0);                                     \
        const __m512i m0f = _mm512_set1_epi8(0x0F);                                                       \
        __m512 F[Q4M_R][4];                                                                               \
        float sw[Q4M_R][64];                                                                              \
        (void)corr;                                                                                       \
        for (int i = 0; i < R; i++)                                                                       \
            for (int k = 0; k < J; k++) F[i][k] = _mm512_setzero_ps();                                    \
        for (size_t g0 = 0; g0 < gpr; g0 += 64) {                                                         \
            const size_t ng = gpr - g0 < 64 ? gpr - g0 : 64;                                              \
            for (int i = 0; i < R; i++) group_scales(m, r + i, g0, ng, sw[i]);                            \
            for (size_t gi = 0; gi < ng; gi += 16) {                                                      \
                __m512i P[Q4M_R][4][2]; /* [row][input][blocks 0-1, 2-3] paired */                        \
                for (int h = 0; h < 2; h++) {                                                             \
                    __m512i s_[Q4M_R][4][2];                                                              \
                    for (int b = 0; b < 2; b++) {                                                         \
                        const size_t gb = gi + 8 * (size_t)h + 4 * (size_t)b, g_ = g0 + gb, blk_ = g_ / 4; \
                        if (gb >= ng) {                                                                   \
                            for (int i = 0; i < R; i++)                                                   \
                                for (int k = 0; k < J; k++) s_[i][k][b] = _mm512_setzero_si512();         \
                            continue;                                                                     \
                        }                                                                                 \
                        __m512i v_[Q4M_R];                                                                \
                        for (int i = 0; i < R; i++) {                                                     \
                            const uint8_t *p_ = nb + i * gs * gpr + gs * g_;                              \
                            if (tiled) CQ_STREAM_PF_SPAN(p_, 72);                                         \
                            else CQ_STREAM_PF(p_);                                                        \
                            v_[i] = q4_nibbles4(p_, gs, ng - gb);                                         \
                        }                                                                                 \
                        for (int k = 0; k < J; k++) {                                                     \
                            const int8_t *q_ = xq[k]->q + 128 * blk_;                                     \
                            const __m512i xa_ = _mm512_load_si512((const void *)q_);                      \
                            const __m512i xb_ = _mm512_load_si512((const void *)(q_ + 64));               \
                            const __m512i bias_ = _mm512_load_si512((const void *)(xq[k]->bias + 16 * blk_)); \
                            for (int i = 0; i < R; i++) s_[i][k][b] = Q4_BLOCK_SUM(DOT, v_[i], xa_, xb_, bias_); \
                        }                                                                                 \
                    }                                                                                     \
                    for (int i = 0; i < R; i++)                                                           \
                        for (int k = 0; k < J; k++) P[i][k][h] = q4_pair(s_[i][k][0], s_[i][k][1]);       \
                }                                                                                         \
                for (int i = 0; i < R; i++) {                                                             \
                    const __m512 sc_ = q4_scales16(sw[i] + gi, ng - gi);                                  \
                    for (int k = 0; k < J; k++)                                                           \
                        F[i][k] = q4_fold16(F[i][k], P[i][k][0], P[i][k][1], sc_, xq[k]->d + g0 + gi, ng - gi); \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
        for (int i = 0; i < R; i++)                                                                       \
            for (int k = 0; k < J; k++) Y[k * ldy + r + i] = _mm512_reduce_add_ps(F[i][k]);               \
    }                                                                                                     \
    __attribute__((target(TARGET))) static void q4m_rows_##SUF(const cq_qmat *m, size_t r0, size_t nr,   \
                                                               const cq_xq *const *xq,                    \
                                                               const int32_t *const *corr, size_t t,      \
                                                               float *Y, size_t ldy) {                    \
        I8M_ROWS(q4m_tile_##SUF, Q4M_R)                                                                   \
    }

Q4M_VARIANT(bw, "avx512bw", dot_bw)
#ifdef CQ_HAVE_VNNI_FN
Q4M_VARIANT(vnni, "avx512vnni", _mm512_dpbusd_epi32)
#endif

/* q2tp with int8 x, several inputs: I8_Q2_BODY's blocks of eight groups, each row's
 * four phases and spread scales made once per block and met by every input's xq,
 * bias and d (I8_Q2_BODY's operations per input, in its order). One row a tile: the
 * four phases take the registers a second row would. */
#define Q2M_STEP(DOT, gi, F)                                                                              \
    do {                                                                                                  \
        const size_t g_ = g0 + (gi), n_ = ng - (gi) < 8 ? ng - (gi) : 8, blk_ = g_ / 8;                   \
        const uint8_t *p_ = body + 8 * g_;                                                                \
        CQ_STREAM_PF(p_);                                                                                 \
        const __m512i v_ = n_ == 8 ? _mm512_loadu_si512((const void *)p_)                                 \
                                   : _mm512_maskz_loadu_epi8((1ull << (8 * n_)) - 1, p_);                 \
        const __m512i ph0_ = Q2_PHASE(_mm512_slli_epi16, _mm512_srli_epi16, _mm512_and_si512, v_, 0, m6);  \
        const __m512i ph1_ = Q2_PHASE(_mm512_slli_epi16, _mm512_srli_epi16, _mm512_and_si512, v_, 1, m6);  \
        const __m512i ph2_ = Q2_PHASE(_mm512_slli_epi16, _mm512_srli_epi16, _mm512_and_si512, v_, 2, m6);  \
        const __m512i ph3_ = Q2_PHASE(_mm512_slli_epi16, _mm512_srli_epi16, _mm512_and_si512, v_, 3, m6);  \
        const __m512 d_ = _mm512_permutexvar_ps(spread, _mm512_castps256_ps512(_mm256_loadu_ps(sw + (gi)))); \
        for (int k = 0; k < J; k++) {                                                                     \
            const int8_t *q_ = xq[k]->q + 256 * blk_;                                                     \
            __m512i s_ = _mm512_load_si512((const void *)(xq[k]->bias + 16 * blk_));                      \
            s_ = DOT(s_, ph0_, _mm512_load_si512((const void *)q_));                                      \
            s_ = DOT(s_, ph1_, _mm512_load_si512((const void *)(q_ + 64)));                               \
            s_ = DOT(s_, ph2_, _mm512_load_si512((const void *)(q_ + 128)));                              \
            s_ = DOT(s_, ph3_, _mm512_load_si512((const void *)(q_ + 192)));                              \
            F[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s_), _mm512_mul_ps(d_, _mm512_load_ps(xq[k]->dl + 16 * blk_)), F[k]); \
        }                                                                                                 \
    } while (0)
#define Q2M_VARIANT(SUF, TARGET, DOT)                                                                      \
    static inline __attribute__((always_inline, target(TARGET))) void q2m_tile_##SUF(                      \
        const cq_qmat *m, size_t r, const cq_xq *const *xq, const int32_t *const *corr, float *Y, size_t ldy, \
        const int R, const int J) {                                                                       \
        const size_t gpr = m->cols / CQ_GROUP;                                                            \
        const uint8_t *body = m->data + 8 * r * gpr;                                                      \
        const __m512i m6 = _mm512_set1_epi8(6);                                                           \
        const __m512i spread = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);         \
        __m512 f0[4], f1[4];                                                                              \
        float sw[64 + 8];                                                                                 \
        (void)corr, (void)R;                                                                              \
        for (int k = 0; k < J; k++) f0[k] = f1[k] = _mm512_setzero_ps();                                  \
        for (size_t g0 = 0; g0 < gpr; g0 += 64) {                                                         \
            const size_t ng = gpr - g0 < 64 ? gpr - g0 : 64;                                              \
            group_scales(m, r, g0, ng, sw);                                                               \
            for (size_t k = 0; k < ng; k++) sw[k] *= 0.5f;                                                \
            for (int k = 0; k < 8; k++) sw[ng + k] = 0.0f;                                                \
            for (size_t gi = 0; gi < ng; gi += 16) {                                                      \
                Q2M_STEP(DOT, gi, f0);                                                                    \
                if (gi + 8 < ng) Q2M_STEP(DOT, gi + 8, f1);                                               \
            }                                                                                             \
        }                                                                                                 \
        for (int k = 0; k < J; k++) Y[k * ldy + r] = _mm512_reduce_add_ps(_mm512_add_ps(f0[k], f1[k]));  \
    }                                                                                                     \
    __attribute__((target(TARGET))) static void q2m_rows_##SUF(const cq_qmat *m, size_t r0, size_t nr,   \
                                                               const cq_xq *const *xq,                    \
                                                               const int32_t *const *corr, size_t t,      \
                                                               float *Y, size_t ldy) {                    \
        I8M_ROWS(q2m_tile_##SUF, 1)                                                                       \
    }

Q2M_VARIANT(bw, "avx512bw", dot_bw)
#ifdef CQ_HAVE_VNNI_FN
Q2M_VARIANT(vnni, "avx512vnni", _mm512_dpbusd_epi32)
#endif

#define CQ_HAVE_I8_MULTI
static int i8_multi_takes(const cq_qmat *m) {
    switch (m->dtype) {
    case CQ_DT_Q8_ROW: case CQ_DT_Q8_2F: case CQ_DT_Q4_BLOCK: case CQ_DT_Q4_TILED: case CQ_DT_Q4TP:
    case CQ_DT_Q2TP: return 1;
    default: return kq_multi_takes(m);
    }
}
/* The correction of the q8 VNNI tiles: out[L] = -128 * (xq bytes 4L .. 4L + 3 summed)
 * for the row and its padding (cols rounded up to 64: xq is zero there). The q4 tiles
 * start from xq's bias. */
static size_t i8_multi_prep_words(const cq_qmat *m) {
    return m->dtype == CQ_DT_Q8_ROW || m->dtype == CQ_DT_Q8_2F ? ((m->cols + 63) & ~(size_t)63) / 4 : 0;
}
static void i8_multi_prep(const cq_qmat *m, const cq_xq *xq, int32_t *out) {
    const __m512i ones8 = _mm512_set1_epi8(1), ones16 = _mm512_set1_epi16(1), zero = _mm512_setzero_si512();
    for (size_t c = 0; c < m->cols; c += 64) {
        const __m512i s = _mm512_madd_epi16(_mm512_maddubs_epi16(ones8, _mm512_load_si512((const void *)(xq->q + c))), ones16);
        _mm512_store_si512((void *)(out + c / 4), _mm512_sub_epi32(zero, _mm512_slli_epi32(s, 7)));
    }
}
static void i8_rows_multi(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *const *xq,
                          const int32_t *const *corr, size_t t, float *Y, size_t ldy) {
    if (kq_is(m->dtype)) { /* ggml_kq_avx512.h: no prep words */
        kq_i8_rows_multi(m, r0, nr, xq, t, Y, ldy);
        return;
    }
    const int q8 = m->dtype == CQ_DT_Q8_ROW || m->dtype == CQ_DT_Q8_2F;
    const int q2 = m->dtype == CQ_DT_Q2TP;
#ifdef CQ_HAVE_VNNI_FN
    if (cq_cpu_features() & CQ_CPU_AVX512VNNI) {
        if (q8) q8m_rows_vnni(m, r0, nr, xq, corr, t, Y, ldy);
        else if (q2) q2m_rows_vnni(m, r0, nr, xq, corr, t, Y, ldy);
        else q4m_rows_vnni(m, r0, nr, xq, corr, t, Y, ldy);
        return;
    }
#endif
    if (q8) q8m_rows_bw(m, r0, nr, xq, corr, t, Y, ldy);
    else if (q2) q2m_rows_bw(m, r0, nr, xq, corr, t, Y, ldy);
    else q4m_rows_bw(m, r0, nr, xq, corr, t, Y, ldy);
}

#define dequant_row avx2_dequant_row
#define needs_prep avx2_needs_prep
/* ---- matmat (prefill): the packed GEMM of matmat_packed.h on 16 lanes ---- */
#define MM_VL 16
#define MM_NV 4 /* panels of 64 inputs */
typedef __m512 mm_vec;
typedef __m512i mm_idx;
#define mm_load _mm512_loadu_ps
#define mm_store _mm512_storeu_ps
#define mm_set1 _mm512_set1_ps
#define mm_fma _mm512_fmadd_ps
#define mm_zero _mm512_setzero_ps
static inline mm_idx mm_gather_idx(size_t stride) {
    return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                              _mm512_set1_epi32((int)stride));
}
static inline mm_vec mm_gather(mm_idx at, const float *base, size_t live) {
    return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), (__mmask16)((1u << live) - 1), at, base, 4);
}
/* 24 accumulators each: 6 rows x 4 vectors, 8 x 3, 12 x 2; 12 x 1 (24 x 1 spilled
 * its row pointers) */
#define MM_SHAPES(X) X(6, 4) X(8, 3) X(12, 2) X(12, 1)

/* The column decoded c-th: X is packed in the decode order. The grouped q4 dtypes
 * decode in their stored order: per group of 32 the 16 low nibbles (elements 0, 2, ..,
 * 30), then the 16 high ones (1, 3, .., 31), so the products meet as in the reference. */
static size_t mm_column(const cq_qmat *m, size_t c) {
    if (q2_grouped(m)) return (c & ~(size_t)31) + 4 * (c & 7) + ((c & 31) >> 3); /* code k of bytes 0..7 */
    if (!q4_grouped(m)) return c;
    return (c & ~(size_t)31) + ((c & 31) < 16 ? 2 * (c & 15) : 2 * (c & 15) + 1);
}

/* Grouped q4's scales, decoded once per row of a matmat row block (group_scales 16 at a
 * time) instead of once per 128-column chunk (4 groups, mostly in the AVX2 decoder's
 * tail loop), where scale decoding had been a tenth of q4tp's matmat time. */
#define MM_ROW_SCALES(m) (q4_grouped(m) || q2_grouped(m) ? (m)->cols / CQ_GROUP : 0)
static void mm_row_scales(const cq_qmat *m, size_t r, float *sc) { group_scales(m, r, 0, m->cols / CQ_GROUP, sc); }

/* Columns [c0, c1) of row r as matmat multiplies them (the reference's float32
 * weights, grouped q4 in mm_column's order, with the row's scales sc), 16 lanes where
 * the dtype allows; the rest, and the tails, by the AVX2 decoder. */
static void mm_decode_sc(const cq_qmat *m, size_t r, size_t c0, size_t c1, float *out, const float *sc) {
    const size_t cols = m->cols;
    size_t c = c0;
    switch (m->dtype) {
    case CQ_DT_F16: {
        const uint8_t *p = m->data + 2 * r * cols;
        for (; c + 16 <= c1; c += 16)
            _mm512_storeu_ps(out + (c - c0), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 2 * c))));
        break;
    }
    case CQ_DT_BF16: {
        const uint8_t *p = m->data + 2 * r * cols;
        for (; c + 16 <= c1; c += 16)
            _mm512_storeu_ps(out + (c - c0), _mm512_castsi512_ps(_mm512_slli_epi32(
                                                 _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p + 2 * c))), 16)));
        break;
    }
    case CQ_DT_Q8_ROW: {
        const uint8_t *p = m->data + r * cols;
        const __m512 s = _mm512_set1_ps(m->aux[r]);
        for (; c + 16 <= c1; c += 16) _mm512_storeu_ps(out + (c - c0), _mm512_mul_ps(z_i8(p + c), s));
        break;
    }
    case CQ_DT_Q8_2F: {
        const uint8_t *p = m->data + r * cols;
        const float *col = m->aux + m->rows;
        const __m512 s = _mm512_set1_ps(m->aux[r]);
        for (; c + 16 <= c1; c += 16)
            _mm512_storeu_ps(out + (c - c0), _mm512_mul_ps(_mm512_mul_ps(z_i8(p + c), s), _mm512_loadu_ps(col + c)));
        break;
    }
    default:
        if (q4_grouped(m)) { /* c0, c1: multiples of 32 (or c1 = cols, itself one) */
            const size_t gpr = cols / CQ_GROUP, gs = m->dtype == CQ_DT_Q4_TILED ? 18 : 16;
            const uint8_t *nb = m->data + gs * r * gpr + (gs == 18 ? 2 : 0);
            const __m512 lut8 = Q4_LUT8;
            for (size_t g = c0 / CQ_GROUP; g < c1 / CQ_GROUP; g++) {
                const __m512 lut = Q4_LUT(sc[g]);
                const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(nb + gs * g)));
                float *o = out + CQ_GROUP * g - c0;
                _mm512_storeu_ps(o, _mm512_permutexvar_ps(b, lut));
                _mm512_storeu_ps(o + 16, _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), lut));
            }
            return;
        }
        if (q2_grouped(m)) { /* a group's 8 bytes widened once; code k of each is (b >> 2k),
                              * looked up in the group's 8 weights (v - 1.5) * scale */
            const uint8_t *body = m->data + 8 * r * (cols / CQ_GROUP);
            const __m256 lut = _mm256_setr_ps(-1.5f, -0.5f, 0.5f, 1.5f, -1.5f, -0.5f, 0.5f, 1.5f);
            for (size_t g = c0 / CQ_GROUP; g < c1 / CQ_GROUP; g++) {
                const __m256 lg = _mm256_mul_ps(lut, _mm256_set1_ps(sc[g]));
                const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(body + 8 * g)));
                float *o = out + CQ_GROUP * g - c0;
                _mm256_storeu_ps(o, _mm256_permutevar8x32_ps(lg, b));
                _mm256_storeu_ps(o + 8, _mm256_permutevar8x32_ps(lg, _mm256_srli_epi32(b, 2)));
                _mm256_storeu_ps(o + 16, _mm256_permutevar8x32_ps(lg, _mm256_srli_epi32(b, 4)));
                _mm256_storeu_ps(o + 24, _mm256_permutevar8x32_ps(lg, _mm256_srli_epi32(b, 6)));
            }
            return;
        }
        break; /* f32 (a copy), vbit, odd shapes */
    }
    if (c < c1) avx2_dequant_span(m, r, c, c1, out + (c - c0));
}

#include "matmat_packed.h"
#include "matmat_i8_avx512.h"
#include "ggml_kq_matmat_avx512.h"

/* matvec_batch's multi-input rows: 16 lanes, four rows a tile (rows_multi.h). */
#define CQ_MULTI_R 4
#define MULTI_VEC __m512
#define MULTI_LANES 16
#define MULTI_ZERO() _mm512_setzero_ps()
#define MULTI_LOAD(p) _mm512_loadu_ps(p)
#define MULTI_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define MULTI_HSUM(v) _mm512_reduce_add_ps(v)
static inline __attribute__((always_inline)) __m512 multi_w(int q8, const uint8_t *p, size_t c) {
    return q8 ? _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + c)))) : _mm512_loadu_ps((const float *)(const void *)p + c);
}
#include "rows_multi.h"

#include "matvec_drivers.h"

CQ_MATVEC_OPS(cq_matvec_avx512);
