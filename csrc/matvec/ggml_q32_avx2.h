/* ggml_q32_avx2.h -- AVX2 rows of the 32-weight ggml block formats. Included by
 * matvec_avx2_impl.h, so the AVX2 and AVX-512 tables share the exact (float32 x) row;
 * the int8 row is the AVX2 table's (the AVX-512 one has its own, ggml_q32_avx512.h).
 *
 * Exact (spec: ggml_q32_ref_row): a block's codes widened to float32 eight at a time,
 * the weights d * q (or (d * q) + m) rounded as the reference rounds them, then FMAs
 * against x into four accumulators (one per 8 columns of a block): the weights'
 * bits, summed in another order.
 *
 * int8 (spec: ggml_q32_ref_i8_row): eight blocks a step (G32_I8_ROW_VARIANT), each
 * block against 32 bytes of CQ_XQ_G32's xq by vpdpbusd where the CPU has a 256-bit one,
 * else maddubs + madd, its integer sum folded to one dword so that one convert and
 * one FMA serve eight blocks; the blocks left over one a step: the codes
 * as signed bytes (q8_0 as stored, iq4_nl's level by vpshufb, q4_0/q5_0 the value less
 * its offset) meet xq as |q| (u8) times xq with q's sign (vpsignb), summed per 4-byte
 * lane by maddubs + madd; the min formats (q4_1, q5_1) take their unsigned codes
 * directly and add m * (the lane's xq sum) in float. The integers equal the
 * reference's; the float sums run in another order. */
#ifndef CQ_GGML_Q32_AVX2_H
#define CQ_GGML_Q32_AVX2_H
#include "ggml_q32_scalar.h"

static inline float g32_h2f(const uint8_t *p) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(cq_ld16(p)))); }

/* A block's 16 nibble bytes as 32 u8 codes in column order. */
static inline __m256i g32_nibbles(const uint8_t *qs) {
    const __m128i v = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0F));
}

/* qh's 32 bits as bytes 16 (bit set) or 0, column k from bit k. */
static inline __m256i g32_high_bits(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), spread), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(16));
}

/* A block's 32 codes as signed bytes in column order (the min formats' codes are
 * unsigned, at most 31). */
static inline __m256i g32_codes(int dt, const uint8_t *p) {
    switch (dt) {
    case CQ_DT_GGML_Q8_0: return _mm256_loadu_si256((const __m256i *)(p + 2));
    case CQ_DT_GGML_IQ4_NL:
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)GGML_IQ4NL_LEVELS)),
                                   g32_nibbles(p + 2));
    case CQ_DT_GGML_Q4_0: return _mm256_sub_epi8(g32_nibbles(p + 2), _mm256_set1_epi8(8));
    case CQ_DT_GGML_Q4_1: return g32_nibbles(p + 4);
    case CQ_DT_GGML_Q5_0:
        return _mm256_sub_epi8(_mm256_or_si256(g32_nibbles(p + 6), g32_high_bits(p + 2)), _mm256_set1_epi8(16));
    default: return _mm256_or_si256(g32_nibbles(p + 8), g32_high_bits(p + 4)); /* q5_1 */
    }
}

static inline __attribute__((always_inline)) float g32_dot_t(const cq_qmat *m, size_t r, const float *x, const int dt) {
    const int min = ggml_q32_has_min(dt);
    const size_t gpr = m->cols / CQ_GROUP, bb = ggml_q32_block_bytes(dt);
    const uint8_t *p = m->data + r * gpr * bb;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t g = 0; g < gpr; g++, p += bb, x += CQ_GROUP) {
        CQ_STREAM_PF(p);
        const __m256i v = g32_codes(dt, p);
        const __m256 d = _mm256_set1_ps(g32_h2f(p)), mn = _mm256_set1_ps(min ? g32_h2f(p + 2) : 0.0f);
        const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
#define G32_W(q8) (min ? _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8))), mn) \
                       : _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8))))
        a0 = _mm256_fmadd_ps(G32_W(lo), _mm256_loadu_ps(x), a0);
        a1 = _mm256_fmadd_ps(G32_W(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), a1);
        a2 = _mm256_fmadd_ps(G32_W(hi), _mm256_loadu_ps(x + 16), a2);
        a3 = _mm256_fmadd_ps(G32_W(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), a3);
#undef G32_W
    }
    return cq_hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

/* Blocks [ga, gb) of row r as float32 weights into out: the reference's bits. */
static void g32_decode_avx2(const cq_qmat *m, size_t r, size_t ga, size_t gb, float *out) {
    const int dt = m->dtype, min = ggml_q32_has_min(dt);
    const size_t bb = ggml_q32_block_bytes(dt);
    const uint8_t *p = m->data + (r * (m->cols / CQ_GROUP) + ga) * bb;
    for (size_t g = ga; g < gb; g++, p += bb, out += CQ_GROUP) {
        const __m256i v = g32_codes(dt, p);
        const __m256 d = _mm256_set1_ps(g32_h2f(p)), mn = _mm256_set1_ps(min ? g32_h2f(p + 2) : 0.0f);
        const __m128i q16[2] = {_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)};
        for (int k = 0; k < 4; k++) {
            const __m128i q8 = k & 1 ? _mm_srli_si128(q16[k / 2], 8) : q16[k / 2];
            __m256 w = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)));
            if (min) w = _mm256_add_ps(w, mn);
            _mm256_storeu_ps(out + 8 * k, w);
        }
    }
}

static float g32_dot_avx2(const cq_qmat *m, size_t r, const float *x) {
    switch (m->dtype) {
    case CQ_DT_GGML_Q8_0: return g32_dot_t(m, r, x, CQ_DT_GGML_Q8_0);
    case CQ_DT_GGML_Q4_0: return g32_dot_t(m, r, x, CQ_DT_GGML_Q4_0);
    case CQ_DT_GGML_Q4_1: return g32_dot_t(m, r, x, CQ_DT_GGML_Q4_1);
    case CQ_DT_GGML_Q5_0: return g32_dot_t(m, r, x, CQ_DT_GGML_Q5_0);
    case CQ_DT_GGML_Q5_1: return g32_dot_t(m, r, x, CQ_DT_GGML_Q5_1);
    default: return g32_dot_t(m, r, x, CQ_DT_GGML_IQ4_NL);
    }
}

/* Eight blocks' dword sums (block k's eight in v[k]) folded to one dword a block, in
 * block order: two rounds of unpack + add within 128-bit lanes, then the lanes' halves
 * added across (exact integers). */
static inline __m256i g32_fold8(const __m256i *v) {
    __m256i p[4], q[2];
    for (int i = 0; i < 4; i++)
        p[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                                _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        q[i] = _mm256_add_epi32(_mm256_unpacklo_epi64(p[2 * i], p[2 * i + 1]),
                                _mm256_unpackhi_epi64(p[2 * i], p[2 * i + 1]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(q[0], q[1], 0x20), _mm256_permute2x128_si256(q[0], q[1], 0x31));
}

/* The f16 at p + bb * k, k = 0..7, as 8 floats. */
static inline __m256 g32_halves8(const uint8_t *p, size_t bb) {
    const uint64_t a = (uint64_t)cq_ld16(p) | (uint64_t)cq_ld16(p + bb) << 16 | (uint64_t)cq_ld16(p + 2 * bb) << 32 |
                       (uint64_t)cq_ld16(p + 3 * bb) << 48;
    const uint64_t b = (uint64_t)cq_ld16(p + 4 * bb) | (uint64_t)cq_ld16(p + 5 * bb) << 16 |
                       (uint64_t)cq_ld16(p + 6 * bb) << 32 | (uint64_t)cq_ld16(p + 7 * bb) << 48;
    return _mm256_cvtph_ps(_mm_set_epi64x((long long)b, (long long)a));
}

/* One block's dword sums (4-byte lanes) of its codes against xq in the eight-block
 * step of the madd variant as maddubs + madd (q4_0 and q5_0 as their unsigned stored
 * values, the min formats unsigned, q8_0 and iq4_nl as |q| against xq with q's sign).
 * The vpdpbusd variants take one vpdpbusd a block instead, iq4_nl's levels looked up
 * + 128 (an unsigned byte; 128 times the block's xq sum comes off after the fold):
 * every lane holds the madd variant's integer but iq4_nl's, whose folded sums match. */
#define G32_BLOCK_SUM_MADD(dt, v, x)                                                                      \
    ((dt) == CQ_DT_GGML_Q8_0 || (dt) == CQ_DT_GGML_IQ4_NL                                                 \
         ? _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(x, v)), ones16)    \
         : _mm256_madd_epi16(_mm256_maddubs_epi16(v, x), ones16))

/* Row r against xq, eight blocks a step (SUF: the variant; TARGET: its instruction
 * sets; VNNI: 1 for the vpdpbusd variants, DOT their vpdpbusd; HIGH: q5's fifth bits
 * as bytes 16 or 0). Each block's dword sums are folded to one dword a block
 * (g32_fold8) and met by d_w * d_x in one FMA; the offsets (q4_0: 8, q5_0: 16, and
 * iq4_nl's 128 under VNNI) times the block's xq sum are taken off the folded integer;
 * the min formats' m * d_x * (xq sum) joins by a second FMA. The blocks left over go
 * one a step, each term into f0 or f1 by block parity. The integers and float
 * operations are the same in every variant, so all give the same bits. */
#define G32_I8_ROW_VARIANT(SUF, TARGET, VNNI, DOT, HIGH)                                                  \
    static inline __attribute__((always_inline, target(TARGET))) float g32_i8_row_##SUF##_t(              \
        const cq_qmat *m, size_t r, const cq_xq *xq, const int dt) {                                      \
        const int min = ggml_q32_has_min(dt);                                                             \
        const size_t gpr = m->cols / CQ_GROUP, bb = ggml_q32_block_bytes(dt);                             \
        const uint8_t *p = m->data + r * gpr * bb;                                                        \
        const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);                         \
        const __m256i lv = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)GGML_IQ4NL_LEVELS)); \
        const __m256i lvu = _mm256_xor_si256(lv, _mm256_set1_epi8((char)0x80));                           \
        __m256 f0 = _mm256_setzero_ps(), f1 = f0, acc = f0;                                               \
        size_t g = 0;                                                                                     \
        const int offset = dt == CQ_DT_GGML_Q4_0 ? 8 : dt == CQ_DT_GGML_Q5_0 ? 16                         \
                         : VNNI && dt == CQ_DT_GGML_IQ4_NL ? 128 : 0;                                     \
        for (; g + 8 <= gpr; g += 8, p += 8 * bb) {                                                       \
            for (size_t o = 0; o < 8 * bb; o += 64) CQ_STREAM_PF(p + o);                                  \
            __m256i s[8];                                                                                 \
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {                                         \
                const uint8_t *pk = p + k * bb;                                                           \
                const __m256i x = _mm256_load_si256((const __m256i *)(xq->q + CQ_GROUP * (g + k)));       \
                __m256i v;                                                                                \
                switch (dt) {                                                                             \
                case CQ_DT_GGML_Q8_0: v = _mm256_loadu_si256((const __m256i *)(pk + 2)); break;           \
                case CQ_DT_GGML_IQ4_NL: v = _mm256_shuffle_epi8(VNNI ? lvu : lv, g32_nibbles(pk + 2)); break; \
                case CQ_DT_GGML_Q4_0: v = g32_nibbles(pk + 2); break;                                     \
                case CQ_DT_GGML_Q4_1: v = g32_nibbles(pk + 4); break;                                     \
                case CQ_DT_GGML_Q5_0: v = _mm256_or_si256(g32_nibbles(pk + 6), HIGH(pk + 2)); break;      \
                default: /* q5_1 */ v = _mm256_or_si256(g32_nibbles(pk + 8), HIGH(pk + 4)); break;       \
                }                                                                                         \
                if (!VNNI) s[k] = G32_BLOCK_SUM_MADD(dt, v, x);                                           \
                else if (dt == CQ_DT_GGML_Q8_0)                                                           \
                    s[k] = DOT(_mm256_setzero_si256(), _mm256_abs_epi8(v), _mm256_sign_epi8(x, v));       \
                else s[k] = DOT(_mm256_setzero_si256(), v, x);                                            \
            }                                                                                             \
            __m256i isum = g32_fold8(s), xs = _mm256_setzero_si256();                                     \
            if (min || offset) {                                                                          \
                const __m256i b0 = _mm256_loadu_si256((const __m256i *)(xq->bias + 2 * g));              \
                const __m256i b1 = _mm256_loadu_si256((const __m256i *)(xq->bias + 2 * g + 8));          \
                xs = _mm256_permute4x64_epi64(_mm256_hadd_epi32(b0, b1), _MM_SHUFFLE(3, 1, 2, 0));        \
            }                                                                                             \
            if (offset) isum = _mm256_sub_epi32(isum, _mm256_mullo_epi32(xs, _mm256_set1_epi32(offset))); \
            const __m256 dx = _mm256_loadu_ps(xq->d + g);                                                 \
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(g32_halves8(p, bb), dx), acc);  \
            if (min) acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(xs), _mm256_mul_ps(g32_halves8(p + 2, bb), dx), acc); \
        }                                                                                                 \
        for (; g < gpr; g++, p += bb) {                                                                   \
            CQ_STREAM_PF(p);                                                                              \
            const __m256i x = _mm256_load_si256((const __m256i *)(xq->q + CQ_GROUP * g));                 \
            const __m256 dl = _mm256_load_ps(xq->dl + 8 * g);                                             \
            const __m256i v = g32_codes(dt, p);                                                           \
            __m256i isum;                                                                                 \
            if (min) isum = _mm256_madd_epi16(_mm256_maddubs_epi16(v, x), ones16);                        \
            else isum = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(x, v)), ones16); \
            __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(_mm256_set1_ps(g32_h2f(p)), dl)); \
            if (min) {                                                                                    \
                const __m256i xs = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, x), ones16);             \
                t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(xs), _mm256_mul_ps(_mm256_set1_ps(g32_h2f(p + 2)), dl), t); \
            }                                                                                             \
            if (g & 1) f1 = _mm256_add_ps(f1, t);                                                         \
            else f0 = _mm256_add_ps(f0, t);                                                               \
        }                                                                                                 \
        return cq_hsum8(_mm256_add_ps(acc, _mm256_add_ps(f0, f1)));                                       \
    }                                                                                                     \
    /* rows r0 .. r0+nr-1, the format a constant in each instance so its branches fold away */           \
    __attribute__((target(TARGET))) static void g32_i8_rows_##SUF(const cq_qmat *m, size_t r0, size_t nr, \
                                                                  const cq_xq *xq, float *out) {          \
        switch (m->dtype) {                                                                               \
        case CQ_DT_GGML_Q8_0: for (size_t j = 0; j < nr; j++) out[j] = g32_i8_row_##SUF##_t(m, r0 + j, xq, CQ_DT_GGML_Q8_0); break; \
        case CQ_DT_GGML_Q4_0: for (size_t j = 0; j < nr; j++) out[j] = g32_i8_row_##SUF##_t(m, r0 + j, xq, CQ_DT_GGML_Q4_0); break; \
        case CQ_DT_GGML_Q4_1: for (size_t j = 0; j < nr; j++) out[j] = g32_i8_row_##SUF##_t(m, r0 + j, xq, CQ_DT_GGML_Q4_1); break; \
        case CQ_DT_GGML_Q5_0: for (size_t j = 0; j < nr; j++) out[j] = g32_i8_row_##SUF##_t(m, r0 + j, xq, CQ_DT_GGML_Q5_0); break; \
        case CQ_DT_GGML_Q5_1: for (size_t j = 0; j < nr; j++) out[j] = g32_i8_row_##SUF##_t(m, r0 + j, xq, CQ_DT_GGML_Q5_1); break; \
        default: for (size_t j = 0; j < nr; j++) out[j] = g32_i8_row_##SUF##_t(m, r0 + j, xq, CQ_DT_GGML_IQ4_NL); \
        }                                                                                                 \
    }

static inline __m256i g32_no_dot(__m256i acc, __m256i u, __m256i v) { /* the madd variant takes no DOT */
    (void)u;
    (void)v;
    return acc;
}
G32_I8_ROW_VARIANT(madd, "avx2", 0, g32_no_dot, g32_high_bits)
#if (defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) || (defined(__clang__) && __clang_major__ >= 12)
#define CQ_HAVE_G32_VEX 1
G32_I8_ROW_VARIANT(vex, "avxvnni", 1, _mm256_dpbusd_avx_epi32, g32_high_bits)
#endif
#if defined(__GNUC__) || defined(__clang__)
#define CQ_HAVE_G32_EVEX 1
/* qh's 32 bits as bytes 16 or 0 through a mask register (one kmov and one masked move
 * against g32_high_bits' five vector operations) */
static inline __attribute__((always_inline, target("avx512bw,avx512vl"))) __m256i g32_high_bits_k(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    return _mm256_maskz_mov_epi8((__mmask32)h, _mm256_set1_epi8(16));
}
G32_I8_ROW_VARIANT(evex, "avx512vnni,avx512vl,avx512bw", 1, _mm256_dpbusd_epi32, g32_high_bits_k)
#endif

/* Rows r0 .. r0+nr-1 with int8 x: the vpdpbusd variant where the CPU has a 256-bit one
 * (AVX-VNNI, or AVX-512 VNNI + VL + BW), else maddubs + madd; the same bits. */
static void g32_i8_rows_avx2(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *xq, float *out) {
    const uint32_t f = cq_cpu_features();
#ifdef CQ_HAVE_G32_VEX
    if (f & CQ_CPU_AVXVNNI) {
        g32_i8_rows_vex(m, r0, nr, xq, out);
        return;
    }
#endif
#ifdef CQ_HAVE_G32_EVEX
    const uint32_t evex = CQ_CPU_AVX512F | CQ_CPU_AVX512VL | CQ_CPU_AVX512BW | CQ_CPU_AVX512VNNI | CQ_CPU_OS_ZMM;
    if ((f & evex) == evex) {
        g32_i8_rows_evex(m, r0, nr, xq, out);
        return;
    }
#endif
    (void)f;
    g32_i8_rows_madd(m, r0, nr, xq, out);
}
#endif
