/* ggml_kq_matmat_avx2.h -- the K-quant int8 matmat tiles (ggml_kq_matmat.h) on 8 lanes
 * for the AVX2 table: vpdpbusd on 256 bits as AVX-VNNI (VEX, 16 registers: 6
 * accumulators of each kind) or AVX-512 VNNI + VL (EVEX, 32 registers: 12), which
 * matmat_i8_avx2.h's i8mm_cpu() picks, else vpmaddubsw + vpmaddwd (plain AVX2, 16
 * registers; not for iq4_xs). One source with the same integers and float operations,
 * so all give the same bits. Included by matvec_avx2.c after matmat_i8_avx2.h. */
#ifndef CQ_GGML_KQ_MATMAT_AVX2_H
#define CQ_GGML_KQ_MATMAT_AVX2_H
#define KQT_VI __m256i
#define KQT_VF __m256
#define KQT_VW 8
#define KQT_LOADI(p) _mm256_load_si256((const __m256i *)(const void *)(p))
#define KQT_SET1I(i) _mm256_set1_epi32(i)
#define KQT_ZEROI() _mm256_setzero_si256()
#define KQT_LOADF(p) _mm256_load_ps(p)
#define KQT_LOADUF(p) _mm256_loadu_ps(p)
#define KQT_STOREUF(p, v) _mm256_storeu_ps(p, v)
#define KQT_SET1F(f) _mm256_set1_ps(f)
#define KQT_ZEROF() _mm256_setzero_ps()
#define KQT_CVT(v) _mm256_cvtepi32_ps(v)
#define KQT_MUL(a, b) _mm256_mul_ps(a, b)
#define KQT_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define KQT_PIN(v) __asm__("" : "+v"(v))

#define KQT_SUF mad
#define KQT_TARGET "avx2"
#define KQT_DOT(a, u, s) _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
#define KQT_SHAPES(X) X(4, 1) X(2, 2) X(2, 3)
#define KQT_HSHAPES(X) X(4, 1) X(2, 2) X(2, 3)
#include "ggml_kq_matmat_tile.h"
#undef KQT_SUF
#undef KQT_TARGET
#undef KQT_DOT
#undef KQT_SHAPES
#undef KQT_HSHAPES
#ifdef CQ_HAVE_AVXVNNI_FN
#define KQT_SUF vex
#define KQT_TARGET "avxvnni"
#define KQT_DOT(a, u, s) _mm256_dpbusd_avx_epi32(a, u, s)
#define KQT_SHAPES(X) X(6, 1) X(3, 2) X(2, 3)
#define KQT_HSHAPES(X) X(4, 1) X(2, 2) X(2, 3)
#include "ggml_kq_matmat_tile.h"
#undef KQT_SUF
#undef KQT_TARGET
#undef KQT_DOT
#undef KQT_SHAPES
#undef KQT_HSHAPES
#endif
#ifdef CQ_HAVE_VNNI256_FN
#define KQT_SUF evex
#define KQT_TARGET "avx512vnni,avx512vl"
#define KQT_DOT(a, u, s) _mm256_dpbusd_epi32(a, u, s)
#define KQT_SHAPES(X) X(12, 1) X(6, 2) X(4, 3)
#define KQT_HSHAPES(X) X(8, 1) X(4, 2) X(3, 3)
#include "ggml_kq_matmat_tile.h"
#endif

/* kq_mm_q6k_u8 on 32 bytes: per half of 128 weights, two ymm of ql (their low
 * nibbles: weights 0-63, high: 64-127) and the 32 qh bytes, whose 2-bit planes shift
 * to bits 4-5; the 16 scales convert on two vectors. */
static void kq_mm_q6k_u8(const uint8_t *blk, uint8_t *u, float *S) {
    const __m256i m0f = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; h++) {
        const __m256i L0 = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 64 * h));
        const __m256i L1 = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 64 * h + 32));
        const __m256i H = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 128 + 32 * h));
        uint8_t *o = u + 128 * h;
        _mm256_store_si256((__m256i *)(void *)o, _mm256_or_si256(_mm256_and_si256(L0, m0f), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30)));
        _mm256_store_si256((__m256i *)(void *)(o + 32), _mm256_or_si256(_mm256_and_si256(L1, m0f), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30)));
        _mm256_store_si256((__m256i *)(void *)(o + 64), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L0, 4), m0f), _mm256_and_si256(H, m30)));
        _mm256_store_si256((__m256i *)(void *)(o + 96), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L1, 4), m0f), _mm256_and_si256(_mm256_srli_epi16(H, 2), m30)));
    }
    const __m256 d = _mm256_set1_ps(cq_h2f(cq_ld16(blk + 208)));
    const __m128i sc = _mm_loadu_si128((const __m128i *)(const void *)(blk + 192));
    _mm256_storeu_ps(S, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
    _mm256_storeu_ps(S + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
}

/* 1, 2: i8mm_cpu()'s VNNI kinds; 3: vpmaddubsw (the u8 weights of all but iq4_xs stay
 * <= 63) */
static int kq_mm_cpu(int dtype) {
    const int k = i8mm_cpu();
    return k ? k : dtype != CQ_DT_GGML_IQ4_XS ? 3 : 0;
}

static void kq_mm_tiles(int dtype, size_t nv, size_t nr, const uint8_t *w, const float *S, const float *M,
                        const uint8_t *xp, size_t wd, size_t n, float *part, size_t ldp, int first) {
    switch (kq_mm_cpu(dtype)) {
#ifdef CQ_HAVE_AVXVNNI_FN
    case 1: kq_mm_tiles_vex(dtype, nv, nr, w, S, M, xp, wd, n, part, ldp, first); break;
#endif
#ifdef CQ_HAVE_VNNI256_FN
    case 2: kq_mm_tiles_evex(dtype, nv, nr, w, S, M, xp, wd, n, part, ldp, first); break;
#endif
    default: kq_mm_tiles_mad(dtype, nv, nr, w, S, M, xp, wd, n, part, ldp, first);
    }
}
#endif
