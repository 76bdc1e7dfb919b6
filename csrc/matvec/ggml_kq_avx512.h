/* ggml_kq_avx512.h -- AVX-512 int8-activation rows of the K-quants q4_k and q6_k (x
 * in the CQ_XQ_Q8 layout; spec: kq_ref_i8_row). The other K-quants, and the float32
 * path of all of them, are the scalar decoder's. Included by matvec_avx512.c.
 *
 * One 64-weight step meets 64 contiguous xq bytes: lanes 0-7 hold group 2i, lanes 8-15
 * group 2i + 1, like I8_Q8_BODY's. The integer sums per lane are the spec's integers
 * split over lanes, so a row equals kq_ref_i8_row up to the order of float additions.
 * VNNI (vpdpbusd) where present, else vpmaddubsw + vpmaddwd (u8 weights <= 63 times
 * xq <= 127 fit the int16 pair sums). */
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

/* q4_k: step i of a block is its qs bytes 32i..32i+31, low nibbles weights 64i + 0..31
 * (group 2i), high ones 64i + 32..63 (group 2i + 1): one broadcast load shifted by 0
 * in the low half, 4 in the high. Per lane: isum * d*sc*dl - xsum * dmin*mn*dl. */
#define KQ_Q4K_BODY(DOT)                                                                            \
    const size_t nb = m->cols / CQ_KQ_BLOCK;                                                         \
    const uint8_t *row = m->data + r * nb * 144;                                                     \
    const __m512i m0f = _mm512_set1_epi8(0x0F), ones = _mm512_set1_epi8(1), zero = _mm512_setzero_si512(); \
    const __m512i nib_shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);                            \
    __m512 f0 = _mm512_setzero_ps(), f1 = f0;                                                        \
    for (size_t b = 0; b < nb; b++) {                                                                \
        const uint8_t *blk = row + 144 * b;                                                          \
        kq_pf(blk, 144);                                                                 \
        const __m512 dd = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(cq_h2f(cq_ld16(blk))),         \
                                               _mm512_set1_ps(-cq_h2f(cq_ld16(blk + 2))));            \
        /* lanes 0-7: d * sc_j, 8-15: -dmin * mn_j */                                                \
        const __m512 wsm = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(kq_scales16(blk + 4))), dd); \
        const int8_t *xb = xq->q + 256 * b;                                                          \
        const float *dl = xq->dl + 64 * b;                                                           \
        for (int i = 0; i < 4; i++) {                                                                \
            const __m512i u = _mm512_and_si512(                                                     \
                _mm512_srlv_epi64(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * i))), nib_shift), \
                m0f);                                                                                \
            const __m512i xv = _mm512_load_si512((const void *)(xb + 64 * i));                      \
            const __m512i isum = DOT(zero, u, xv), xs = DOT(zero, ones, xv);                         \
            const __m512i idx = _mm512_add_epi32(kq_half8, _mm512_set1_epi32(2 * i));                \
            const __m512 d = _mm512_load_ps(dl + 16 * i);                                            \
            const __m512 ws = _mm512_mul_ps(_mm512_permutexvar_ps(idx, wsm), d);                     \
            const __m512 wm = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_add_epi32(idx, _mm512_set1_epi32(8)), wsm), d); \
            f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), ws, f0);                                  \
            f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(xs), wm, f1);                                    \
        }                                                                                            \
    }                                                                                                \
    return _mm512_reduce_add_ps(_mm512_add_ps(f0, f1))

/* q6_k: per half h of a block, ql's 64 bytes give the low nibbles of weights
 * 128h + 0..63 and the high ones of 128h + 64..127; qh's 32 bytes give bits 4-5 of
 * weights 128h + 32s + k at (qh[k] >> 2s) & 3. u = q + 32 (0..63) meets xq, and 32 * the
 * xq sums come off; each 4-byte lane lies in one 16-weight sub-block, scaled by d * sc. */
#define KQ_Q6K_BODY(DOT)                                                                            \
    const size_t nb = m->cols / CQ_KQ_BLOCK;                                                         \
    const uint8_t *row = m->data + r * nb * 210;                                                     \
    const __m512i m0f = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);                        \
    const __m512i c32 = _mm512_set1_epi8(32), zero = _mm512_setzero_si512();                         \
    const __m512i sh_lo = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2), sh_hi = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2); \
    const __m512i sub4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);          \
    __m512 f0 = _mm512_setzero_ps(), f1 = f0;                                                        \
    for (size_t b = 0; b < nb; b++) {                                                                \
        const uint8_t *blk = row + 210 * b;                                                          \
        kq_pf(blk, 210);                                                                 \
        const __m512 scf = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192)))), \
                                         _mm512_set1_ps(cq_h2f(cq_ld16(blk + 208))));                \
        const int8_t *xb = xq->q + 256 * b;                                                          \
        const float *dl = xq->dl + 64 * b;                                                           \
        for (int h = 0; h < 2; h++) {                                                                \
            const __m512i L = _mm512_loadu_si512((const void *)(blk + 64 * h));                      \
            const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h))); \
            const __m512i u01 = _mm512_ternarylogic_epi32(L, m0f, _mm512_and_si512(_mm512_sllv_epi64(H, sh_lo), m30), 0xEA); \
            const __m512i u23 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(L, 4), m0f,             \
                                                          _mm512_and_si512(_mm512_srlv_epi64(H, sh_hi), m30), 0xEA); \
            for (int v = 0; v < 2; v++) {                                                            \
                const int s = 4 * h + 2 * v; /* first 32-weight group of the step, in the block */  \
                const __m512i xv = _mm512_load_si512((const void *)(xb + 32 * s));                  \
                const __m512i isum = _mm512_sub_epi32(DOT(zero, v ? u23 : u01, xv), DOT(zero, c32, xv)); \
                const __m512 sc = _mm512_permutexvar_ps(_mm512_add_epi32(sub4, _mm512_set1_epi32(2 * s)), scf); \
                const __m512 w = _mm512_mul_ps(sc, _mm512_load_ps(dl + 8 * s));                      \
                if (v) f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), w, f1);                        \
                else f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), w, f0);                          \
            }                                                                                        \
        }                                                                                            \
    }                                                                                                \
    return _mm512_reduce_add_ps(_mm512_add_ps(f0, f1))

static float kq_q4k_row_bw(const cq_qmat *m, size_t r, const cq_xq *xq) { KQ_Q4K_BODY(dot_bw); }
static float kq_q6k_row_bw(const cq_qmat *m, size_t r, const cq_xq *xq) { KQ_Q6K_BODY(dot_bw); }
#ifdef CQ_HAVE_VNNI_FN
__attribute__((target("avx512vnni"))) static float kq_q4k_row_vnni(const cq_qmat *m, size_t r, const cq_xq *xq) {
    KQ_Q4K_BODY(_mm512_dpbusd_epi32);
}
__attribute__((target("avx512vnni"))) static float kq_q6k_row_vnni(const cq_qmat *m, size_t r, const cq_xq *xq) {
    KQ_Q6K_BODY(_mm512_dpbusd_epi32);
}
#endif

static void kq_i8_rows(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *xq, float *out) {
    float (*row)(const cq_qmat *, size_t, const cq_xq *) = NULL;
#ifdef CQ_HAVE_VNNI_FN
    const int vnni = (cq_cpu_features() & CQ_CPU_AVX512VNNI) != 0;
    if (m->dtype == CQ_DT_GGML_Q4_K) row = vnni ? kq_q4k_row_vnni : kq_q4k_row_bw;
    if (m->dtype == CQ_DT_GGML_Q6_K) row = vnni ? kq_q6k_row_vnni : kq_q6k_row_bw;
#else
    if (m->dtype == CQ_DT_GGML_Q4_K) row = kq_q4k_row_bw;
    if (m->dtype == CQ_DT_GGML_Q6_K) row = kq_q6k_row_bw;
#endif
    if (!row) row = kq_ref_i8_row;
    for (size_t j = 0; j < nr; j++) out[j] = row(m, r0 + j, xq);
}
#endif
