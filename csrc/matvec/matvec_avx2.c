/* matvec_avx2.c -- AVX2/FMA twin of matvec_ref.c (row kernels in matvec_avx2_impl.h). */
#include "matvec_avx2_impl.h"

#define dequant_row avx2_dequant_row
#define needs_prep avx2_needs_prep
#define prep_x avx2_prep_x
/* q8 rows (q8_rows.h) on 8 lanes: acc is eight accumulators (64 floats). Against the
 * generic 8-lane stream (four accumulators, 32 columns a step): 4096 x 4096 from DRAM
 * 79-80 -> 84-86 % of the read probe on one and two threads (2026-11-30). */
static inline void q8_segment(const uint8_t *p, const float *x, const uint8_t *far, const uint8_t *near, size_t n,
                              float *acc) {
    __m256 a[8];
    for (int i = 0; i < 8; i++) a[i] = _mm256_load_ps(acc + 8 * i);
    for (const uint8_t *const e = p + n; p < e; p += 64, x += 64, far += 64, near += 64) {
        _mm_prefetch((const char *)far, _MM_HINT_T1);
        _mm_prefetch((const char *)near, _MM_HINT_T0);
        for (int i = 0; i < 8; i++) a[i] = _mm256_fmadd_ps(ld_i8x8(p + 8 * i), _mm256_loadu_ps(x + 8 * i), a[i]);
    }
    for (int i = 0; i < 8; i++) _mm256_store_ps(acc + 8 * i, a[i]);
}
static inline float q8_finish(const float *acc, const uint8_t *p, const float *x, size_t c, size_t cols) {
    __m256 s = _mm256_load_ps(acc);
    for (; c + 8 <= cols; c += 8) s = _mm256_fmadd_ps(ld_i8x8(p + c), _mm256_loadu_ps(x + c), s);
    for (int i = 1; i < 8; i++) s = _mm256_add_ps(s, _mm256_load_ps(acc + 8 * i));
    float r = cq_hsum8(s);
    for (; c < cols; c++) r += (float)(int8_t)p[c] * x[c];
    return r;
}
#include "q8_rows.h"
static float dot_row(const cq_qmat *m, size_t r, const float *x) {
    if (m->dtype == CQ_DT_Q8_ROW || m->dtype == CQ_DT_Q8_2F) return q8_row_dot(m, r, x);
    return avx2_dot_row(m, r, x);
}

#define CQ_HAVE_XQ_BUILD
#define xq_build avx2_xq_build
#define CQ_HAVE_I8_ROWS
static void i8_dot_rows(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *xq, float *out) {
    for (size_t j = 0; j < nr; j++) out[j] = avx2_i8_row(m, r0 + j, xq);
}

/* matmat: the packed GEMM of matmat_packed.h on 8 lanes. 16 ymm registers: 12
 * accumulators (4 rows x 3 vectors, 6 x 2, 12 x 1), the input vectors, a broadcast. */
#define MM_VL 8
#define MM_NV 3 /* panels of 24 inputs */
typedef __m256 mm_vec;
typedef __m256i mm_idx;
#define mm_load _mm256_loadu_ps
#define mm_store _mm256_storeu_ps
#define mm_set1 _mm256_set1_ps
#define mm_fma _mm256_fmadd_ps
#define mm_zero _mm256_setzero_ps
static inline mm_idx mm_gather_idx(size_t stride) {
    return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)stride));
}
static inline mm_vec mm_gather(mm_idx at, const float *base, size_t live) {
    const __m256i live_lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)live), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_mask_i32gather_ps(_mm256_setzero_ps(), base, at, _mm256_castsi256_ps(live_lanes), 4);
}
#define MM_SHAPES(X) X(4, 3) X(6, 2) X(12, 1)
#define mm_decode avx2_dequant_span
static size_t mm_column(const cq_qmat *m, size_t c) { (void)m; return c; } /* natural order */
#include "matmat_packed.h"

#include "matvec_drivers.h"

CQ_MATVEC_OPS(cq_matvec_avx2);
