/* ggml_kq_decode_avx2.h -- the K-quants' float32 path on 8 lanes (the AVX2 and AVX-512
 * tables' dequant_row, the AVX2 table's dot_row; AVX-512's row dot is
 * ggml_kq_decode_avx512.h): one 256-weight block decoded to float32 bit for bit
 * as kq_decode_block does (the same float32 products d * sc and dmin * mn, then per
 * weight (d * sc) * q and, with mins, minus dmin * mn: a multiply and a subtract, never
 * fused: every file is compiled with -ffp-contract=off), and the dot with x by FMA in
 * 8 lanes (so within float32 rounding of kq_ref_row, not bitwise). q4_k, q5_k, q6_k
 * split their bits with 256-bit shifts and masks (kq_u8_block, also the int8 matmat's decoder);
 * q2_k, q3_k and iq4_xs take their integers from the scalar kq_block_ints. Included by
 * matvec_avx2_impl.h. */
#ifndef CQ_GGML_KQ_DECODE_AVX2_H
#define CQ_GGML_KQ_DECODE_AVX2_H

static int kq_u8_has(int dtype) { return dtype == CQ_DT_GGML_Q4_K || dtype == CQ_DT_GGML_Q5_K || dtype == CQ_DT_GGML_Q6_K; }
static int kq_u8_offset(int dtype) { return dtype == CQ_DT_GGML_Q6_K ? 32 : 0; }

/* One q4_k, q5_k or q6_k block at blk: its 256 weights as u8 u = q + kq_u8_offset
 * (column order; u 32-byte aligned), the float scale of each 16 weights S[s] = d * sc_s
 * and their min term M[s] = -(dmin * mn_s) (0 for q6_k): the float32 products
 * kq_decode_block forms, so S[s] * q + M[s] is its weight bit for bit. */
static void kq_u8_block(int dtype, const uint8_t *blk, uint8_t *u, float *S, float *M) {
    const __m256i m0f = _mm256_set1_epi8(0x0F);
    if (dtype == CQ_DT_GGML_Q6_K) {
        const float d = cq_h2f(cq_ld16(blk + 208));
        for (int s = 0; s < 16; s++) S[s] = d * (float)(int8_t)blk[192 + s];
        for (int k = 0; k < 16; k++) M[k] = 0.0f;
        const __m256i m3 = _mm256_set1_epi8(3);
        for (int h = 0; h < 2; h++) { /* weights 128h + 32s + k: nibble of ql, bits 2s.. of qh */
            const __m256i L0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
            const __m256i L1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
            const __m256i H = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
            const __m256i lo[4] = {_mm256_and_si256(L0, m0f), _mm256_and_si256(L1, m0f),
                                   _mm256_and_si256(_mm256_srli_epi16(L0, 4), m0f),
                                   _mm256_and_si256(_mm256_srli_epi16(L1, 4), m0f)};
            const __m256i hi[4] = {_mm256_and_si256(H, m3), _mm256_and_si256(_mm256_srli_epi16(H, 2), m3),
                                   _mm256_and_si256(_mm256_srli_epi16(H, 4), m3),
                                   _mm256_and_si256(_mm256_srli_epi16(H, 6), m3)};
            for (int s = 0; s < 4; s++)
                _mm256_store_si256((__m256i *)(u + 128 * h + 32 * s), _mm256_or_si256(lo[s], _mm256_slli_epi16(hi[s], 4)));
        }
        return;
    }
    /* q4_k, q5_k: d, dmin, scales[12], (q5_k: qh[32]), qs[128] */
    const float d = cq_h2f(cq_ld16(blk)), dmin = cq_h2f(cq_ld16(blk + 2));
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        kq_scale_min6(blk + 4, j, &sc, &mn);
        S[2 * j] = S[2 * j + 1] = d * (float)sc;
        M[2 * j] = M[2 * j + 1] = -(dmin * (float)mn);
    }
    const int q5 = dtype == CQ_DT_GGML_Q5_K;
    const uint8_t *qs = blk + (q5 ? 48 : 16);
    const __m256i one = _mm256_set1_epi8(1), H = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) { /* 32 bytes: low nibbles weights 64i.., high 64i + 32.. */
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * i));
        __m256i lo = _mm256_and_si256(v, m0f), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f);
        if (q5) { /* bit j of qh[k]: weight 32j + k's fifth bit */
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 2 * i), one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 2 * i + 1), one), 4));
        }
        _mm256_store_si256((__m256i *)(u + 64 * i), lo);
        _mm256_store_si256((__m256i *)(u + 64 * i + 32), hi);
    }
}

/* One block's 256 float32 weights, bit-identical to kq_decode_block. */
static void kq_decode_block_avx2(int dtype, const uint8_t *blk, float *out) {
    const int mins = kq_has_min(dtype);
    if (kq_u8_has(dtype)) {
        _Alignas(32) uint8_t u[CQ_KQ_BLOCK];
        float S[16], M[16];
        kq_u8_block(dtype, blk, u, S, M);
        const __m256i off = _mm256_set1_epi32(kq_u8_offset(dtype));
        for (int s = 0; s < 16; s++) {
            const __m256 ds = _mm256_set1_ps(S[s]), mn = _mm256_set1_ps(M[s]);
            for (int h = 0; h < 2; h++) {
                const __m256i q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(u + 16 * s + 8 * h))), off);
                __m256 w = _mm256_mul_ps(ds, _mm256_cvtepi32_ps(q));
                if (mins) w = _mm256_add_ps(w, mn); /* w + (-(dmin * mn)) == w - dmin * mn */
                _mm256_storeu_ps(out + 16 * s + 8 * h, w);
            }
        }
        return;
    }
    kq_ints t;
    kq_block_ints(dtype, blk, &t);
    for (int s = 0; s < 16; s++) {
        const __m256 ds = _mm256_set1_ps(t.d * (float)t.sc[s]), dm = _mm256_set1_ps(t.dmin * (float)t.mn[s]);
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)(t.q + 16 * s + 8 * h)));
            __m256 w = _mm256_mul_ps(ds, _mm256_cvtepi32_ps(q));
            if (mins) w = _mm256_sub_ps(w, dm);
            _mm256_storeu_ps(out + 16 * s + 8 * h, w);
        }
    }
}

/* Row r's weights into out[cols]. */
static void kq_dequant_row_avx2(const cq_qmat *m, size_t r, float *out) {
    const size_t nb = m->cols / CQ_KQ_BLOCK, bb = kq_block_bytes(m->dtype);
    const uint8_t *row = m->data + r * nb * bb;
    for (size_t i = 0; i < nb; i++) kq_decode_block_avx2(m->dtype, row + i * bb, out + CQ_KQ_BLOCK * i);
}

/* Row r . x: each block decoded into L1, then 8-lane FMAs into four accumulators. */
static float kq_dot_row_avx2(const cq_qmat *m, size_t r, const float *x) {
    const size_t nb = m->cols / CQ_KQ_BLOCK, bb = kq_block_bytes(m->dtype);
    const uint8_t *row = m->data + r * nb * bb;
    _Alignas(32) float w[CQ_KQ_BLOCK];
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < nb; i++) {
        if (i + 2 < nb)
            for (size_t o = 0; o < bb; o += 64) _mm_prefetch((const char *)(row + (i + 2) * bb + o), _MM_HINT_T0);
        kq_decode_block_avx2(m->dtype, row + i * bb, w);
        const float *xb = x + CQ_KQ_BLOCK * i;
        for (int k = 0; k < CQ_KQ_BLOCK; k += 32) {
            a0 = _mm256_fmadd_ps(_mm256_load_ps(w + k), _mm256_loadu_ps(xb + k), a0);
            a1 = _mm256_fmadd_ps(_mm256_load_ps(w + k + 8), _mm256_loadu_ps(xb + k + 8), a1);
            a2 = _mm256_fmadd_ps(_mm256_load_ps(w + k + 16), _mm256_loadu_ps(xb + k + 16), a2);
            a3 = _mm256_fmadd_ps(_mm256_load_ps(w + k + 24), _mm256_loadu_ps(xb + k + 24), a3);
        }
    }
    const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    return _mm_cvtss_f32(v);
}
#endif
