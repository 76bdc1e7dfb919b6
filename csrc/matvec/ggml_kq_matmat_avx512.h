/* ggml_kq_matmat_avx512.h -- the K-quant int8 matmat tiles (ggml_kq_matmat.h) on 16
 * lanes: vpdpbusd with AVX-512 VNNI, else vpmaddubsw + vpmaddwd (AVX-512 BW; not for
 * iq4_xs); 12 float and 12 integer accumulators (3 x 4, 4 x 3, 6 x 2, 12 x 1), as
 * matmat_i8_avx512.h's. Included by matvec_avx512.c after matmat_i8_avx512.h. */
#ifndef CQ_GGML_KQ_MATMAT_AVX512_H
#define CQ_GGML_KQ_MATMAT_AVX512_H
#define KQT_VI __m512i
#define KQT_VF __m512
#define KQT_VW 16
#define KQT_LOADI(p) _mm512_load_si512((const void *)(p))
#define KQT_SET1I(i) _mm512_set1_epi32(i)
#define KQT_ZEROI() _mm512_setzero_si512()
#define KQT_LOADF(p) _mm512_load_ps(p)
#define KQT_LOADUF(p) _mm512_loadu_ps(p)
#define KQT_STOREUF(p, v) _mm512_storeu_ps(p, v)
#define KQT_SET1F(f) _mm512_set1_ps(f)
#define KQT_ZEROF() _mm512_setzero_ps()
#define KQT_CVT(v) _mm512_cvtepi32_ps(v)
#define KQT_MUL(a, b) _mm512_mul_ps(a, b)
#define KQT_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define KQT_SHAPES(X) X(12, 1) X(6, 2) X(4, 3) X(3, 4)
#define KQT_HSHAPES(X) X(8, 1) X(4, 2) X(3, 3) X(2, 4)
#define KQT_PIN(v) __asm__("" : "+v"(v))

#define KQT_SUF bw
#define KQT_TARGET "avx512bw"
#define KQT_DOT(a, u, s) _mm512_add_epi32(a, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)))
#include "ggml_kq_matmat_tile.h"
#undef KQT_SUF
#undef KQT_TARGET
#undef KQT_DOT
#ifdef CQ_HAVE_VNNI_FN
#define KQT_SUF zmm
#define KQT_TARGET "avx512vnni"
#define KQT_DOT(a, u, s) _mm512_dpbusd_epi32(a, u, s)
#include "ggml_kq_matmat_tile.h"
#endif

/* kq_mm_q6k_u8 on 64 bytes: each half of 128 weights is one zmm of ql (low nibbles:
 * weights 0-63 of the half, high nibbles: 64-127) and its 32 qh bytes broadcast to both
 * 256-bit halves, whose 2-bit planes a per-qword shift count moves to bits 4-5 (planes
 * 0 and 1 for the first 64 weights, 2 and 3 for the next); a mask and a vpternlogd
 * join them. Against the 256-bit splitter with scalar scales (kq_u8_block) this is
 * about a third of the instructions, which counts where a block's u8 rows serve only
 * one 64-input panel (a 64-row prompt chunk). */
static void kq_mm_q6k_u8(const uint8_t *blk, uint8_t *u, float *S) {
    const __m512i m0f = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i lo_shift = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4); /* left: planes 0, 1 */
    const __m512i hi_shift = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0); /* right: planes 2, 3 */
    for (int h = 0; h < 2; h++) {
        const __m512i L = _mm512_loadu_si512((const void *)(blk + 64 * h));
        const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)(blk + 128 + 32 * h)));
        const __m512i hlo = _mm512_and_si512(_mm512_sllv_epi64(H, lo_shift), m30);
        const __m512i hhi = _mm512_and_si512(_mm512_srlv_epi64(H, hi_shift), m30);
        /* 0xEA: (a & b) | c with b the nibble mask */
        _mm512_store_si512((void *)(u + 128 * h), _mm512_ternarylogic_epi32(L, m0f, hlo, 0xEA));
        _mm512_store_si512((void *)(u + 128 * h + 64), _mm512_ternarylogic_epi32(_mm512_srli_epi16(L, 4), m0f, hhi, 0xEA));
    }
    const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(blk + 192))));
    _mm512_storeu_ps(S, _mm512_mul_ps(_mm512_set1_ps(cq_h2f(cq_ld16(blk + 208))), sc));
}

/* 1: VNNI, 2: vpmaddubsw (the u8 weights of all but iq4_xs stay <= 63) */
static int kq_mm_cpu(int dtype) {
#ifdef CQ_HAVE_VNNI_FN
    if (cq_cpu_features() & CQ_CPU_AVX512VNNI) return 1;
#endif
    return dtype != CQ_DT_GGML_IQ4_XS ? 2 : 0;
}

static void kq_mm_tiles(int dtype, size_t nv, size_t nr, const uint8_t *w, const float *S, const float *M,
                        const uint8_t *xp, size_t wd, size_t n, float *part, size_t ldp, int first) {
#ifdef CQ_HAVE_VNNI_FN
    if (kq_mm_cpu(dtype) == 1) {
        kq_mm_tiles_zmm(dtype, nv, nr, w, S, M, xp, wd, n, part, ldp, first);
        return;
    }
#endif
    kq_mm_tiles_bw(dtype, nv, nr, w, S, M, xp, wd, n, part, ldp, first);
}
#endif
