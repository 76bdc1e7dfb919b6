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
