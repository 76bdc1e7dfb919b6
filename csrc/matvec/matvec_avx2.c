/* matvec_avx2.c -- AVX2/FMA twin of matvec_ref.c (row kernels in matvec_avx2_impl.h). */
#include "matvec_avx2_impl.h"

#define dot_row avx2_dot_row
#define dequant_row avx2_dequant_row
#define needs_prep avx2_needs_prep
#define prep_x avx2_prep_x

/* Rows decoded per matmat block: the block (CQ_MM_ROWS x cols floats) stays in L2. */
#define CQ_MM_ROWS 16

/* Y[i, j] = w[j] . X[i] for j < nr, i < t; 4 rows x 3 inputs of 8-lane accumulators. */
static void matmat_block(const float *w, size_t nr, size_t cols, const float *X, size_t t,
                         float *Y, size_t ldy) {
    size_t j = 0;
    for (; j + 4 <= nr; j += 4) {
        const float *w0 = w + j * cols, *w1 = w0 + cols, *w2 = w1 + cols, *w3 = w2 + cols;
        size_t i = 0;
        for (; i + 3 <= t; i += 3) {
            const float *x0 = X + i * cols, *x1 = x0 + cols, *x2 = x1 + cols;
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
            __m256 a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
            size_t c = 0;
            for (; c + 8 <= cols; c += 8) {
                __m256 v0 = _mm256_loadu_ps(x0 + c), v1 = _mm256_loadu_ps(x1 + c), v2 = _mm256_loadu_ps(x2 + c);
                __m256 q = _mm256_loadu_ps(w0 + c);
                a00 = _mm256_fmadd_ps(q, v0, a00); a01 = _mm256_fmadd_ps(q, v1, a01); a02 = _mm256_fmadd_ps(q, v2, a02);
                q = _mm256_loadu_ps(w1 + c);
                a10 = _mm256_fmadd_ps(q, v0, a10); a11 = _mm256_fmadd_ps(q, v1, a11); a12 = _mm256_fmadd_ps(q, v2, a12);
                q = _mm256_loadu_ps(w2 + c);
                a20 = _mm256_fmadd_ps(q, v0, a20); a21 = _mm256_fmadd_ps(q, v1, a21); a22 = _mm256_fmadd_ps(q, v2, a22);
                q = _mm256_loadu_ps(w3 + c);
                a30 = _mm256_fmadd_ps(q, v0, a30); a31 = _mm256_fmadd_ps(q, v1, a31); a32 = _mm256_fmadd_ps(q, v2, a32);
            }
            float s[4][3] = {{hsum8(a00), hsum8(a01), hsum8(a02)}, {hsum8(a10), hsum8(a11), hsum8(a12)},
                             {hsum8(a20), hsum8(a21), hsum8(a22)}, {hsum8(a30), hsum8(a31), hsum8(a32)}};
            for (; c < cols; c++)
                for (int jj = 0; jj < 4; jj++)
                    for (int ii = 0; ii < 3; ii++) s[jj][ii] += w[(j + jj) * cols + c] * X[(i + ii) * cols + c];
            for (int jj = 0; jj < 4; jj++)
                for (int ii = 0; ii < 3; ii++) Y[(i + ii) * ldy + j + jj] = s[jj][ii];
        }
        for (; i < t; i++) {
            const float *x0 = X + i * cols;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            size_t c = 0;
            for (; c + 8 <= cols; c += 8) {
                __m256 v = _mm256_loadu_ps(x0 + c);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + c), v, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + c), v, a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + c), v, a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + c), v, a3);
            }
            float s[4] = {hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3)};
            for (; c < cols; c++)
                for (int jj = 0; jj < 4; jj++) s[jj] += w[(j + jj) * cols + c] * x0[c];
            for (int jj = 0; jj < 4; jj++) Y[i * ldy + j + jj] = s[jj];
        }
    }
    for (; j < nr; j++) {
        const float *w0 = w + j * cols;
        for (size_t i = 0; i < t; i++) {
            const float *x0 = X + i * cols;
            __m256 a0 = _mm256_setzero_ps();
            size_t c = 0;
            for (; c + 8 <= cols; c += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + c), _mm256_loadu_ps(x0 + c), a0);
            float s = hsum8(a0);
            for (; c < cols; c++) s += w0[c] * x0[c];
            Y[i * ldy + j] = s;
        }
    }
}

#include "matvec_drivers.h"

CQ_MATVEC_OPS(cq_matvec_avx2);
