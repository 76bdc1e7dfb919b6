/* matmat_i8_avx2.h -- the register tiles of matmat_i8.h on 8 lanes, for the AVX2 table:
 * vpdpbusd on 256 bits, as AVX-VNNI (VEX: Alder Lake and later, Zen 5 without its
 * 512-bit path) or as AVX-512 VNNI + VL (EVEX: an AVX-512 CPU running the AVX2 table).
 * The two are one source (I8MM2_VARIANT) with the same integers and float operations,
 * so they give the same bits; a CPU with neither keeps the float32 matmat (the u8 x s8
 * pairs of vpmaddubsw would overflow int16 for int8 weights). Integer and float
 * accumulators, the NV inputs and a broadcast fill the registers (16 ymm for VEX, 32
 * for EVEX: see the tile shapes below). Included by
 * matvec_avx2.c after matmat_packed.h. */
#ifndef CQ_MATMAT_I8_AVX2_H
#define CQ_MATMAT_I8_AVX2_H
#define I8MM_PW 24
#define I8MM_VW 8
#include "matmat_i8.h"

#if (defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) || (defined(__clang__) && __clang_major__ >= 12)
#define CQ_HAVE_AVXVNNI_FN 1
#endif
#if defined(__GNUC__) || defined(__clang__)
#define CQ_HAVE_VNNI256_FN 1
#endif

/* One MR x NV tile over n groups (the layout of matmat_i8.h's i8mm_tile comment in
 * matmat_i8_avx512.h: w[r * I8MM_KC + 32 g + k], sc[r * I8MM_KG + g], part[r * ldp +
 * 8 v + lane]). */
#define I8MM2_VARIANT(SUF, TARGET, DOT, MR3, MR2, MR1)                                                           \
    static inline __attribute__((always_inline, target(TARGET))) void i8mm2_tile_##SUF(                          \
        const uint8_t *w, const float *sc, const uint8_t *xp, size_t wd, size_t n, float *part, size_t ldp,      \
        int first, int rowscale, const int MR, const int NV) {                                                   \
        __m256 f[2 * MR3 < MR1 ? MR1 : 3 * MR3];                                                                 \
        __m256i acc[2 * MR3 < MR1 ? MR1 : 3 * MR3];                                                              \
        _Pragma("GCC unroll 12") for (int k = 0; k < MR * NV; k++) f[k] =                                         \
            first ? _mm256_setzero_ps() : _mm256_loadu_ps(part + (k / NV) * ldp + 8 * (k % NV));                 \
        for (size_t g = 0; g < n; g++) {                                                                         \
            const uint8_t *xg = xp + 40 * wd * g;                                                                \
            _Pragma("GCC unroll 12") for (int k = 0; k < MR * NV; k++) acc[k] =                                   \
                _mm256_load_si256((const __m256i *)(xg + 32 * wd + 32 * (k % NV)));                              \
            _Pragma("GCC unroll 8") for (int k4 = 0; k4 < 8; k4++) {                                             \
                __m256i xv[3];                                                                                   \
                _Pragma("GCC unroll 3") for (int v = 0; v < NV; v++) xv[v] =                                     \
                    _mm256_load_si256((const __m256i *)(xg + 4 * wd * k4 + 32 * v));                             \
                _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {                                           \
                    int32_t wb;                                                                                  \
                    memcpy(&wb, w + r * I8MM_KC + 32 * g + 4 * k4, 4);                                           \
                    const __m256i b = _mm256_set1_epi32(wb);                                                     \
                    _Pragma("GCC unroll 3") for (int v = 0; v < NV; v++) acc[r * NV + v] =                       \
                        DOT(acc[r * NV + v], b, xv[v]);                                                          \
                }                                                                                                \
            }                                                                                                    \
            _Pragma("GCC unroll 3") for (int v = 0; v < NV; v++) {                                               \
                const __m256 dv = _mm256_load_ps((const float *)(const void *)(xg + 36 * wd + 32 * v));          \
                _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {                                           \
                    const __m256 is = _mm256_cvtepi32_ps(acc[r * NV + v]);                                       \
                    if (rowscale) f[r * NV + v] = _mm256_fmadd_ps(is, dv, f[r * NV + v]);                        \
                    else f[r * NV + v] = _mm256_fmadd_ps(_mm256_mul_ps(is, dv), _mm256_set1_ps(sc[r * I8MM_KG + g]), \
                                                         f[r * NV + v]);                                         \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
        _Pragma("GCC unroll 12") for (int k = 0; k < MR * NV; k++)                                                \
            _mm256_storeu_ps(part + (k / NV) * ldp + 8 * (k % NV), f[k]);                                        \
    }                                                                                                            \
    __attribute__((target(TARGET))) static void i8mm2_tiles_##SUF(size_t nv, size_t nr, const uint8_t *w,        \
                                                                  const float *sc, const uint8_t *xp, size_t wd, \
                                                                  size_t n, float *part, size_t ldp, int first,  \
                                                                  int rowscale) {                                \
        switch (nv) {                                                                                            \
        case 3:                                                                                                  \
            for (size_t r = 0; r < nr; r += MR3)                                                                 \
                i8mm2_tile_##SUF(w + r * I8MM_KC, sc + r * I8MM_KG, xp, wd, n, part + r * ldp, ldp, first,       \
                                 rowscale, MR3, 3);                                                              \
            break;                                                                                               \
        case 2:                                                                                                  \
            for (size_t r = 0; r < nr; r += MR2)                                                                 \
                i8mm2_tile_##SUF(w + r * I8MM_KC, sc + r * I8MM_KG, xp, wd, n, part + r * ldp, ldp, first,       \
                                 rowscale, MR2, 2);                                                              \
            break;                                                                                               \
        default:                                                                                                 \
            for (size_t r = 0; r < nr; r += MR1)                                                                 \
                i8mm2_tile_##SUF(w + r * I8MM_KC, sc + r * I8MM_KG, xp, wd, n, part + r * ldp, ldp, first,       \
                                 rowscale, MR1, 1);                                                              \
        }                                                                                                        \
    }

/* Tiles of MR rows (MR3, MR2, MR1 for 3, 2, 1 vectors; divisors of CQ_MM_ROWS): VEX has
 * 16 ymm registers, so 6 accumulators (2 x 3, 3 x 2, 6 x 1); EVEX code reaches 32, so
 * 12 (4 x 3, 6 x 2, 12 x 1): per 4 columns 3 panel loads and 4 broadcasts feed 12
 * vpdpbusd instead of 2 broadcasts 6. The tile shape changes no output's operations. */
#ifdef CQ_HAVE_AVXVNNI_FN
I8MM2_VARIANT(vex, "avxvnni", _mm256_dpbusd_avx_epi32, 2, 3, 6)
#endif
#ifdef CQ_HAVE_VNNI256_FN
I8MM2_VARIANT(evex, "avx512vnni,avx512vl", _mm256_dpbusd_epi32, 4, 6, 12)
#endif

/* 1: AVX-VNNI, 2: AVX-512 VNNI on 256 bits, 0: neither (float32 matmat). */
static int i8mm_cpu(void) {
    const uint32_t f = cq_cpu_features();
#ifdef CQ_HAVE_AVXVNNI_FN
    if (f & CQ_CPU_AVXVNNI) return 1;
#endif
#ifdef CQ_HAVE_VNNI256_FN
    const uint32_t evex = CQ_CPU_AVX512F | CQ_CPU_AVX512VL | CQ_CPU_AVX512VNNI | CQ_CPU_OS_ZMM;
    if ((f & evex) == evex) return 2;
#endif
    (void)f;
    return 0;
}

static void i8mm_tiles(size_t nv, size_t nr, const uint8_t *w, const float *sc, const uint8_t *xp, size_t wd,
                       size_t n, float *part, size_t ldp, int first, int rowscale) {
    switch (i8mm_cpu()) {
#ifdef CQ_HAVE_AVXVNNI_FN
    case 1: i8mm2_tiles_vex(nv, nr, w, sc, xp, wd, n, part, ldp, first, rowscale); break;
#endif
#ifdef CQ_HAVE_VNNI256_FN
    case 2: i8mm2_tiles_evex(nv, nr, w, sc, xp, wd, n, part, ldp, first, rowscale); break;
#endif
    default:
        (void)nv; (void)nr; (void)w; (void)sc; (void)xp; (void)wd; (void)n; (void)part; (void)ldp; (void)first;
        (void)rowscale;
    }
}
#endif
