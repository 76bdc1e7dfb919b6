/* ggml_kq_decode_avx512.h -- the K-quants' float32 row dot on 16 lanes (the AVX-512
 * table's dot_row; its dequant_row is the 8-lane one of ggml_kq_decode_avx2.h): each
 * 16-weight sub-block becomes its float32 weights with the reference decoder's
 * operations ((d * sc) * q, then + -(dmin * mn): the bits of kq_decode_block) and meets
 * x by FMA, so the dot is within float32 rounding of kq_ref_row. Included by
 * matvec_avx512.c. */
#ifndef CQ_GGML_KQ_DECODE_AVX512_H
#define CQ_GGML_KQ_DECODE_AVX512_H

static float kq_dot_row_avx512(const cq_qmat *m, size_t r, const float *x) {
    const size_t nb = m->cols / CQ_KQ_BLOCK, bb = kq_block_bytes(m->dtype);
    const uint8_t *row = m->data + r * nb * bb;
    const int mins = kq_has_min(m->dtype), u8 = kq_u8_has(m->dtype);
    const __m512i off = _mm512_set1_epi32(kq_u8_offset(m->dtype));
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    _Alignas(64) uint8_t u[CQ_KQ_BLOCK];
    float S[16], M[16];
    kq_ints t;
    for (size_t i = 0; i < nb; i++) {
        const uint8_t *blk = row + i * bb;
        if (i + 2 < nb)
            for (size_t o = 0; o < bb; o += 64) _mm_prefetch((const char *)(blk + 2 * bb + o), _MM_HINT_T0);
        if (u8) {
            kq_u8_block(m->dtype, blk, u, S, M);
        } else {
            kq_block_ints(m->dtype, blk, &t);
            for (int s = 0; s < 16; s++) {
                S[s] = t.d * (float)t.sc[s];
                M[s] = t.dmin * (float)t.mn[s];
            }
        }
        const float *xb = x + CQ_KQ_BLOCK * i;
        for (int s = 0; s < 16; s++) {
            const __m512i q = u8 ? _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(u + 16 * s))), off)
                                 : _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)(t.q + 16 * s)));
            __m512 w = _mm512_mul_ps(_mm512_set1_ps(S[s]), _mm512_cvtepi32_ps(q));
            if (mins) /* kq_u8_block's M is -(dmin * mn); the splitter's dmin * mn */
                w = u8 ? _mm512_add_ps(w, _mm512_set1_ps(M[s])) : _mm512_sub_ps(w, _mm512_set1_ps(M[s]));
            if (s & 1) a1 = _mm512_fmadd_ps(w, _mm512_loadu_ps(xb + 16 * s), a1);
            else a0 = _mm512_fmadd_ps(w, _mm512_loadu_ps(xb + 16 * s), a0);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}
#endif
