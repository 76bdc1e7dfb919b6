/* matvec_avx512.c -- AVX-512 twin: for now the AVX2 row kernels (shared header). */
#include "matvec_avx2_impl.h"

#define dot_row avx2_dot_row
#define dequant_row avx2_dequant_row
#define needs_prep avx2_needs_prep
#define prep_x avx2_prep_x
#define CQ_MM_ROWS 16

static void matmat_block(const float *w, size_t nr, size_t cols, const float *X, size_t t,
                         float *Y, size_t ldy) {
    for (size_t i = 0; i < t; i++)
        for (size_t j = 0; j < nr; j++) {
            const float *wr = w + j * cols, *xr = X + i * cols;
            __m256 a0 = _mm256_setzero_ps();
            size_t c = 0;
            for (; c + 8 <= cols; c += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + c), _mm256_loadu_ps(xr + c), a0);
            float s = hsum8(a0);
            for (; c < cols; c++) s += wr[c] * xr[c];
            Y[i * ldy + j] = s;
        }
}

#include "matvec_drivers.h"

CQ_MATVEC_OPS(cq_matvec_avx512);
