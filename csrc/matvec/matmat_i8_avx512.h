/* matmat_i8_avx512.h -- the register tiles of matmat_i8.h on 16 lanes (AVX-512 VNNI):
 * 12 integer and 12 float accumulators, the NV inputs and a broadcast, 29 of the 32
 * registers. Included by matvec_avx512.c after matmat_packed.h. */
#ifndef CQ_MATMAT_I8_AVX512_H
#define CQ_MATMAT_I8_AVX512_H
#define I8MM_PW 64
#define I8MM_VW 16
#include "matmat_i8.h"

#ifdef CQ_HAVE_VNNI_FN
/* One MR x NV tile over n groups: u8 weights w[r * I8MM_KC + 32 g + k], their scales
 * sc[r * I8MM_KG + g] (unused when rowscale), the panel's groups at xp, partial sums
 * part[r * ldp + 16 v + lane]. */
static inline __attribute__((always_inline, target("avx512vnni"))) void
i8mm_tile(const uint8_t *w, const float *sc, const uint8_t *xp, size_t wd, size_t n, float *part, size_t ldp,
          int first, int rowscale, const int MR, const int NV) {
    __m512 f[12];
    __m512i acc[12];
#pragma GCC unroll 12
    for (int k = 0; k < MR * NV; k++) f[k] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(part + (k / NV) * ldp + 16 * (k % NV));
    for (size_t g = 0; g < n; g++) {
        const uint8_t *xg = xp + 40 * wd * g;
#pragma GCC unroll 12
        for (int k = 0; k < MR * NV; k++) acc[k] = _mm512_load_si512((const void *)(xg + 32 * wd + 64 * (k % NV)));
#pragma GCC unroll 8
        for (int k4 = 0; k4 < 8; k4++) {
            __m512i xv[4];
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) xv[v] = _mm512_load_si512((const void *)(xg + 4 * wd * k4 + 64 * v));
#pragma GCC unroll 12
            for (int r = 0; r < MR; r++) {
                int32_t wb;
                memcpy(&wb, w + r * I8MM_KC + 32 * g + 4 * k4, 4);
                const __m512i b = _mm512_set1_epi32(wb);
#pragma GCC unroll 4
                for (int v = 0; v < NV; v++) acc[r * NV + v] = _mm512_dpbusd_epi32(acc[r * NV + v], b, xv[v]);
            }
        }
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            const __m512 dv = _mm512_load_ps((const float *)(const void *)(xg + 36 * wd + 64 * v));
#pragma GCC unroll 12
            for (int r = 0; r < MR; r++) {
                const __m512 is = _mm512_cvtepi32_ps(acc[r * NV + v]);
                if (rowscale) f[r * NV + v] = _mm512_fmadd_ps(is, dv, f[r * NV + v]);
                else f[r * NV + v] = _mm512_fmadd_ps(_mm512_mul_ps(is, dv), _mm512_set1_ps(sc[r * I8MM_KG + g]), f[r * NV + v]);
            }
        }
    }
#pragma GCC unroll 12
    for (int k = 0; k < MR * NV; k++) _mm512_storeu_ps(part + (k / NV) * ldp + 16 * (k % NV), f[k]);
}

/* 12 accumulators of each kind: 3 rows x 4 vectors, 4 x 3, 6 x 2, 12 x 1 */
#define I8MM_SHAPES(X) X(3, 4) X(4, 3) X(6, 2) X(12, 1)
#define I8MM_TILE_FN(MR, NV)                                                                                 \
    __attribute__((target("avx512vnni"))) static void i8mm_tile_##MR##x##NV(                                  \
        const uint8_t *w, const float *sc, const uint8_t *xp, size_t wd, size_t n, float *part, size_t ldp,  \
        int first, int rowscale) {                                                                           \
        i8mm_tile(w, sc, xp, wd, n, part, ldp, first, rowscale, MR, NV);                                     \
    }
I8MM_SHAPES(I8MM_TILE_FN)
#undef I8MM_TILE_FN
#endif

static int i8mm_cpu(void) {
#ifdef CQ_HAVE_VNNI_FN
    return (cq_cpu_features() & CQ_CPU_AVX512VNNI) != 0;
#else
    return 0;
#endif
}

static void i8mm_tiles(size_t nv, size_t nr, const uint8_t *w, const float *sc, const uint8_t *xp, size_t wd,
                       size_t n, float *part, size_t ldp, int first, int rowscale) {
#ifdef CQ_HAVE_VNNI_FN
    switch (nv) {
#define I8MM_CASE(MR, NV)                                                                                          \
    case NV:                                                                                                       \
        for (size_t r = 0; r < nr; r += MR)                                                                        \
            i8mm_tile_##MR##x##NV(w + r * I8MM_KC, sc + r * I8MM_KG, xp, wd, n, part + r * ldp, ldp, first, rowscale); \
        break;
        I8MM_SHAPES(I8MM_CASE)
#undef I8MM_CASE
    default: break;
    }
#else
    (void)nv; (void)nr; (void)w; (void)sc; (void)xp; (void)wd; (void)n; (void)part; (void)ldp; (void)first; (void)rowscale;
#endif
}
#endif

