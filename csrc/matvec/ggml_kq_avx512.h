/* ggml_kq_avx512.h -- AVX-512 int8-activation rows of the K-quants q4_k, q5_k, q6_k and
 * iq4_xs (x in the CQ_XQ_G32 layout; spec: kq_ref_i8_row, whose bits they give). The
 * other K-quants (q2_k, q3_k), and the float32 path of all of them, are the scalar
 * decoder's. Included by matvec_avx512.c.
 *
 * A block is four 64-weight steps, each meeting 64 contiguous xq bytes: vpdpbusd (or
 * vpmaddubsw + vpmaddwd without VNNI: u8 weights <= 63 times xq <= 127 fit the int16
 * pair sums, so the same integers) gives 16 lanes of 4-weight sums, each within int16.
 * The integers are then reduced before any float work to the block's eight group sums
 * isum: q4_k's and q5_k's, whose scales are per group, by a tree of packs and vpmaddwd
 * over both rows, by ones and then by the scales; q6_k's, scaled per 16
 * weights, narrowed to int16 and multiplied by the scales by one vpmaddwd per two steps,
 * then added across lanes. The spec's float operations run once per group, on 16
 * lanes: eight groups of two rows. Rows go two at a time; x's side of a block (its
 * loads, the mins' group sums from xq's per-half sums, q6_k's offset) is formed once
 * for both (for q4_k and q5_k once per call), and a lone row runs the same lanes, so a
 * row has the same bits wherever it falls (matvec, rows_dot, matvec_many, any thread
 * count). Three tile sets give the same integers: vpmaddubsw + vpmaddwd (AVX-512 BW),
 * vpdpbusd (VNNI), and vpdpbusd with GFNI's affine byte transforms for the weights' bit
 * moves (KQ_HI4, KQ_F01, KQ_F23).
 *
 * iq4_xs (KQ_IQ4_TILE) differs in its integers: its levels (-127..113, looked up by
 * vpshufb) go in as u8 level + 128 under vpdpbusd, the offset 128 * (the group's xq sum)
 * coming off per group, and as |level| against xq with the level's sign under
 * vpmaddubsw (whose int16 pair sums u8 241 would overflow); its 4-weight sums exceed
 * int16, so they are reduced to group sums in int32 (unpacks and adds) and scaled per
 * 32 weights by vpmulld. Its float operations are q6_k's: (d * d_g) * isum per group,
 * 16 lanes of eight groups of two rows. */
#ifndef CQ_GGML_KQ_AVX512_H
#define CQ_GGML_KQ_AVX512_H

/* The stream's prefetches for a block of n bytes at a: each line that starts inside it
 * (so consecutive blocks prefetch every line once). */
static inline void kq_pf(const uint8_t *a, size_t n) {
    const uintptr_t end = (uintptr_t)a + n;
    for (uintptr_t l = ((uintptr_t)a + 63) & ~(uintptr_t)63; l < end; l += 64) CQ_STREAM_PF((const uint8_t *)l);
}

/* The half float at p (F16C converts every value exactly, as cq_h2f does). */
static inline __m128 kq_h2f_1(const uint8_t *p) { return _mm_cvtph_ps(_mm_cvtsi32_si128((int)cq_ld16(p))); }

/* The loops over rows and steps must unroll: their per-row values stay in registers. */
#define KQ_UNROLL _Pragma("GCC unroll 8")

/* Block b's eight group sums of xq (the mins' x side: the per-half sums bias[16b + 2j + h]
 * added in pairs), as int32 in both 256-bit halves. */
static inline __m512i kq_xsum16(const cq_xq *xq, size_t b) {
    const __m512i hs = _mm512_load_si512((const void *)(xq->bias + 16 * b));
    const __m256i gs = _mm512_cvtepi64_epi32(_mm512_add_epi64(hs, _mm512_srli_epi64(hs, 32)));
    return _mm512_inserti64x4(_mm512_castsi256_si512(gs), gs, 1);
}

/* A block's four steps y0..y3 (16 lanes of 4-weight integer sums each, within int16;
 * chunk c = lanes 4c..4c+3 lies in one 16-weight sub-block) scaled by their sub-block
 * scales and summed per chunk: narrowed to int16 in pairs of steps, vpmaddwd by the
 * scales (sc01: chunk c words 0-3 the scale of (y0, c), 4-7 of (y1, c); sc23 likewise),
 * pairs of lanes added. Chunk c of the result: (y0, c), (y1, c), (y2, c), (y3, c). */
static inline __m512i kq_scaled_chunks(__m512i y0, __m512i y1, __m512i y2, __m512i y3, __m512i sc01, __m512i sc23) {
    const __m512 z01 = _mm512_castsi512_ps(_mm512_madd_epi16(_mm512_packs_epi32(y0, y1), sc01));
    const __m512 z23 = _mm512_castsi512_ps(_mm512_madd_epi16(_mm512_packs_epi32(y2, y3), sc23));
    return _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(z01, z23, _MM_SHUFFLE(2, 0, 2, 0))),
                            _mm512_castps_si512(_mm512_shuffle_ps(z01, z23, _MM_SHUFFLE(3, 1, 3, 1))));
}

/* Two rows' kq_scaled_chunks (qa, qb) as the eight group sums isum of each, in group
 * order: lanes 0-7 row a, 8-15 row b. Chunks 0 + 1 and 2 + 3 are added (each pair is
 * one group of every step); perm puts the groups in order. */
static inline __m512i kq_group_isums(__m512i qa, __m512i qb, __m512i perm) {
    const __m512i g = _mm512_add_epi32(_mm512_shuffle_i64x2(qa, qb, _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i64x2(qa, qb, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_permutexvar_epi32(perm, g);
}

/* Where a step's chunk lies: the group of (step s, chunk c) is 4 (s / 2) + s % 2 +
 * 2 (c / 2) for q4_k and q5_k (steps: low and high nibbles of qs bytes 0..63, then
 * 64..127), 2s + c / 2 for q6_k (step s: weights 64s..64s+63), whose 16-weight
 * sub-block is 4s + c. */
static inline int kq_q4_group(int s, int c) { return 4 * (s / 2) + s % 2 + 2 * (c / 2); }
static inline int kq_q6_group(int s, int c) { return 2 * s + c / 2; }

/* perm of kq_group_isums: after the chunk pairs are added, lane 4h + s of a row holds
 * the group of (s, 2h). */
static inline __m512i kq_group_perm(int q6) {
    int32_t p[16];
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++) {
            const int g = q6 ? kq_q6_group(s, 2 * h) : kq_q4_group(s, 2 * h);
            p[g] = 4 * h + s, p[8 + g] = 8 + 4 * h + s;
        }
    return _mm512_loadu_si512((const void *)p);
}

/* kq_ref_i8_row's final sum of its eight lane accumulators, from a ymm. */
static inline float kq_lanes8_sum(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/* The word indices of sc01 / sc23 (kq_scaled_chunks, steps s0 and s1) in a vector of
 * 16 int16 scales: q4_k / q5_k's eight (per group), q6_k's sixteen (per 16 weights). */
static inline __m512i kq_sc_idx(int q6, int s0, int s1) {
    int16_t w[32];
    for (int c = 0; c < 4; c++)
        for (int i = 0; i < 8; i++) {
            const int s = i < 4 ? s0 : s1;
            w[8 * c + i] = (int16_t)(q6 ? 4 * s + c : kq_q4_group(s, c));
        }
    return _mm512_loadu_si512((const void *)w);
}

/* Two rows' four steps (a0..a3 of row a, b0..b3 of row b: 16 lanes of 4-weight sums
 * each, within int16; a step's lanes 0-7 one group, 8-15 another) as the sixteen group
 * isums of q4_k / q5_k, lane 2g + row for group g of the step order kq_q4_group. Three
 * levels: packs and vpmaddwd halve the lanes twice, by ones to 8-weight sums (<= 31 * 127
 * * 8, still fit int16), then by the groups' scale words scw (kq_q45_heads), so the
 * 16-weight sums come scaled (sc * sum, exact: the spec's sc_a * qs_a + sc_b * qs_b with
 * sc_a = sc_b); then the two 128-bit chunks of each group are added. */
static inline __m512i kq_q45_isums(const __m512i a[4], const __m512i b[4], __m512i ones, const __m512i scw[2]) {
    __m512i p[4];
    KQ_UNROLL for (int s = 0; s < 4; s++) p[s] = _mm512_madd_epi16(_mm512_packs_epi32(a[s], b[s]), ones);
    /* p[s] chunk c: a's lanes 4c..4c+3 in pairs, then b's */
    const __m512i q01 = _mm512_madd_epi16(_mm512_packs_epi32(p[0], p[1]), scw[0]);
    const __m512i q23 = _mm512_madd_epi16(_mm512_packs_epi32(p[2], p[3]), scw[1]);
    /* q01 chunk c: (a0, b0, a1, b1) of chunk c (16 weights each); chunks 0 + 1 are the
     * steps' first groups, 2 + 3 their second */
    return _mm512_add_epi32(_mm512_shuffle_i64x2(q01, q23, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i64x2(q01, q23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The scale words of kq_q45_isums' second level for steps s0, s1 (its packs of p[s0],
 * p[s1]): chunk c words 0-1 sc_a, 2-3 sc_b of group (s0, c), 4-5 sc_a, 6-7 sc_b of group
 * (s1, c), as indices into the words sc_a 0-7, mn_a 8-15, sc_b 16-23, mn_b 24-31. */
static inline __m512i kq_lvl2_idx(int s0, int s1) {
    int16_t w[32];
    for (int c = 0; c < 4; c++)
        for (int i = 0; i < 8; i++) {
            const int s = i < 4 ? s0 : s1, row = (i / 2) % 2;
            w[8 * c + i] = (int16_t)(16 * row + kq_q4_group(s, c));
        }
    return _mm512_loadu_si512((const void *)w);
}

/* The first 16 bytes of two q4_k / q5_k blocks (ba, bb: d, dmin, the 12 scale bytes),
 * decoded side by side on 256 bits (a lone row passes its block twice): scw the 6-bit
 * scales (kq_scale_min6) as kq_q45_isums' scale words for steps 0, 1 and 2, 3; in its
 * lanes 2g + row mn16 the mins, zero-extended, and d16, dmin16 the rows' d and dmin.
 * Per 128-bit lane, with a, b, c the three scale words (dwords 1-3): sc0-3 = a & 63,
 * sc4-7 = (c & 15) | (a >> 6) << 4, mn0-3 = b & 63, mn4-7 = (c >> 4 & 15) | (b >> 6) << 4,
 * per byte. */
static inline void kq_q45_heads(const uint8_t *ba, const uint8_t *bb, __m512i scw[2], __m512i *mn16, __m512 *d16,
                                __m512 *dmin16) {
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)ba)),
                                              _mm_loadu_si128((const __m128i *)bb), 1);
    const __m256i acbc = _mm256_shuffle_epi32(v, _MM_SHUFFLE(3, 2, 3, 1));
    const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(acbc, _mm256_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4)),
                                        _mm256_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F,
                                                          0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi32(_mm256_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 1, 1)), 2),
                                        _mm256_setr_epi32(0, 0x30303030, 0, 0x30303030, 0, 0x30303030, 0, 0x30303030));
    const __m256i sm = _mm256_or_si256(lo, hi); /* sc_a, mn_a | sc_b, mn_b */
    const __m512i sw = _mm512_cvtepu8_epi16(sm); /* words: sc_a 0-7, mn_a 8-15, sc_b 16-23, mn_b 24-31 */
    scw[0] = _mm512_permutexvar_epi16(kq_lvl2_idx(0, 1), sw);
    scw[1] = _mm512_permutexvar_epi16(kq_lvl2_idx(2, 3), sw);
    static const int16_t mn_idx[32] = {8, 0, 24, 0, 9, 0, 25, 0, 10, 0, 26, 0, 11, 0, 27, 0,
                                       12, 0, 28, 0, 13, 0, 29, 0, 14, 0, 30, 0, 15, 0, 31, 0};
    *mn16 = _mm512_maskz_permutexvar_epi16(0x55555555u, _mm512_loadu_si512((const void *)mn_idx), sw);
    /* F16C converts every value exactly, as cq_h2f does: d_a, dmin_a, d_b, dmin_b */
    const __m128 dm = _mm_cvtph_ps(_mm256_castsi256_si128(_mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4))));
    const __m512 dm4 = _mm512_castps128_ps512(dm);
    *d16 = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2), dm4);
    *dmin16 = _mm512_permutexvar_ps(_mm512_setr_epi32(1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3), dm4);
}

/* Row r (0 or 1) of a two-row accumulator (lane 2g + row) as the eight lanes of
 * kq_ref_i8_row, in group order. */
static inline __m256 kq_row_lanes(__m512 acc, int r) {
    const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14),
                                         _mm512_set1_epi32(r));
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, acc));
}

/* x's side of a q4_k / q5_k block in the lanes 2g + row of kq_q45_isums: its group sums
 * (each the per-half sums bias[16b + 2g + h] added to their neighbour, so both lanes of
 * a group hold it) and its eight d_g, each twice. */
static inline __m512i kq_xsum_pairs(const cq_xq *xq, size_t b) {
    const __m512i hs = _mm512_load_si512((const void *)(xq->bias + 16 * b));
    return _mm512_add_epi32(hs, _mm512_shuffle_epi32(hs, _MM_PERM_CDAB));
}
static inline __m512 kq_dg_pairs(const cq_xq *xq, size_t b) {
    const __m512i dup8 = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    return _mm512_permutexvar_ps(dup8, _mm512_castps256_ps512(_mm256_load_ps(xq->d + 8 * b)));
}

/* q6_k's x side: block b's sixteen 16-weight xq sums (CQ_XQ_G32's per-half sums,
 * |.| <= 16 * 127) as int16 words, in both 256-bit halves (one for each row of a pair). */
static inline __m512i kq_xs_words(const cq_xq *xq, size_t b) {
    const __m256i w = _mm512_cvtepi32_epi16(_mm512_load_si512((const void *)(xq->bias + 16 * b)));
    return _mm512_inserti64x4(_mm512_castsi256_si512(w), w, 1);
}

/* The same x side prepared once for a call's rows (every row pair of a block meets the
 * same x; forming it per pair cost about a tenth of the q4_k row's time, in cache): per
 * block KQ_PREP_BLOCK bytes, the four steps' xq vectors as the tile pairs them, then
 * kq_xsum_pairs, then kq_dg_pairs (q6_k: 64 bytes a block, kq_xs_words; iq4_xs: its
 * own step vectors, offsets and d_g, kq_iq4_prep). Rows up to KQ_PREP_MAX_BLOCKS blocks (16384 columns;
 * the 24 KiB buffer is on the stack, which must stay small for threads with little stack,
 * as musl's 128 KiB default) take it; wider ones form x's side per pair, with the same
 * values. */
#define KQ_PREP_BLOCK 384
#define KQ_PREP_MAX_BLOCKS 64
static void kq_x45_prep(const cq_xq *xq, size_t nb, uint8_t *out) {
    for (size_t b = 0; b < nb; b++) {
        uint8_t *o = out + KQ_PREP_BLOCK * b;
        for (int h = 0; h < 2; h++) {
            const __m512i a = _mm512_load_si512((const void *)(xq->q + 256 * b + 128 * h));
            const __m512i c = _mm512_load_si512((const void *)(xq->q + 256 * b + 128 * h + 64));
            _mm512_store_si512((void *)(o + 128 * h), _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(1, 0, 1, 0)));
            _mm512_store_si512((void *)(o + 128 * h + 64), _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(3, 2, 3, 2)));
        }
        _mm512_store_si512((void *)(o + 256), kq_xsum_pairs(xq, b));
        _mm512_store_ps((void *)(o + 320), kq_dg_pairs(xq, b));
    }
}

/* The bit moves of the tiles' weight unpacking, per byte: KQ_HI4 a byte's high nibble
 * as its low one (q4_k, q5_k); KQ_F01 / KQ_F23 q6_k's 2-bit fields s (of a qh vector
 * broadcast to both 256-bit halves: s = 0 | 1, 2 | 3) to bits 4-5, the rest zero. */
#define KQ_HI4(v) _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F))
#define KQ_F01(H) _mm512_and_si512(_mm512_sllv_epi64(H, _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2)), _mm512_set1_epi8(0x30))
#define KQ_F23(H) _mm512_and_si512(_mm512_srlv_epi64(H, _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2)), _mm512_set1_epi8(0x30))

/* q4_k (Q5 = 0) and q5_k (Q5 = 1): a tile of R (1 or 2) rows from r by J (1..4) inputs
 * xqs[j], row k of input j to Y[j * ldy + k]. qs bytes 32i + k hold weight 64i + k (low
 * nibble, group 2i) and 64i + 32 + k (high, group 2i + 1): a 64-byte load's low nibbles
 * are groups 0 and 2 (4 and 6), its high ones 1 and 3 (5 and 7), met by x's groups
 * paired the same way (x's side). q5_k's fifth bit of weight 32g + k is bit g of qh[k]:
 * a 64-bit rotate brings bit g of every byte to bit 4. The weights of a block are
 * unpacked once for the J inputs; each input's operations are those of J = 1. The
 * group isums come scaled from the tree (kq_q45_isums, lanes 2g + row), the mins
 * zero-extended in that order, msum = mn * xsum by vpmulld (exact), x's group sums are
 * its per-half sums added to their neighbour, and then per group, as the spec:
 * d_g * (d * isum - dmin * msum) into lane g. */
#define KQ_Q45K_TILE(DOT, Q5, R, J, P)                                                             \
    const size_t nb = m->cols / CQ_KQ_BLOCK, bb = (Q5) ? 176 : 144;                                  \
    const uint8_t *rows = m->data + r * nb * bb;                                                     \
    const __m512i m0f = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10), zero = _mm512_setzero_si512(); \
    const __m512i ones = _mm512_set1_epi16(1);                                                       \
    __m512 acc[J];                                                                                   \
    KQ_UNROLL for (int j = 0; j < (J); j++) acc[j] = _mm512_setzero_ps();                            \
    for (size_t b = 0; b < nb; b++) {                                                                \
        __m512i w[2][4], scw2[2], mn16;                                                              \
        __m512 d16, dmin16;                                                                          \
        kq_q45_heads(rows + b * bb, rows + (((R) - 1) * nb + b) * bb, scw2, &mn16, &d16, &dmin16);  \
        KQ_UNROLL for (int k = 0; k < (R); k++) {                                                    \
            const uint8_t *blk = rows + (k * nb + b) * bb;                                           \
            kq_pf(blk, bb);                                                                          \
            const uint8_t *qs = blk + ((Q5) ? 48 : 16);                                              \
            __m512i qh = zero;                                                                       \
            if (Q5) qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)));   \
            KQ_UNROLL for (int h = 0; h < 2; h++) {                                                  \
                const __m512i v = _mm512_loadu_si512((const void *)(qs + 64 * h));                   \
                __m512i lo = _mm512_and_si512(v, m0f), hi = KQ_HI4(v); \
                if (Q5) { /* groups (4h, 4h+2) in lo, (4h+1, 4h+3) in hi: bit g to bit 4 */          \
                    const long long g = 4 * h;                                                       \
                    const __m512i rl = _mm512_setr_epi64(4 - g, 4 - g, 4 - g, 4 - g, (66 - g) & 63, (66 - g) & 63, \
                                                         (66 - g) & 63, (66 - g) & 63);              \
                    lo = _mm512_ternarylogic_epi32(lo, _mm512_rolv_epi64(qh, rl), m10, 0xF8);       \
                    hi = _mm512_ternarylogic_epi32(hi, _mm512_rolv_epi64(qh, _mm512_sub_epi64(rl, _mm512_set1_epi64(1))), \
                                                   m10, 0xF8);                                       \
                }                                                                                    \
                w[k][2 * h] = lo, w[k][2 * h + 1] = hi;                                              \
            }                                                                                        \
        }                                                                                            \
        KQ_UNROLL for (int j = 0; j < (J); j++) {                                                    \
            const cq_xq *xq = xqs[j];                                                                \
            const uint8_t *xpb = (P) ? xprep + KQ_PREP_BLOCK * b : NULL;                             \
            __m512i xv[4], y[2][4], xsum;                                                            \
            __m512 dg;                                                                               \
            if (P) {                                                                                 \
                KQ_UNROLL for (int t = 0; t < 4; t++) xv[t] = _mm512_load_si512((const void *)(xpb + 64 * t)); \
                xsum = _mm512_load_si512((const void *)(xpb + 256));                                 \
                dg = _mm512_load_ps((const void *)(xpb + 320));                                      \
            } else {                                                                                 \
                KQ_UNROLL for (int h = 0; h < 2; h++) {                                              \
                    const __m512i a = _mm512_load_si512((const void *)(xq->q + 256 * b + 128 * h)); \
                    const __m512i c = _mm512_load_si512((const void *)(xq->q + 256 * b + 128 * h + 64)); \
                    xv[2 * h] = _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(1, 0, 1, 0));                 \
                    xv[2 * h + 1] = _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(3, 2, 3, 2));             \
                }                                                                                    \
                xsum = kq_xsum_pairs(xq, b);                                                         \
                dg = kq_dg_pairs(xq, b);                                                             \
            }                                                                                        \
            KQ_UNROLL for (int k = 0; k < (R); k++)                                                  \
                KQ_UNROLL for (int s = 0; s < 4; s++) y[k][s] = DOT(zero, w[k][s], xv[s]);           \
            const __m512 isum = _mm512_cvtepi32_ps(kq_q45_isums(y[0], y[(R) - 1], ones, scw2));      \
            const __m512 msum = _mm512_cvtepi32_ps(_mm512_mullo_epi32(mn16, xsum));                  \
            acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(dg, _mm512_sub_ps(_mm512_mul_ps(d16, isum), _mm512_mul_ps(dmin16, msum)))); \
        }                                                                                            \
    }                                                                                                \
    KQ_UNROLL for (int j = 0; j < (J); j++) {                                                        \
        Y[j * ldy] = kq_lanes8_sum(kq_row_lanes(acc[j], 0));                                         \
        if ((R) == 2) Y[j * ldy + 1] = kq_lanes8_sum(kq_row_lanes(acc[j], 1));                       \
    }

/* q6_k, a tile as KQ_Q45K_TILE's (P = 1: x's side from kq_i8_rows' prepared words):
 * per half h of a block, ql's 64 bytes give the low nibbles of weights 128h + 0..63 and
 * the high ones of 128h + 64..127; qh's 32 bytes give bits 4-5 of weights 128h + 32s + k
 * at (qh[k] >> 2s) & 3. The steps meet xq with u = q + 32 (0..63; a lane's 4-weight sum
 * <= 63 * 127 * 4 still fits int16), scaled per 16 weights into the group sums of u; the
 * offset then comes off per group, for both rows by one vpmaddwd: the two rows' 16
 * scales times 32 as words (|.| <= 4096) against x's 16-weight sums (kq_xs_words),
 * 32 * (sc_a * xs_a + sc_b * xs_b). Exact integers, the spec's isum; per group
 * (d * d_g) * isum. */
#define KQ_Q6K_TILE(DOT, R, J, P)                                                                    \
    const size_t nb = m->cols / CQ_KQ_BLOCK;                                                         \
    const uint8_t *rows = m->data + r * nb * 210;                                                    \
    const __m512i m0f = _mm512_set1_epi8(0x0F);                                                      \
    const __m512i zero = _mm512_setzero_si512();                                                     \
    const __m512i i01 = kq_sc_idx(1, 0, 1), i23 = kq_sc_idx(1, 2, 3), perm = kq_group_perm(1);      \
    const __m512i i01b = _mm512_add_epi16(i01, _mm512_set1_epi16(16)), i23b = _mm512_add_epi16(i23, _mm512_set1_epi16(16)); \
    const __m512i lo8 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);          \
    __m512 acc[J];                                                                                   \
    KQ_UNROLL for (int j = 0; j < (J); j++) acc[j] = _mm512_setzero_ps();                            \
    for (size_t b = 0; b < nb; b++) {                                                                \
        __m512i w[2][4], s01[2], s23[2];                                                             \
        __m128 d[2];                                                                                 \
        /* the two rows' 16 scales as words, row a's then row b's (a lone row's twice) */          \
        const __m512i scw = _mm512_cvtepi8_epi16(_mm256_inserti128_si256(                            \
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(rows + b * 210 + 192))),         \
            _mm_loadu_si128((const __m128i *)(rows + (((R) - 1) * nb + b) * 210 + 192)), 1));         \
        KQ_UNROLL for (int k = 0; k < (R); k++) {                                                    \
            const uint8_t *blk = rows + (k * nb + b) * 210;                                          \
            kq_pf(blk, 210);                                                                         \
            d[k] = kq_h2f_1(blk + 208);                                                              \
            s01[k] = _mm512_permutexvar_epi16(k ? i01b : i01, scw), s23[k] = _mm512_permutexvar_epi16(k ? i23b : i23, scw); \
            KQ_UNROLL for (int h = 0; h < 2; h++) {                                                  \
                const __m512i L = _mm512_loadu_si512((const void *)(blk + 64 * h));                  \
                const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h))); \
                w[k][2 * h] = _mm512_ternarylogic_epi32(L, m0f, KQ_F01(H), 0xEA); \
                w[k][2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(L, 4), m0f, KQ_F23(H), 0xEA); \
            }                                                                                        \
        }                                                                                            \
        if ((R) == 1) d[1] = d[0];                                                                   \
        const __m512 dd = _mm512_permutexvar_ps(lo8, _mm512_castps128_ps512(_mm_unpacklo_ps(d[0], d[1]))); \
        const __m512i sc32 = _mm512_slli_epi16(scw, 5);                                              \
        KQ_UNROLL for (int j = 0; j < (J); j++) {                                                    \
            const cq_xq *xq = xqs[j];                                                                \
            __m512i xv[4], q[2];                                                                     \
            KQ_UNROLL for (int t = 0; t < 4; t++) xv[t] = _mm512_load_si512((const void *)(xq->q + 256 * b + 64 * t)); \
            KQ_UNROLL for (int k = 0; k < (R); k++)                                                  \
                q[k] = kq_scaled_chunks(DOT(zero, w[k][0], xv[0]), DOT(zero, w[k][1], xv[1]),        \
                                        DOT(zero, w[k][2], xv[2]), DOT(zero, w[k][3], xv[3]), s01[k], s23[k]); \
            if ((R) == 1) q[1] = q[0];                                                               \
            const __m512i xsw = (P) ? _mm512_load_si512((const void *)(xprep + 64 * b)) : kq_xs_words(xq, b); \
            const __m512 isum = _mm512_cvtepi32_ps(                                                  \
                _mm512_sub_epi32(kq_group_isums(q[0], q[1], perm), _mm512_madd_epi16(sc32, xsw)));   \
            const __m512 dg = _mm512_castsi512_ps(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xq->d + 8 * b)))); \
            acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(_mm512_mul_ps(dd, dg), isum));              \
        }                                                                                            \
    }                                                                                                \
    KQ_UNROLL for (int j = 0; j < (J); j++) {                                                        \
        Y[j * ldy] = kq_lanes8_sum(_mm512_castps512_ps256(acc[j]));                                  \
        if ((R) == 2) Y[j * ldy + 1] = kq_lanes8_sum(_mm512_extractf32x8_ps(acc[j], 1));             \
    }

/* iq4_xs: block bytes d (f16), scales_h (u16), scales_l[4], qs[128]; qs bytes 16g + k
 * hold weight k of group g (low nibble) and weight 16 + k (high), each a code of the 16
 * levels KQ_IQ4_LEVELS (-127..113); group g's scale is ((scales_l[g / 2] >> 4 (g & 1))
 * & 15 | ((scales_h >> 2g) & 3) << 4) - 32, one per 32 weights. A 64-byte load of qs
 * (half h of a block) holds groups 4h..4h+3 in its four 128-bit chunks, so its low
 * nibbles are the groups' first halves and its high nibbles their second halves; x's
 * side meets them with xq's chunks paired the same way (the 16 first, then the 16 last
 * bytes of each group, kq_iq4_xv). The products, per variant:
 *   vpdpbusd (KQ_IQ4_SGN 0): the levels looked up (vpshufb) as u = level + 128 (1..241,
 *     u8), so a group's sum of u * xq is sum q * xq + 128 * (its xq sum); that offset
 *     comes off per group (x's side, from xq's per-half sums), as q6_k's does;
 *   vpmaddubsw (KQ_IQ4_SGN 1): u8 up to 241 times xq 127 would overflow the int16 pair
 *     sums, so the lookup gives |level| (<= 127) and xq takes the level's sign (levels
 *     0..7 are the negative ones: a byte mask per step, xq negated under it by a masked
 *     subtraction from zero; xq is never -128), pairs <= 2 * 127 * 127, no offset.
 * Both give the spec's exact sum q * xq per group; with the scale (vpmulld, |isum| <=
 * 32 * 32 * 127 * 127 < 2^24) that is kq_ref_i8_row's isum, and per group, as the spec:
 * (d * d_g) * isum into lane g. Lanes: lane 4c + k holds row k / 2's group c + 4 (k & 1)
 * (kq_iq4_lane_group), so two rows share every vector and a lone row runs the same
 * lanes as row a of a pair. */

/* Group of lane l of the iq4_xs tile's vectors, and the row (0, 1) it belongs to. */
static inline int kq_iq4_lane_group(int l) { return l / 4 + 4 * (l & 1); }
static inline int kq_iq4_lane_row(int l) { return (l & 3) >> 1; }
/* A vector of 16 dwords: lane l = a * group + b * row + c. */
static inline __m512i kq_iq4_idx(int a, int b, int c) {
    int32_t p[16];
    for (int l = 0; l < 16; l++) p[l] = a * kq_iq4_lane_group(l) + b * kq_iq4_lane_row(l) + c;
    return _mm512_loadu_si512((const void *)p);
}

/* The 8-byte heads of two iq4_xs blocks (ba, bb; a lone row passes its block twice) as
 * the tile's lanes: sc the group scales (int32), dd the rows' d. The head's dwords:
 * d | scales_h << 16, scales_l; group g's scale bits are bits 4g..4g+3 of scales_l and
 * bits 2g, 2g + 1 of scales_h (bits 16 + 2g.. of the first dword). */
static inline void kq_iq4_heads(const uint8_t *ba, const uint8_t *bb, __m512i *sc, __m512 *dd) {
    const __m128i hd = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)ba), _mm_loadl_epi64((const __m128i *)bb));
    const __m512i h = _mm512_castsi128_si512(hd);
    const __m512i lo = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(kq_iq4_idx(0, 2, 1), h), kq_iq4_idx(4, 0, 0)),
                                        _mm512_set1_epi32(15));
    const __m512i hi = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(kq_iq4_idx(0, 2, 0), h), kq_iq4_idx(2, 0, 12)),
                                        _mm512_set1_epi32(0x30));
    *sc = _mm512_sub_epi32(_mm512_or_si512(lo, hi), _mm512_set1_epi32(32));
    /* F16C converts every value exactly, as cq_h2f does: d_a, ., d_b, . */
    const __m128 f = _mm_cvtph_ps(_mm_shuffle_epi32(hd, _MM_SHUFFLE(2, 0, 2, 0)));
    *dd = _mm512_permutexvar_ps(kq_iq4_idx(0, 2, 0), _mm512_castps128_ps512(f));
}

/* x's side of an iq4_xs block in the tile's lanes: the four steps' xq vectors (step 2h:
 * the first 16 bytes of groups 4h..4h+3, step 2h + 1 their last 16), the offset 128 *
 * (group xq sum) and d_g. */
static inline void kq_iq4_xv(const cq_xq *xq, size_t b, __m512i xv[4]) {
    for (int h = 0; h < 2; h++) {
        const __m512i a = _mm512_load_si512((const void *)(xq->q + 256 * b + 128 * h));
        const __m512i c = _mm512_load_si512((const void *)(xq->q + 256 * b + 128 * h + 64));
        xv[2 * h] = _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(2, 0, 2, 0));
        xv[2 * h + 1] = _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(3, 1, 3, 1));
    }
}
static inline __m512i kq_iq4_xoff(const cq_xq *xq, size_t b) {
    return _mm512_slli_epi32(_mm512_permutexvar_epi32(kq_iq4_idx(2, 0, 0), kq_xsum_pairs(xq, b)), 7);
}
static inline __m512 kq_iq4_dg(const cq_xq *xq, size_t b) {
    return _mm512_permutexvar_ps(kq_iq4_idx(1, 0, 0), _mm512_castps256_ps512(_mm256_load_ps(xq->d + 8 * b)));
}
/* The same prepared once for a call's rows: per block KQ_PREP_BLOCK bytes, the four
 * step vectors, then kq_iq4_xoff, then kq_iq4_dg. */
static void kq_iq4_prep(const cq_xq *xq, size_t nb, uint8_t *out) {
    for (size_t b = 0; b < nb; b++) {
        uint8_t *o = out + KQ_PREP_BLOCK * b;
        __m512i xv[4];
        kq_iq4_xv(xq, b, xv);
        for (int t = 0; t < 4; t++) _mm512_store_si512((void *)(o + 64 * t), xv[t]);
        _mm512_store_si512((void *)(o + 256), kq_iq4_xoff(xq, b));
        _mm512_store_ps((void *)(o + 320), kq_iq4_dg(xq, b));
    }
}

/* Four vectors of 4-weight sums (a, b: row a's halves h = 0, 1; c, e: row b's; chunk c
 * of half h is group 4h + c) as the lanes' group sums: lane 4c + k the sum of chunk c
 * of the k-th vector. Exact int32 adds (unpacks, then adds). */
static inline __m512i kq_iq4_sums(__m512i a, __m512i b, __m512i c, __m512i e) {
    const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    const __m512i ce = _mm512_add_epi32(_mm512_unpacklo_epi32(c, e), _mm512_unpackhi_epi32(c, e));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(ab, ce), _mm512_unpackhi_epi64(ab, ce));
}

/* Row r (0 or 1) of an iq4_xs accumulator as the eight lanes of kq_ref_i8_row, in group
 * order. */
static inline __m256 kq_iq4_row_lanes(__m512 acc, int r) {
    const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 4, 8, 12, 1, 5, 9, 13),
                                         _mm512_set1_epi32(2 * r));
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, acc));
}

/* The iq4_xs tile, as KQ_Q45K_TILE's (P = 1: x's side from kq_iq4_prep); KQ_IQ4_SGN
 * (defined before each KQ_TILES) picks the product, as above. */
#define KQ_IQ4_TILE(DOT, R, J, P)                                                                    \
    const size_t nb = m->cols / CQ_KQ_BLOCK;                                                         \
    const uint8_t *rows = m->data + r * nb * 136;                                                    \
    const __m512i m0f = _mm512_set1_epi8(0x0F), zero = _mm512_setzero_si512();                       \
    const __m512i lut = _mm512_broadcast_i32x4(KQ_IQ4_SGN ? _mm_abs_epi8(_mm_loadu_si128((const __m128i *)KQ_IQ4_LEVELS)) \
                                               : _mm_xor_si128(_mm_loadu_si128((const __m128i *)KQ_IQ4_LEVELS), \
                                                               _mm_set1_epi8((char)0x80)));          \
    __m512 acc[J];                                                                                   \
    KQ_UNROLL for (int j = 0; j < (J); j++) acc[j] = _mm512_setzero_ps();                            \
    for (size_t b = 0; b < nb; b++) {                                                                \
        __m512i w[2][4], sc;                                                                         \
        __mmask64 ng[2][4];                                                                          \
        __m512 dd;                                                                                   \
        kq_iq4_heads(rows + b * 136, rows + (((R) - 1) * nb + b) * 136, &sc, &dd);                   \
        KQ_UNROLL for (int k = 0; k < (R); k++) {                                                    \
            const uint8_t *blk = rows + (k * nb + b) * 136;                                          \
            kq_pf(blk, 136);                                                                         \
            KQ_UNROLL for (int h = 0; h < 2; h++) {                                                  \
                const __m512i v = _mm512_loadu_si512((const void *)(blk + 8 + 64 * h));              \
                const __m512i lo = _mm512_and_si512(v, m0f), hi = KQ_HI4(v);                         \
                w[k][2 * h] = _mm512_shuffle_epi8(lut, lo), w[k][2 * h + 1] = _mm512_shuffle_epi8(lut, hi); \
                if (KQ_IQ4_SGN) { /* codes 0..7: the negative levels */                              \
                    ng[k][2 * h] = _mm512_testn_epi8_mask(lo, _mm512_set1_epi8(8));                  \
                    ng[k][2 * h + 1] = _mm512_testn_epi8_mask(hi, _mm512_set1_epi8(8));              \
                } else {                                                                             \
                    ng[k][2 * h] = ng[k][2 * h + 1] = 0;                                             \
                }                                                                                    \
            }                                                                                        \
        }                                                                                            \
        KQ_UNROLL for (int j = 0; j < (J); j++) {                                                    \
            const cq_xq *xq = xqs[j];                                                                \
            const uint8_t *xpb = (P) ? xprep + KQ_PREP_BLOCK * b : NULL;                             \
            __m512i xv[4], y[2][2], off = zero;                                                      \
            __m512 dg;                                                                               \
            if (P) {                                                                                 \
                KQ_UNROLL for (int t = 0; t < 4; t++) xv[t] = _mm512_load_si512((const void *)(xpb + 64 * t)); \
                if (!KQ_IQ4_SGN) off = _mm512_load_si512((const void *)(xpb + 256));                 \
                dg = _mm512_load_ps((const void *)(xpb + 320));                                      \
            } else {                                                                                 \
                kq_iq4_xv(xq, b, xv);                                                                \
                if (!KQ_IQ4_SGN) off = kq_iq4_xoff(xq, b);                                           \
                dg = kq_iq4_dg(xq, b);                                                               \
            }                                                                                        \
            KQ_UNROLL for (int k = 0; k < (R); k++)                                                  \
                KQ_UNROLL for (int h = 0; h < 2; h++) {                                              \
                    __m512i x0 = xv[2 * h], x1 = xv[2 * h + 1];                                      \
                    if (KQ_IQ4_SGN) {                                                                \
                        x0 = _mm512_mask_sub_epi8(x0, ng[k][2 * h], zero, x0);                       \
                        x1 = _mm512_mask_sub_epi8(x1, ng[k][2 * h + 1], zero, x1);                   \
                    }                                                                                \
                    y[k][h] = DOT(DOT(zero, w[k][2 * h], x0), w[k][2 * h + 1], x1);                   \
                }                                                                                    \
            if ((R) == 1) y[1][0] = y[0][0], y[1][1] = y[0][1];                                      \
            const __m512i s = kq_iq4_sums(y[0][0], y[0][1], y[1][0], y[1][1]);                       \
            const __m512 isum = _mm512_cvtepi32_ps(_mm512_mullo_epi32(KQ_IQ4_SGN ? s : _mm512_sub_epi32(s, off), sc)); \
            acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(_mm512_mul_ps(dd, dg), isum));              \
        }                                                                                            \
    }                                                                                                \
    KQ_UNROLL for (int j = 0; j < (J); j++) {                                                        \
        Y[j * ldy] = kq_lanes8_sum(kq_iq4_row_lanes(acc[j], 0));                                     \
        if ((R) == 2) Y[j * ldy + 1] = kq_lanes8_sum(kq_iq4_row_lanes(acc[j], 1));                   \
    }

typedef void (*kq_tile_fn)(const cq_qmat *, size_t, const cq_xq *const *, const uint8_t *, float *, size_t);
#define KQ_Q4K_TILE(DOT, R, J) KQ_Q45K_TILE(DOT, 0, R, J, 0)
#define KQ_Q5K_TILE(DOT, R, J) KQ_Q45K_TILE(DOT, 1, R, J, 0)
#define KQ_Q4KP_TILE(DOT, R, J) KQ_Q45K_TILE(DOT, 0, R, J, 1)
#define KQ_Q6KN_TILE(DOT, R, J) KQ_Q6K_TILE(DOT, R, J, 0)
#define KQ_Q6KP_TILE(DOT, R, J) KQ_Q6K_TILE(DOT, R, J, 1)
#define KQ_Q5KP_TILE(DOT, R, J) KQ_Q45K_TILE(DOT, 1, R, J, 1)
#define KQ_IQ4N_TILE(DOT, R, J) KQ_IQ4_TILE(DOT, R, J, 0)
#define KQ_IQ4P_TILE(DOT, R, J) KQ_IQ4_TILE(DOT, R, J, 1)
#define KQ_TILE_FN(SUF, DOT, ATTR, NAME, BODY, R, J)                                                 \
    ATTR static void NAME##_##R##J##_##SUF(const cq_qmat *m, size_t r, const cq_xq *const *xqs, const uint8_t *xprep, \
                                           float *Y, size_t ldy) {                                   \
        (void)xprep;                                                                                 \
        BODY(DOT, R, J)                                                                              \
    }
#define KQ_TILE_FNS8(SUF, DOT, ATTR, NAME, BODY)                                                     \
    KQ_TILE_FN(SUF, DOT, ATTR, NAME, BODY, 1, 1) KQ_TILE_FN(SUF, DOT, ATTR, NAME, BODY, 1, 2)        \
    KQ_TILE_FN(SUF, DOT, ATTR, NAME, BODY, 1, 3) KQ_TILE_FN(SUF, DOT, ATTR, NAME, BODY, 1, 4)        \
    KQ_TILE_FN(SUF, DOT, ATTR, NAME, BODY, 2, 1) KQ_TILE_FN(SUF, DOT, ATTR, NAME, BODY, 2, 2)        \
    KQ_TILE_FN(SUF, DOT, ATTR, NAME, BODY, 2, 3) KQ_TILE_FN(SUF, DOT, ATTR, NAME, BODY, 2, 4)
#define KQ_TILE_TABLE(NAME, SUF)                                                                     \
    {{NAME##_11_##SUF, NAME##_12_##SUF, NAME##_13_##SUF, NAME##_14_##SUF},                          \
     {NAME##_21_##SUF, NAME##_22_##SUF, NAME##_23_##SUF, NAME##_24_##SUF}}
/* Every tile of a DOT: [dtype: q4_k, q5_k, q6_k, iq4_xs][R - 1][J - 1]; and the
 * one-input tiles on a prepared x side, [dtype][R - 1]. */
#define KQ_TILES(SUF, DOT, ATTR)                                                                     \
    KQ_TILE_FNS8(SUF, DOT, ATTR, kq_q4k, KQ_Q4K_TILE)                                                \
    KQ_TILE_FNS8(SUF, DOT, ATTR, kq_q5k, KQ_Q5K_TILE)                                                \
    KQ_TILE_FNS8(SUF, DOT, ATTR, kq_q6k, KQ_Q6KN_TILE)                                               \
    KQ_TILE_FNS8(SUF, DOT, ATTR, kq_iq4, KQ_IQ4N_TILE)                                               \
    KQ_TILE_FN(SUF, DOT, ATTR, kq_iq4p, KQ_IQ4P_TILE, 1, 1) KQ_TILE_FN(SUF, DOT, ATTR, kq_iq4p, KQ_IQ4P_TILE, 2, 1) \
    KQ_TILE_FN(SUF, DOT, ATTR, kq_q6kp, KQ_Q6KP_TILE, 1, 1) KQ_TILE_FN(SUF, DOT, ATTR, kq_q6kp, KQ_Q6KP_TILE, 2, 1) \
    KQ_TILE_FN(SUF, DOT, ATTR, kq_q4kp, KQ_Q4KP_TILE, 1, 1) KQ_TILE_FN(SUF, DOT, ATTR, kq_q4kp, KQ_Q4KP_TILE, 2, 1) \
    KQ_TILE_FN(SUF, DOT, ATTR, kq_q5kp, KQ_Q5KP_TILE, 1, 1) KQ_TILE_FN(SUF, DOT, ATTR, kq_q5kp, KQ_Q5KP_TILE, 2, 1) \
    static const kq_tile_fn kq_tiles_##SUF[4][2][4] = {KQ_TILE_TABLE(kq_q4k, SUF), KQ_TILE_TABLE(kq_q5k, SUF), \
                                                       KQ_TILE_TABLE(kq_q6k, SUF), KQ_TILE_TABLE(kq_iq4, SUF)}; \
    static const kq_tile_fn kq_prep_tiles_##SUF[4][2] = {{kq_q4kp_11_##SUF, kq_q4kp_21_##SUF},       \
                                                         {kq_q5kp_11_##SUF, kq_q5kp_21_##SUF},       \
                                                         {kq_q6kp_11_##SUF, kq_q6kp_21_##SUF},       \
                                                         {kq_iq4p_11_##SUF, kq_iq4p_21_##SUF}};

#define KQ_IQ4_SGN 1
KQ_TILES(bw, dot_bw, )
#undef KQ_IQ4_SGN
#define KQ_IQ4_SGN 0
#ifdef CQ_HAVE_VNNI_FN
KQ_TILES(vnni, _mm512_dpbusd_epi32, __attribute__((target("avx512vnni"))))
/* With GFNI each of those bit moves is one affine byte transform (vgf2p8affineqb: output
 * bit i of a byte = the parity of the input byte AND byte 7 - i of the qword's matrix),
 * instead of a shift and a mask: the same bytes, one zmm operation fewer each. KQ_GF(s)
 * moves bits 2s, 2s + 1 to bits 4, 5; KQ_GF_HI4 bits 4-7 to 0-3. */
#define KQ_GF(s) ((long long)(((1ull << (2 * (s) + 1)) << 16) | ((1ull << (2 * (s))) << 24)))
#define KQ_GF_HI4 0x1020408000000000ll
#undef KQ_HI4
#undef KQ_F01
#undef KQ_F23
#define KQ_HI4(v) _mm512_gf2p8affine_epi64_epi8(v, _mm512_set1_epi64(KQ_GF_HI4), 0)
#define KQ_F01(H) \
    _mm512_gf2p8affine_epi64_epi8(H, _mm512_setr_epi64(KQ_GF(0), KQ_GF(0), KQ_GF(0), KQ_GF(0), KQ_GF(1), KQ_GF(1), KQ_GF(1), KQ_GF(1)), 0)
#define KQ_F23(H) \
    _mm512_gf2p8affine_epi64_epi8(H, _mm512_setr_epi64(KQ_GF(2), KQ_GF(2), KQ_GF(2), KQ_GF(2), KQ_GF(3), KQ_GF(3), KQ_GF(3), KQ_GF(3)), 0)
KQ_TILES(gfni, _mm512_dpbusd_epi32, __attribute__((target("avx512vnni,gfni"))))
#endif

/* The tiles of m's dtype for this CPU and its prepared-x tiles, NULL for the K-quants
 * without an integer kernel (q2_k, q3_k). */
static inline int kq_tile_index(int dtype) {
    switch (dtype) {
    case CQ_DT_GGML_Q4_K: return 0;
    case CQ_DT_GGML_Q5_K: return 1;
    case CQ_DT_GGML_Q6_K: return 2;
    case CQ_DT_GGML_IQ4_XS: return 3;
    default: return -1;
    }
}
static const kq_tile_fn (*kq_tiles_for(const cq_qmat *m))[4] {
    const int i = kq_tile_index(m->dtype);
    if (i < 0) return NULL;
#ifdef CQ_HAVE_VNNI_FN
    const uint32_t f = cq_cpu_features();
    if ((f & CQ_CPU_AVX512VNNI) && (f & CQ_CPU_GFNI)) return kq_tiles_gfni[i];
    if (f & CQ_CPU_AVX512VNNI) return kq_tiles_vnni[i];
#endif
    return kq_tiles_bw[i];
}
static const kq_tile_fn *kq_prep_tiles_for(const cq_qmat *m) {
    const int i = kq_tile_index(m->dtype);
    if (i < 0) return NULL;
#ifdef CQ_HAVE_VNNI_FN
    const uint32_t f = cq_cpu_features();
    if ((f & CQ_CPU_AVX512VNNI) && (f & CQ_CPU_GFNI)) return kq_prep_tiles_gfni[i];
    if (f & CQ_CPU_AVX512VNNI) return kq_prep_tiles_vnni[i];
#endif
    return kq_prep_tiles_bw[i];
}

static void kq_i8_rows(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *xq, float *out) {
    const kq_tile_fn(*tiles)[4] = kq_tiles_for(m);
    if (!tiles) {
        for (size_t j = 0; j < nr; j++) out[j] = kq_ref_i8_row(m, r0 + j, xq);
        return;
    }
    const size_t nb = m->cols / CQ_KQ_BLOCK;
    const kq_tile_fn *prep = nb <= KQ_PREP_MAX_BLOCKS ? kq_prep_tiles_for(m) : NULL;
    if (prep) {
        _Alignas(64) uint8_t xp[KQ_PREP_MAX_BLOCKS * KQ_PREP_BLOCK];
        if (m->dtype == CQ_DT_GGML_Q6_K)
            for (size_t b = 0; b < nb; b++) _mm512_store_si512((void *)(xp + 64 * b), kq_xs_words(xq, b));
        else if (m->dtype == CQ_DT_GGML_IQ4_XS)
            kq_iq4_prep(xq, nb, xp);
        else
            kq_x45_prep(xq, nb, xp);
        size_t j = 0;
        for (; j + 2 <= nr; j += 2) prep[1](m, r0 + j, &xq, xp, out + j, 0);
        if (j < nr) prep[0](m, r0 + j, &xq, xp, out + j, 0);
        return;
    }
    size_t j = 0;
    for (; j + 2 <= nr; j += 2) tiles[1][0](m, r0 + j, &xq, NULL, out + j, 0);
    if (j < nr) tiles[0][0](m, r0 + j, &xq, NULL, out + j, 0);
}

/* matvec_batch's rows (CQ_HAVE_I8_MULTI): inputs four at a time, rows two at a time. */
static int kq_multi_takes(const cq_qmat *m) { return kq_tiles_for(m) != NULL; }
static void kq_i8_rows_multi(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *const *xqs, size_t t, float *Y,
                             size_t ldy) {
    const kq_tile_fn(*tiles)[4] = kq_tiles_for(m);
    for (size_t j0 = 0; j0 < t; j0 += 4) {
        const size_t nj = t - j0 < 4 ? t - j0 : 4;
        size_t r = r0;
        for (; r + 2 <= r0 + nr; r += 2) tiles[1][nj - 1](m, r, xqs + j0, NULL, Y + j0 * ldy + r, ldy);
        if (r < r0 + nr) tiles[0][nj - 1](m, r, xqs + j0, NULL, Y + j0 * ldy + r, ldy);
    }
}
#endif
