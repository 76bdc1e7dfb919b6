/* ggml_kq_avx512.h -- AVX-512 int8-activation rows of the K-quants q4_k, q5_k and q6_k
 * (x in the CQ_XQ_G32 layout; spec: kq_ref_i8_row). The other K-quants, and the float32
 * path of all of them, are the scalar decoder's. Included by matvec_avx512.c.
 *
 * One 64-weight step meets 64 contiguous xq bytes: lanes 0-7 hold group 2i, lanes 8-15
 * group 2i + 1. Each lane's integer sum (4 weights) is exact; it is converted and
 * multiplied by its weight scale times d_g (xq's dl) in float. What depends on x alone
 * is formed once per block for all the rows that share it: the xq loads, the mins' group
 * sums (from xq's per-half sums, times d_g) and q6_k's offset (-32 * each lane's xq sum,
 * the start of the integer sums). Rows run two at a time; each row's operations are
 * those of the one-row code in the same order, so a row has the same bits whichever row
 * it is paired with (matvec, rows_dot, matvec_many and every thread count agree). VNNI
 * (vpdpbusd) where present, else vpmaddubsw + vpmaddwd: u8 weights <= 63 times xq <= 127
 * fit the int16 pair sums, so both give the same integers and the same bits. A row
 * equals kq_ref_i8_row up to the order of float additions. */
#ifndef CQ_GGML_KQ_AVX512_H
#define CQ_GGML_KQ_AVX512_H

/* The stream's prefetches for a block of n bytes at a: each line that starts inside it
 * (so consecutive blocks prefetch every line once). */
static inline void kq_pf(const uint8_t *a, size_t n) {
    const uintptr_t end = (uintptr_t)a + n;
    for (uintptr_t l = ((uintptr_t)a + 63) & ~(uintptr_t)63; l < end; l += 64) CQ_STREAM_PF((const uint8_t *)l);
}

/* q4_k / q5_k's 12 scale bytes as 16 bytes: sc[0..7], mn[0..7] (kq_scale_min6). */
static inline __m128i kq_scales16(const uint8_t *s) {
    uint32_t a, b, c;
    memcpy(&a, s, 4), memcpy(&b, s + 4, 4), memcpy(&c, s + 8, 4);
    const uint32_t lo6 = 0x3F3F3F3Fu, lo4 = 0x0F0F0F0Fu, top2 = 0x03030303u;
    const uint32_t sc03 = a & lo6, mn03 = b & lo6;
    const uint32_t sc47 = (c & lo4) | (((a >> 6) & top2) << 4);
    const uint32_t mn47 = ((c >> 4) & lo4) | (((b >> 6) & top2) << 4);
    return _mm_setr_epi32((int)sc03, (int)sc47, (int)mn03, (int)mn47);
}

/* lanes 0-7 -> 0, 8-15 -> 1: the two groups of a 64-weight step */
#define kq_half8 _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)

/* Block b's eight group sums of xq times their d_g (the mins' x side): the per-half sums
 * bias[16b + 2j + h] added in pairs (lane 2j of each 64-bit pair), narrowed, converted. */
static inline __m256 kq_xsum_d8(const cq_xq *xq, size_t b) {
    const __m512i hs = _mm512_load_si512((const void *)(xq->bias + 16 * b));
    const __m256i gs = _mm512_cvtepi64_epi32(_mm512_add_epi64(hs, _mm512_srli_epi64(hs, 32)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(gs), _mm256_loadu_ps(xq->d + 8 * b));
}

/* q4_k (Q5 = 0) and q5_k (Q5 = 1), R rows from r: step i of a block is qs bytes
 * 32i..32i+31, low nibbles weights 64i + 0..31 (group 2i), high ones 64i + 32..63
 * (group 2i + 1): one broadcast load shifted by 0 in the low half, 4 in the high.
 * q5_k's fifth bit of weight 32j + k is bit j of qh[k]: a 64-bit rotate brings bit 2i
 * (low half) or 2i + 1 (high half) of every byte to bit 4. Per lane:
 * isum * (d * sc_j) * d_g; per block, the eight groups' (-dmin * mn_j) * (xsum_g * d_g). */
#define KQ_Q45K_ROWS(DOT, Q5, R)                                                                   \
    const size_t nb = m->cols / CQ_KQ_BLOCK, bb = (Q5) ? 176 : 144;                                  \
    const uint8_t *rows = m->data + r * nb * bb;                                                     \
    const __m512i m0f = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10), zero = _mm512_setzero_si512(); \
    const __m512i nib_shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);                            \
    __m512 f[R];                                                                                     \
    __m256 fm[R];                                                                                    \
    for (int k = 0; k < (R); k++) f[k] = _mm512_setzero_ps(), fm[k] = _mm256_setzero_ps();          \
    for (size_t b = 0; b < nb; b++) {                                                                \
        __m512i xv[4];                                                                               \
        __m512 dl[4];                                                                                \
        for (int i = 0; i < 4; i++) {                                                                \
            xv[i] = _mm512_load_si512((const void *)(xq->q + 256 * b + 64 * i));                    \
            dl[i] = _mm512_load_ps(xq->dl + 64 * b + 16 * i);                                        \
        }                                                                                            \
        const __m256 xsd = kq_xsum_d8(xq, b);                                                        \
        for (int k = 0; k < (R); k++) {                                                              \
            const uint8_t *blk = rows + (k * nb + b) * bb;                                           \
            kq_pf(blk, bb);                                                                          \
            const __m512 dd = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(cq_h2f(cq_ld16(blk))),     \
                                                   _mm512_set1_ps(-cq_h2f(cq_ld16(blk + 2))));        \
            /* lanes 0-7: d * sc_j, 8-15: -dmin * mn_j */                                            \
            const __m512 wsm = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(kq_scales16(blk + 4))), dd); \
            fm[k] = _mm256_fmadd_ps(_mm512_extractf32x8_ps(wsm, 1), xsd, fm[k]);                     \
            const uint8_t *qs = blk + ((Q5) ? 48 : 16);                                              \
            __m512i qh = zero;                                                                       \
            if (Q5) qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)));   \
            for (int i = 0; i < 4; i++) {                                                            \
                __m512i u = _mm512_srlv_epi64(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * i))), \
                                              nib_shift);                                            \
                if (Q5) {                                                                            \
                    const __m512i rot = _mm512_setr_epi64(4 - 2 * i, 4 - 2 * i, 4 - 2 * i, 4 - 2 * i,  \
                                                          (67 - 2 * i) & 63, (67 - 2 * i) & 63,      \
                                                          (67 - 2 * i) & 63, (67 - 2 * i) & 63);     \
                    u = _mm512_ternarylogic_epi32(u, m0f, _mm512_and_si512(_mm512_rolv_epi64(qh, rot), m10), 0xEA); \
                } else                                                                               \
                    u = _mm512_and_si512(u, m0f);                                                    \
                const __m512i isum = DOT(zero, u, xv[i]);                                            \
                const __m512 ws = _mm512_permutexvar_ps(_mm512_add_epi32(kq_half8, _mm512_set1_epi32(2 * i)), wsm); \
                f[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(ws, dl[i]), f[k]);   \
            }                                                                                        \
        }                                                                                            \
    }                                                                                                \
    for (int k = 0; k < (R); k++) out[k] = _mm512_reduce_add_ps(_mm512_add_ps(f[k], _mm512_zextps256_ps512(fm[k])))

/* q6_k, R rows from r: per half h of a block, ql's 64 bytes give the low nibbles of
 * weights 128h + 0..63 and the high ones of 128h + 64..127; qh's 32 bytes give bits 4-5
 * of weights 128h + 32s + k at (qh[k] >> 2s) & 3. u = q + 32 (0..63) meets xq from a
 * start of -32 * the lane's xq sum (x's side, once per step for all R rows); each
 * 4-byte lane lies in one 16-weight sub-block, scaled by d * sc, times d_g. */
#define KQ_Q6K_ROWS(DOT, R)                                                                          \
    const size_t nb = m->cols / CQ_KQ_BLOCK;                                                         \
    const uint8_t *rows = m->data + r * nb * 210;                                                    \
    const __m512i m0f = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);                        \
    const __m512i c32 = _mm512_set1_epi8(32), zero = _mm512_setzero_si512();                         \
    const __m512i sh_lo = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2), sh_hi = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2); \
    const __m512i sub4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);          \
    __m512 f[R];                                                                                     \
    for (int k = 0; k < (R); k++) f[k] = _mm512_setzero_ps();                                        \
    for (size_t b = 0; b < nb; b++) {                                                                \
        __m512i xv[4], off[4];                                                                       \
        __m512 dl[4];                                                                                \
        for (int t = 0; t < 4; t++) {                                                                \
            xv[t] = _mm512_load_si512((const void *)(xq->q + 256 * b + 64 * t));                    \
            off[t] = _mm512_sub_epi32(zero, DOT(zero, c32, xv[t]));                                  \
            dl[t] = _mm512_load_ps(xq->dl + 64 * b + 16 * t);                                        \
        }                                                                                            \
        for (int k = 0; k < (R); k++) {                                                              \
            const uint8_t *blk = rows + (k * nb + b) * 210;                                          \
            kq_pf(blk, 210);                                                                         \
            const __m512 scf = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192)))), \
                                             _mm512_set1_ps(cq_h2f(cq_ld16(blk + 208))));            \
            for (int h = 0; h < 2; h++) {                                                            \
                const __m512i L = _mm512_loadu_si512((const void *)(blk + 64 * h));                  \
                const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h))); \
                const __m512i u01 = _mm512_ternarylogic_epi32(L, m0f, _mm512_and_si512(_mm512_sllv_epi64(H, sh_lo), m30), 0xEA); \
                const __m512i u23 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(L, 4), m0f,         \
                                                              _mm512_and_si512(_mm512_srlv_epi64(H, sh_hi), m30), 0xEA); \
                for (int v = 0; v < 2; v++) {                                                        \
                    const int t = 2 * h + v; /* the step: groups 2t, 2t + 1 of the block */          \
                    const __m512i isum = DOT(off[t], v ? u23 : u01, xv[t]);                          \
                    const __m512 sc = _mm512_permutexvar_ps(_mm512_add_epi32(sub4, _mm512_set1_epi32(4 * t)), scf); \
                    f[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(sc, dl[t]), f[k]); \
                }                                                                                    \
            }                                                                                        \
        }                                                                                            \
    }                                                                                                \
    for (int k = 0; k < (R); k++) out[k] = _mm512_reduce_add_ps(f[k])

#define KQ_ROW_FNS(SUF, DOT, ATTR)                                                                     \
    ATTR static void kq_q4k_rows1_##SUF(const cq_qmat *m, size_t r, const cq_xq *xq, float *out) { KQ_Q45K_ROWS(DOT, 0, 1); } \
    ATTR static void kq_q4k_rows2_##SUF(const cq_qmat *m, size_t r, const cq_xq *xq, float *out) { KQ_Q45K_ROWS(DOT, 0, 2); } \
    ATTR static void kq_q5k_rows1_##SUF(const cq_qmat *m, size_t r, const cq_xq *xq, float *out) { KQ_Q45K_ROWS(DOT, 1, 1); } \
    ATTR static void kq_q5k_rows2_##SUF(const cq_qmat *m, size_t r, const cq_xq *xq, float *out) { KQ_Q45K_ROWS(DOT, 1, 2); } \
    ATTR static void kq_q6k_rows1_##SUF(const cq_qmat *m, size_t r, const cq_xq *xq, float *out) { KQ_Q6K_ROWS(DOT, 1); }    \
    ATTR static void kq_q6k_rows2_##SUF(const cq_qmat *m, size_t r, const cq_xq *xq, float *out) { KQ_Q6K_ROWS(DOT, 2); }

KQ_ROW_FNS(bw, dot_bw, )
#ifdef CQ_HAVE_VNNI_FN
KQ_ROW_FNS(vnni, _mm512_dpbusd_epi32, __attribute__((target("avx512vnni"))))
#endif

typedef void (*kq_rows_fn)(const cq_qmat *, size_t, const cq_xq *, float *);

static void kq_i8_rows(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *xq, float *out) {
    kq_rows_fn one = NULL, two = NULL;
#ifdef CQ_HAVE_VNNI_FN
    const int vnni = (cq_cpu_features() & CQ_CPU_AVX512VNNI) != 0;
#else
    const int vnni = 0;
#endif
#define KQ_PICK(DT, NAME)                                                                              \
    if (m->dtype == (DT)) {                                                                            \
        one = vnni ? KQ_VNNI(NAME##_rows1) : NAME##_rows1_bw;                                          \
        two = vnni ? KQ_VNNI(NAME##_rows2) : NAME##_rows2_bw;                                          \
    }
#ifdef CQ_HAVE_VNNI_FN
#define KQ_VNNI(F) F##_vnni
#else
#define KQ_VNNI(F) F##_bw
#endif
    KQ_PICK(CQ_DT_Q4_K, kq_q4k)
    KQ_PICK(CQ_DT_Q5_K, kq_q5k)
    KQ_PICK(CQ_DT_Q6_K, kq_q6k)
#undef KQ_PICK
#undef KQ_VNNI
    if (!one) {
        for (size_t j = 0; j < nr; j++) out[j] = kq_ref_i8_row(m, r0 + j, xq);
        return;
    }
    size_t j = 0;
    for (; j + 2 <= nr; j += 2) two(m, r0 + j, xq, out + j);
    if (j < nr) one(m, r0 + j, xq, out + j);
}
#endif
