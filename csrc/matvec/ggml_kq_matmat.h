/* ggml_kq_matmat.h -- matmat with int8 activations for the ggml K-quants (the kq_mm_*
 * hooks that matmat_i8.h's i8_mm_* functions hand these dtypes to), for the x86 tables:
 * u8 x s8 products by vpdpbusd where the CPU has it, else by vpmaddubsw + vpmaddwd (the
 * u8 weights are at most 63, so a pair of products fits int16: every K-quant but
 * iq4_xs, whose u reaches 241). Included by matmat_i8.h, which defines
 * I8MM_PW / I8MM_VW (inputs per panel and per vector); the including ISA file then
 * defines the register tiles (ggml_kq_matmat_tile.h, instantiated by
 * ggml_kq_matmat_avx512.h / ggml_kq_matmat_avx2.h):
 *   static void kq_mm_tiles(int dtype, nv, nr, w, S, M, xp, wd, n, part, ldp, first)
 *   static int kq_mm_cpu(int dtype)
 * Every variant forms the same integers and float operations, so they give the same
 * bits.
 *
 * The integers are those of the int8 matvec (kq_ref_i8_row), with x quantized the same
 * way (cq_xq_quant32 per group of 32):
 *   u = q + B, the weight's integer as u8 (B: q6_k 32, q3_k 4, iq4_xs 128, else 0)
 *   per 16-weight half h of group g: isum_h = sum u*xq - B * sum xq = sum q*xq exactly
 * and the float combination, per input i and row j, with S = d * sc and M = -(dmin * mn)
 * of the half or group:
 *   q4_k, q5_k (a scale and a min per 32 weights, B = 0: the halves are summed as one):
 *     Y += (isum * d_ig) * S_g + (d_ig * sum_g xq) * M_g
 *   q6_k, q3_k, iq4_xs (a scale per 16; iq4_xs's per 32 given to both halves):
 *     h = isum_a * S_a + isum_b * S_b (a multiply, then an FMA), Y += h * d_ig
 *   q2_k (a scale and a min per 16):
 *     Y += (isum_h * d_ig) * S_h + (d_ig * sum_h xq) * M_h, for both halves
 * so a row equals the int8 matvec within float32 rounding (not bitwise: another order
 * and grouping of the float operations; tests/test_ggml_kquants.py).
 *
 * X is packed once per call into panels of up to I8MM_PW inputs; per group g of a
 * panel of width wd (kq_mm_xg * wd bytes):
 *   [xq: 8 steps of (wd inputs x 4 bytes)][bias_a: wd int32][bias_b: wd int32]
 *   [d: wd floats][xd: wd floats] (q2_k: [xd_a][xd_b])
 * with bias_h = -B * sum_h xq, xd = d * sum xq, xd_h = d * sum_h xq, and zero inputs
 * past t, quantized by the pool's threads (kq_mm_pack). A thread decodes CQ_MM_ROWS
 * weight rows one 256-weight block at a time into u8 rows in L1 (with each row's 16
 * half scales S and mins M as floats; q6_k by the ISA file's kq_mm_q6k_u8) and runs
 * the tiles over every panel before the next block; the tiles' sums (rows x inputs)
 * reach Y through 8 x 8 register transposes. The scale-per-16 formats combine a
 * group's two halves before d (three float operations a group instead of six), which
 * takes a third register set and so smaller tiles (ggml_kq_matmat_tile.h). */
#ifndef CQ_GGML_KQ_MATMAT_H
#define CQ_GGML_KQ_MATMAT_H
#include "../pool.h"

/* packed bytes per group and input: q2_k has a min per half, so two xd */
static size_t kq_mm_xg(int dtype) { return dtype == CQ_DT_GGML_Q2_K ? 52 : 48; }
static int kq_mm_offset(int dtype) {
    switch (dtype) {
    case CQ_DT_GGML_Q6_K: return 32;
    case CQ_DT_GGML_Q3_K: return 4;
    case CQ_DT_GGML_IQ4_XS: return 128;
    default: return 0;
    }
}
static size_t kq_mm_panel_at(int dtype, size_t ng, size_t p) { return p * I8MM_PW * kq_mm_xg(dtype) * ng; }

static void kq_mm_tiles(int dtype, size_t nv, size_t nr, const uint8_t *w, const float *S, const float *M,
                        const uint8_t *xp, size_t wd, size_t n, float *part, size_t ldp, int first);
/* nonzero where a tile variant runs dtype on this CPU (else the float32 matmat) */
static int kq_mm_cpu(int dtype);
/* One q6_k block at blk as u8 weights u = q + 32 (the block's 6-bit codes in column
 * order; u 64-byte aligned) and its half scales S[s] = d * sc_s, the products
 * kq_decode_block forms (no mins: the halves tile reads none). Defined by the
 * including ISA file on its widest vectors. */
static void kq_mm_q6k_u8(const uint8_t *blk, uint8_t *u, float *S);

static size_t kq_mm_pack_bytes(const cq_qmat *m, size_t t) {
    const size_t ng = m->cols / CQ_GROUP, np = (t + I8MM_PW - 1) / I8MM_PW;
    return kq_mm_panel_at(m->dtype, ng, np - 1) + kq_mm_xg(m->dtype) * ng * i8mm_wd(t, np - 1);
}

/* One group of input li of a panel of width wd into its packed slots at gb: the 32
 * int8 codes as cq_xq_quant32 forms them (avx2_quant32's lanes, packed to bytes by
 * saturating packs that never saturate: |q| <= 127), the halves' biases, d and the
 * xd terms. The 8-lane path takes every group but those with a NaN, an infinity or
 * all zeros, which the scalar spec quantizes (the same bytes either way). */
static inline void kq_mm_pack_group(const float *xg, uint8_t *gb, size_t wd, size_t li, int32_t B, int halves_min) {
    _Alignas(32) int32_t qi[32];
    _Alignas(32) int32_t q4[8];
    float d;
    int32_t sa, sb;
    if (avx2_quant32(xg, qi, &d)) {
        const __m256i q0 = _mm256_load_si256((const __m256i *)(const void *)qi);
        const __m256i q1 = _mm256_load_si256((const __m256i *)(const void *)(qi + 8));
        const __m256i q2 = _mm256_load_si256((const __m256i *)(const void *)(qi + 16));
        const __m256i q3 = _mm256_load_si256((const __m256i *)(const void *)(qi + 24));
        /* packs interleave 128-bit lanes: dword k of the packed vector holds codes
         * 4 * perm[k] .. + 3, which the permute puts back in column order */
        const __m256i b8 = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
        _mm256_store_si256((__m256i *)(void *)q4, _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        __m256i h = _mm256_hadd_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3)); /* a a b b | a a b b */
        h = _mm256_hadd_epi32(h, h);
        const __m128i s2 = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        sa = _mm_cvtsi128_si32(s2);
        sb = _mm_extract_epi32(s2, 1);
    } else {
        int8_t q[32];
        d = cq_xq_quant32(xg, q);
        sa = sb = 0;
        for (int k = 0; k < 16; k++) sa += q[k], sb += q[16 + k];
        memcpy(q4, q, 32);
    }
    for (int k4 = 0; k4 < 8; k4++) memcpy(gb + 4 * wd * k4 + 4 * li, q4 + k4, 4);
    const int32_t ba = -B * sa, bbias = -B * sb;
    memcpy(gb + 32 * wd + 4 * li, &ba, 4);
    memcpy(gb + 36 * wd + 4 * li, &bbias, 4);
    memcpy(gb + 40 * wd + 4 * li, &d, 4);
    if (halves_min) {
        const float xa = d * (float)sa, xb = d * (float)sb;
        memcpy(gb + 44 * wd + 4 * li, &xa, 4);
        memcpy(gb + 48 * wd + 4 * li, &xb, 4);
    } else {
        const float xd = d * (float)(sa + sb);
        memcpy(gb + 44 * wd + 4 * li, &xd, 4);
    }
}

typedef struct {
    const cq_qmat *m;
    const float *X;
    size_t t;
    uint8_t *buf;
} kq_mm_pack_job;

/* Inputs [i0, i1) of a kq_mm_pack call. */
static void kq_mm_pack_inputs(void *arg, size_t i0, size_t i1) {
    const kq_mm_pack_job *j = (const kq_mm_pack_job *)arg;
    const cq_qmat *m = j->m;
    const size_t cols = m->cols, ng = cols / CQ_GROUP, xgb = kq_mm_xg(m->dtype);
    const int32_t B = kq_mm_offset(m->dtype);
    const int halves_min = m->dtype == CQ_DT_GGML_Q2_K;
    for (size_t i = i0; i < i1; i++) {
        const size_t p = i / I8MM_PW, li = i % I8MM_PW, wd = i8mm_wd(j->t, p);
        const float *x = j->X + i * cols;
        uint8_t *pb = j->buf + kq_mm_panel_at(m->dtype, ng, p);
        for (size_t g = 0; g < ng; g++) kq_mm_pack_group(x + CQ_GROUP * g, pb + xgb * wd * g, wd, li, B, halves_min);
    }
}

/* X quantized and packed by the pool's threads, 16 inputs a piece (64 bytes of every
 * step's row on the 16-lane panels, so that no two threads write one line): on a
 * 64-input prompt chunk the quantization is a few percent of the product, and the
 * caller's thread alone would leave the others idle meanwhile. */
static void kq_mm_pack(const cq_qmat *m, const float *X, size_t t, uint8_t *buf) {
    const size_t ng = m->cols / CQ_GROUP, np = (t + I8MM_PW - 1) / I8MM_PW;
    memset(buf + kq_mm_panel_at(m->dtype, ng, np - 1), 0, kq_mm_xg(m->dtype) * ng * i8mm_wd(t, np - 1));
    kq_mm_pack_job j = {m, X, t, buf};
    cq_pool_for(t, 16, t * m->cols >= 65536, kq_mm_pack_inputs, &j);
}

static size_t kq_mm_scratch_bytes(const cq_qmat *m, size_t t) {
    (void)m;
    return CQ_MM_ROWS * (CQ_KQ_BLOCK + 32 * sizeof(float)) + CQ_MM_ROWS * i8mm_upv(t) * sizeof(float) + 128;
}

/* Block b of row r as u8 weights u = q + B and the float scales and mins of its 16
 * halves: q6_k by kq_mm_q6k_u8 (scales only), q4_k and q5_k by kq_u8_block
 * (ggml_kq_decode_avx2.h), the others from the scalar splitter. */
static void kq_mm_decode(const cq_qmat *m, size_t r, size_t b, uint8_t *u, float *S, float *M) {
    const uint8_t *blk = m->data + (r * (m->cols / CQ_KQ_BLOCK) + b) * kq_block_bytes(m->dtype);
    if (m->dtype == CQ_DT_GGML_Q6_K) {
        kq_mm_q6k_u8(blk, u, S);
        return;
    }
    if (kq_u8_has(m->dtype)) {
        kq_u8_block(m->dtype, blk, u, S, M);
        return;
    }
    kq_ints t;
    kq_block_ints(m->dtype, blk, &t);
    const int B = kq_mm_offset(m->dtype);
    for (int k = 0; k < CQ_KQ_BLOCK; k++) u[k] = (uint8_t)(t.q[k] + B);
    for (int s = 0; s < 16; s++) {
        S[s] = t.d * (float)t.sc[s];
        M[s] = -(t.dmin * (float)t.mn[s]);
    }
}

/* Every line block b of row r touches (a block is not line-aligned), hint T0. */
static inline void kq_mm_prefetch_block(const cq_qmat *m, size_t r, size_t b) {
    const size_t bb = kq_block_bytes(m->dtype);
    const uint8_t *blk = m->data + (r * (m->cols / CQ_KQ_BLOCK) + b) * bb;
    for (uintptr_t a = (uintptr_t)blk & ~(uintptr_t)63; a < (uintptr_t)(blk + bb); a += 64)
        _mm_prefetch((const char *)a, _MM_HINT_T0);
}

/* Y[i * ldy + j] = part[j * ldp + i] for i < t, j < nr: 8 x 8 tiles transposed in
 * registers, the edges one value at a time. */
static void kq_mm_store(const float *part, size_t ldp, size_t nr, size_t t, float *Y, size_t ldy) {
    const size_t j8 = nr & ~(size_t)7, i8 = t & ~(size_t)7;
    for (size_t j = 0; j < j8; j += 8)
        for (size_t i = 0; i < i8; i += 8) {
            __m256 r[8], u[8], v[8];
            for (int k = 0; k < 8; k++) r[k] = _mm256_loadu_ps(part + (j + k) * ldp + i);
            for (int k = 0; k < 4; k++) {
                u[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
                u[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
            }
            for (int k = 0; k < 2; k++) {
                v[4 * k] = _mm256_shuffle_ps(u[4 * k], u[4 * k + 2], 0x44);
                v[4 * k + 1] = _mm256_shuffle_ps(u[4 * k], u[4 * k + 2], 0xEE);
                v[4 * k + 2] = _mm256_shuffle_ps(u[4 * k + 1], u[4 * k + 3], 0x44);
                v[4 * k + 3] = _mm256_shuffle_ps(u[4 * k + 1], u[4 * k + 3], 0xEE);
            }
            for (int k = 0; k < 4; k++) {
                _mm256_storeu_ps(Y + (i + k) * ldy + j, _mm256_permute2f128_ps(v[k], v[4 + k], 0x20));
                _mm256_storeu_ps(Y + (i + 4 + k) * ldy + j, _mm256_permute2f128_ps(v[k], v[4 + k], 0x31));
            }
        }
    for (size_t i = 0; i < t; i++) {
        for (size_t j = i < i8 ? j8 : 0; j < nr; j++) Y[i * ldy + j] = part[j * ldp + i];
    }
}

/* Y[i * ldy + j] = row r0 + j . X[i] for j < nr <= CQ_MM_ROWS, i < t (buf: kq_mm_pack).
 * Each row's next block is fetched as soon as this one is decoded, so that it arrives
 * while the tiles run (issued in one burst for all rows before the decodes, the
 * prefetches slowed them: docs/PERFORMANCE.md §1.9.4). */
static void kq_mm_block(const cq_qmat *m, size_t r0, size_t nr, const uint8_t *buf, size_t t, float *Y, size_t ldy,
                        float *scratch) {
    const size_t ng = m->cols / CQ_GROUP, nb = m->cols / CQ_KQ_BLOCK, ldp = i8mm_upv(t);
    const size_t np = (t + I8MM_PW - 1) / I8MM_PW;
    uint8_t *w = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *S = (float *)(void *)(w + CQ_MM_ROWS * CQ_KQ_BLOCK), *M = S + 16 * CQ_MM_ROWS, *part = M + 16 * CQ_MM_ROWS;
    /* rows past nr: zeros the tiles multiply and nobody reads */
    memset(w + nr * CQ_KQ_BLOCK, 0, (CQ_MM_ROWS - nr) * CQ_KQ_BLOCK);
    memset(S + 16 * nr, 0, 16 * (CQ_MM_ROWS - nr) * sizeof(float));
    memset(M, 0, 16 * CQ_MM_ROWS * sizeof(float));
    for (size_t b = 0; b < nb; b++) {
        for (size_t j = 0; j < nr; j++) {
            kq_mm_decode(m, r0 + j, b, w + j * CQ_KQ_BLOCK, S + 16 * j, M + 16 * j);
            if (b + 1 < nb) kq_mm_prefetch_block(m, r0 + j, b + 1);
        }
        for (size_t p = 0; p < np; p++) {
            const size_t wd = i8mm_wd(t, p);
            const uint8_t *xp = buf + kq_mm_panel_at(m->dtype, ng, p) + kq_mm_xg(m->dtype) * wd * 8 * b;
            kq_mm_tiles(m->dtype, wd / I8MM_VW, nr, w, S, M, xp, wd, 8, part + I8MM_PW * p, ldp, b == 0);
        }
    }
    kq_mm_store(part, ldp, nr, t, Y, ldy);
}
#endif
