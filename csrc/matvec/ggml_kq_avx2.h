/* ggml_kq_avx2.h -- AVX2 int8-activation rows of the K-quants q4_k, q5_k, q6_k and iq4_xs
 * (x in the CQ_XQ_G32 layout; spec: kq_ref_i8_row, whose bits they give); the other
 * K-quants (q2_k, q3_k) run the spec. Included by matvec_avx2.c.
 *
 * One 32-weight group a step: its u8 weights (u = q, or q + 32 for q6_k) meet its 32
 * xq bytes in vpmaddubsw (u <= 63 times |xq| <= 127: the int16 pair sums are exact) and
 * vpmaddwd by ones, 8 lanes of 4-weight sums, lanes 0-3 one 16-weight half, 4-7 the
 * other. q4_k and q5_k (scales per group): a tree of packs and vpmaddwd by ones brings
 * the eight groups to their sums in order (kq2_group_sums), then multiplied by the
 * scales. q6_k (scales per 16 weights, and u up to 63, whose 8-weight sums need not fit
 * int16): three rounds of pair sums bring them to two vectors of half sums, (group 0..3,
 * half a | half b) and (4..7, a | b); its offset comes off there (32 * the xq half sums
 * of CQ_XQ_G32), the 16-weight scales multiply them, and the halves are added into the
 * eight group sums in order. iq4_xs (levels -127..113 by vpshufb; vpmaddubsw takes
 * |level| and xq with the level's sign, so no offset) sums its groups' 4-weight sums
 * (beyond int16) in int32 and scales them per group. The spec's float operations then
 * run on the eight lanes.
 * The rows come twice, with shifts and masks for the weights' bit moves and, where the
 * CPU has GFNI, with affine byte transforms (KQ2_HI4, KQ2_F): the same bytes. */
#ifndef CQ_GGML_KQ_AVX2_H
#define CQ_GGML_KQ_AVX2_H

static inline void kq2_pf(const uint8_t *a, size_t n) {
    const uintptr_t end = (uintptr_t)a + n;
    for (uintptr_t l = ((uintptr_t)a + 63) & ~(uintptr_t)63; l < end; l += 64) CQ_STREAM_PF((const uint8_t *)l);
}

/* q4_k / q5_k's 12 scale bytes (at s, 4 more readable bytes after them) as 16 bytes:
 * sc[0..7], mn[0..7] (kq_scale_min6), per byte as in ggml_kq_avx512.h. */
static inline __m128i kq2_scales16(const uint8_t *s) {
    const __m128i v = _mm_loadu_si128((const __m128i *)s);
    const __m128i acbc = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0));
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(acbc, _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)), 2),
                                     _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

static inline __m128 kq2_h2f(const uint8_t *p) { return _mm_cvtph_ps(_mm_cvtsi32_si128((int)cq_ld16(p))); }

/* kq_ref_i8_row's final sum of its eight lane accumulators. */
static inline float kq2_lanes8_sum(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/* Four groups' lane sums y0..y3 as their half sums: (y0a, y1a, y2a, y3a | y0b, .., y3b).
 * The first round is packs and vpmaddwd by ones (the lanes' 4-weight sums, <= 63 * 127
 * * 4, fit int16; the same layout as vphaddd, fewer micro-ops), the second vphaddd. */
static inline __m256i kq2_halves(__m256i y0, __m256i y1, __m256i y2, __m256i y3) {
    const __m256i ones = _mm256_set1_epi16(1);
    return _mm256_hadd_epi32(_mm256_madd_epi16(_mm256_packs_epi32(y0, y1), ones),
                             _mm256_madd_epi16(_mm256_packs_epi32(y2, y3), ones));
}

/* The eight group sums, in order, from the scaled half sums of groups 0-3 (a) and 4-7 (b). */
static inline __m256i kq2_groups(__m256i a, __m256i b) {
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* Four vectors of 8 int32 lanes (a, b, c, e) as their lane sums per 128-bit lane: lane
 * k of each half the k-th vector's (exact int32 unpacks and adds, as vphaddd twice). */
static inline __m256i kq2_sums4(__m256i a, __m256i b, __m256i c, __m256i e) {
    const __m256i ab = _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
    const __m256i ce = _mm256_add_epi32(_mm256_unpacklo_epi32(c, e), _mm256_unpackhi_epi32(c, e));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(ab, ce), _mm256_unpackhi_epi64(ab, ce));
}

/* The xq half sums of block b (bias[16b + 2g + h]) in kq2_halves' order, groups 0-3 and 4-7. */
static inline void kq2_xhalves(const cq_xq *xq, size_t b, __m256i *a, __m256i *c) {
    const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    *a = _mm256_permutevar8x32_epi32(_mm256_load_si256((const __m256i *)(xq->bias + 16 * b)), order);
    *c = _mm256_permutevar8x32_epi32(_mm256_load_si256((const __m256i *)(xq->bias + 16 * b + 8)), order);
}

/* A block's eight group dots y[g] (8 lanes of 4-weight sums, within int16) as its
 * eight group sums in order, unscaled: two packs and vpmaddwd by ones halve the lanes
 * twice (8-weight sums, <= 31 * 127 * 8, still fit int16), leaving per 128-bit lane the
 * four groups' 16-weight halves, (0..3 | 0..3) and (4..7 | 4..7); the lanes are added. */
static inline __m256i kq2_group_sums(const __m256i y[8], __m256i ones) {
    __m256i p[4];
    for (int i = 0; i < 4; i++) p[i] = _mm256_madd_epi16(_mm256_packs_epi32(y[2 * i], y[2 * i + 1]), ones);
    const __m256i a = _mm256_madd_epi16(_mm256_packs_epi32(p[0], p[1]), ones);
    const __m256i c = _mm256_madd_epi16(_mm256_packs_epi32(p[2], p[3]), ones);
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, c, 0x20), _mm256_permute2x128_si256(a, c, 0x31));
}

#define KQ2_DOT(u, x) _mm256_madd_epi16(_mm256_maddubs_epi16((u), (x)), ones)

/* The bit moves of the rows' weight unpacking, per byte: KQ2_HI4 a byte's high nibble as
 * its low one; KQ2_F(qh, s) q6_k's 2-bit field s of qh to bits 4-5, the rest zero. Shifts
 * and masks, or with GFNI one affine byte transform each (vgf2p8affineqb, as in
 * ggml_kq_avx512.h): the same bytes. */
#define KQ2_HI4(v) _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f)
#define KQ2_F(qh, s)                                                                                 \
    _mm256_and_si256((s) < 2 ? _mm256_slli_epi16(qh, 4 - 2 * (s)) : (s) == 2 ? (qh) : _mm256_srli_epi16(qh, 2), _mm256_set1_epi8(0x30))

#define KQ2_ROW_FNS(SUF, ATTR)                                                                                               \
                                                                                                                             \
/* q4_k (Q5 = 0) and q5_k (Q5 = 1): qs bytes 32i + k, low nibble weight 64i + k (group                                       \
 * 2i), high 64i + 32 + k (group 2i + 1); q5_k's fifth bit of weight 32g + k is bit g of                                     \
 * qh[k] (a 16-bit shift brings it to bit 4 of its byte). Group scales, per half alike. */                                   \
ATTR static float kq2_q45k_row_##SUF(const cq_qmat *m, size_t r, const cq_xq *xq, int q5) {                                  \
    const size_t nb = m->cols / CQ_KQ_BLOCK, bb = q5 ? 176 : 144;                                                            \
    const uint8_t *row = m->data + r * nb * bb;                                                                              \
    const __m256i m0f = _mm256_set1_epi8(0x0F), m10 = _mm256_set1_epi8(0x10), ones = _mm256_set1_epi16(1);                   \
    __m256 acc = _mm256_setzero_ps();                                                                                        \
    for (size_t b = 0; b < nb; b++) {                                                                                        \
        const uint8_t *blk = row + b * bb, *qs = blk + (q5 ? 48 : 16);                                                       \
        const int8_t *xb = xq->q + 256 * b;                                                                                  \
        kq2_pf(blk, bb);                                                                                                     \
        const __m128i sc = kq2_scales16(blk + 4);                                                                            \
        const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();                    \
        __m256i y[8];                                                                                                        \
        for (int i = 0; i < 4; i++) {                                                                                        \
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * i));                                            \
            __m256i lo = _mm256_and_si256(v, m0f), hi = KQ2_HI4(v);                                                          \
            if (q5) {                                                                                                        \
                const int g = 2 * i; /* bit g, bit g + 1 of each qh byte to bit 4 */                                         \
                const __m256i bl = g <= 4 ? _mm256_slli_epi16(qh, 4 - g) : _mm256_srli_epi16(qh, g - 4);                     \
                const __m256i bh = g + 1 <= 4 ? _mm256_slli_epi16(qh, 3 - g) : _mm256_srli_epi16(qh, g - 3);                 \
                lo = _mm256_or_si256(lo, _mm256_and_si256(bl, m10));                                                         \
                hi = _mm256_or_si256(hi, _mm256_and_si256(bh, m10));                                                         \
            }                                                                                                                \
            y[2 * i] = KQ2_DOT(lo, _mm256_load_si256((const __m256i *)(xb + 64 * i)));                                       \
            y[2 * i + 1] = KQ2_DOT(hi, _mm256_load_si256((const __m256i *)(xb + 64 * i + 32)));                              \
        }                                                                                                                    \
        /* the unscaled group sums in order (kq2_group_sums), then scaled per group */                                       \
        const __m256 isum = _mm256_cvtepi32_ps(_mm256_mullo_epi32(kq2_group_sums(y, ones), _mm256_cvtepu8_epi32(sc)));       \
        const __m256i xs = _mm256_permute4x64_epi64(                                                                         \
            _mm256_hadd_epi32(_mm256_load_si256((const __m256i *)(xq->bias + 16 * b)),                                       \
                              _mm256_load_si256((const __m256i *)(xq->bias + 16 * b + 8))),                                  \
            _MM_SHUFFLE(3, 1, 2, 0));                                                                                        \
        const __m256 msum = _mm256_cvtepi32_ps(_mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(sc, 8)), xs));         \
        const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)(cq_ld16(blk) | (uint32_t)cq_ld16(blk + 2) << 16)));           \
        const __m256 d = _mm256_broadcastss_ps(dm), dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));                       \
        const __m256 dg = _mm256_loadu_ps(xq->d + 8 * b);                                                                    \
        acc = _mm256_add_ps(acc, _mm256_mul_ps(dg, _mm256_sub_ps(_mm256_mul_ps(d, isum), _mm256_mul_ps(dmin, msum))));       \
    }                                                                                                                        \
    return kq2_lanes8_sum(acc);                                                                                              \
}                                                                                                                            \
                                                                                                                             \
/* q6_k: weight 128h + 32s + k has low bits from ql[64h + 32(s & 1) + k] (low nibble for                                     \
 * s < 2, high for s >= 2) and bits 4-5 from (qh[32h + k] >> 2s) & 3; u = q + 32. */                                         \
ATTR static float kq2_q6k_row_##SUF(const cq_qmat *m, size_t r, const cq_xq *xq) {                                           \
    const size_t nb = m->cols / CQ_KQ_BLOCK;                                                                                 \
    const uint8_t *row = m->data + r * nb * 210;                                                                             \
    const __m256i m0f = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);                   \
    const __m128i evod = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);                                \
    __m256 acc = _mm256_setzero_ps();                                                                                        \
    for (size_t b = 0; b < nb; b++) {                                                                                        \
        const uint8_t *blk = row + b * 210;                                                                                  \
        const int8_t *xb = xq->q + 256 * b;                                                                                  \
        kq2_pf(blk, 210);                                                                                                    \
        __m256i y[8];                                                                                                        \
        for (int h = 0; h < 2; h++) {                                                                                        \
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));                                          \
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));                                     \
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));                                    \
            for (int s = 0; s < 4; s++) {                                                                                    \
                const __m256i l = s & 1 ? l1 : l0;                                                                           \
                const __m256i low = s < 2 ? _mm256_and_si256(l, m0f) : KQ2_HI4(l);                                           \
                const __m256i high = KQ2_F(qh, s);                                                                           \
                y[4 * h + s] = KQ2_DOT(_mm256_or_si256(low, high),                                                           \
                                       _mm256_load_si256((const __m256i *)(xb + 32 * (4 * h + s))));                         \
            }                                                                                                                \
        }                                                                                                                    \
        __m256i xa, xc;                                                                                                      \
        kq2_xhalves(xq, b, &xa, &xc);                                                                                        \
        const __m128i sc = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(blk + 192)), evod);                            \
        const __m256i a = _mm256_mullo_epi32(_mm256_sub_epi32(kq2_halves(y[0], y[1], y[2], y[3]), _mm256_slli_epi32(xa, 5)), \
                                             _mm256_cvtepi8_epi32(sc));                                                      \
        const __m256i c = _mm256_mullo_epi32(_mm256_sub_epi32(kq2_halves(y[4], y[5], y[6], y[7]), _mm256_slli_epi32(xc, 5)), \
                                             _mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)));                                   \
        const __m256 isum = _mm256_cvtepi32_ps(kq2_groups(a, c));                                                            \
        const __m256 d = _mm256_broadcastss_ps(kq2_h2f(blk + 208));                                                          \
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(d, _mm256_loadu_ps(xq->d + 8 * b)), isum));                     \
    }                                                                                                                        \
    return kq2_lanes8_sum(acc);                                                                                              \
}                                                                                                                            \
                                                                                                                             \
/* iq4_xs: qs bytes 16g + k (at 8), low nibble weight k of group g, high 16 + k; a                                           \
 * 32-byte load holds groups 2i, 2i + 1 in its 128-bit lanes, so its low nibbles are the                                     \
 * two groups' first halves and its high nibbles their second halves, met by x's bytes                                       \
 * paired the same way (vinserti128 of the groups' first, then last, 16 bytes). The                                          \
 * codes look up their signed levels (vpshufb); vpmaddubsw takes |level| (<= 127) and xq                                     \
 * with the level's sign (vpsignb; xq is never -128), so the int16 pair sums (<= 2 * 127                                     \
 * * 127) are exact, as in ggml_q32_avx2.h's iq4_nl. Each step's lanes 0-3 belong to                                         \
 * group 2i, 4-7 to 2i + 1: the two steps of a load are added, reduced by unpacks and                                        \
 * adds (exact int32) to the group sums (0, 2, 4, 6 | 1, 3, 5, 7), put in order by one                                       \
 * vpermd, scaled per group by vpmulld (group g's 6-bit scale: bits 4g.. of                                                  \
 * scales_l, 2g.. of scales_h, - 32), and (d * d_g) * isum goes into lane g. */                                              \
ATTR static float kq2_iq4_row_##SUF(const cq_qmat *m, size_t r, const cq_xq *xq) {                                           \
    const size_t nb = m->cols / CQ_KQ_BLOCK;                                                                                 \
    const uint8_t *row = m->data + r * nb * 136;                                                                             \
    const __m256i m0f = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);                                                 \
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)KQ_IQ4_LEVELS));                        \
    const __m256i slc = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), shc = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);  \
    __m256 acc = _mm256_setzero_ps();                                                                                        \
    for (size_t b = 0; b < nb; b++) {                                                                                        \
        const uint8_t *blk = row + b * 136;                                                                                  \
        const int8_t *xb = xq->q + 256 * b;                                                                                  \
        kq2_pf(blk, 136);                                                                                                    \
        __m256i y[8];                                                                                                        \
        for (int i = 0; i < 4; i++) {                                                                                        \
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 8 + 32 * i));                                       \
            const __m256i lo = _mm256_and_si256(v, m0f), hi = KQ2_HI4(v);                                                    \
            for (int e = 0; e < 2; e++) {                                                                                    \
                const __m256i q = _mm256_shuffle_epi8(lut, e ? hi : lo);                                                     \
                const __m256i x = _mm256_inserti128_si256(                                                                   \
                    _mm256_castsi128_si256(_mm_load_si128((const __m128i *)(xb + 64 * i + 16 * e))),                         \
                    _mm_load_si128((const __m128i *)(xb + 64 * i + 32 + 16 * e)), 1);                                        \
                y[2 * i + e] = KQ2_DOT(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q));                                          \
            }                                                                                                                \
        }                                                                                                                    \
        uint32_t sl;                                                                                                         \
        memcpy(&sl, blk + 4, 4);                                                                                             \
        const __m256i sc = _mm256_sub_epi32(                                                                                 \
            _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)sl), slc), _mm256_set1_epi32(15)),     \
                            _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)(cq_ld16(blk + 2) << 4)), shc),        \
                                             _mm256_set1_epi32(0x30))),                                                      \
            _mm256_set1_epi32(32));                                                                                          \
        const __m256i gs = kq2_sums4(_mm256_add_epi32(y[0], y[1]), _mm256_add_epi32(y[2], y[3]),                            \
                                     _mm256_add_epi32(y[4], y[5]), _mm256_add_epi32(y[6], y[7]));                            \
        const __m256i g = _mm256_permutevar8x32_epi32(gs, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));                        \
        const __m256 isum = _mm256_cvtepi32_ps(_mm256_mullo_epi32(g, sc));                                                  \
        const __m256 d = _mm256_broadcastss_ps(kq2_h2f(blk));                                                                \
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(d, _mm256_loadu_ps(xq->d + 8 * b)), isum));                     \
    }                                                                                                                        \
    return kq2_lanes8_sum(acc);                                                                                              \
}

KQ2_ROW_FNS(plain, )
#undef KQ2_HI4
#undef KQ2_F
#define KQ2_GF(s) ((long long)(((1ull << (2 * (s) + 1)) << 16) | ((1ull << (2 * (s))) << 24)))
#define KQ2_HI4(v) _mm256_gf2p8affine_epi64_epi8(v, _mm256_set1_epi64x(0x1020408000000000ll), 0)
#define KQ2_F(qh, s) _mm256_gf2p8affine_epi64_epi8(qh, _mm256_set1_epi64x(KQ2_GF(s)), 0)
KQ2_ROW_FNS(gfni, __attribute__((target("gfni"))))

/* The rows of one table variant: each row function inlined into its own loop. */
#define KQ2_ROWS_FN(SUF, ATTR)                                                                       \
    ATTR static void kq2_rows_##SUF(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *xq, float *out) { \
        for (size_t j = 0; j < nr; j++) {                                                            \
            switch (m->dtype) {                                                                      \
            case CQ_DT_GGML_Q4_K: out[j] = kq2_q45k_row_##SUF(m, r0 + j, xq, 0); break;              \
            case CQ_DT_GGML_Q5_K: out[j] = kq2_q45k_row_##SUF(m, r0 + j, xq, 1); break;              \
            case CQ_DT_GGML_Q6_K: out[j] = kq2_q6k_row_##SUF(m, r0 + j, xq); break;                  \
            case CQ_DT_GGML_IQ4_XS: out[j] = kq2_iq4_row_##SUF(m, r0 + j, xq); break;                \
            default: out[j] = kq_ref_i8_row(m, r0 + j, xq);                                          \
            }                                                                                        \
        }                                                                                            \
    }
KQ2_ROWS_FN(plain, )
KQ2_ROWS_FN(gfni, __attribute__((target("gfni"))))

static void kq_i8_rows(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *xq, float *out) {
    if (cq_cpu_features() & CQ_CPU_GFNI) kq2_rows_gfni(m, r0, nr, xq, out);
    else kq2_rows_plain(m, r0, nr, xq, out);
}
#endif
