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
