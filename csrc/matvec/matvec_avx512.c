/* matvec_avx512.c -- AVX-512 twin of the matvec family: the q8 (q8_row, q8_2f) and
 * q4 (q4_block, q4_tiled, q4tp) row dots and the matmat block run 16 lanes (one
 * thread on the development VM: q8_row 22.4 vs 16.2 Gweights/s in cache, 13.5 vs 12.5
 * GB/s from DRAM; q4_block 14.0 vs 12.5 Gweights/s in cache); f32/f16/bf16 (16 lanes
 * measured 12.5 vs 15.2 GB/s from DRAM for f16), q2tp, vbit and the decoders are the
 * AVX2 code of matvec_avx2_impl.h. Same contracts as the reference. */
#include "matvec_avx2_impl.h"

static inline __m512 z_i8(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

#define CQ_DOT_STREAM16(LOAD, EB, SCALAR)                                                 \
    do {                                                                                 \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                       \
        size_t c = 0;                                                                    \
        for (; c + 64 <= cols; c += 64) {                                                \
            for (size_t o_ = 0; o_ < 64 * EB; o_ += 64) /* each line once */                 \
                _mm_prefetch((const char *)(p + c * EB + o_ + CQ_PF_DIST), _MM_HINT_T1);     \
            a0 = _mm512_fmadd_ps(LOAD(p + (c + 0) * EB), _mm512_loadu_ps(x + c + 0), a0);   \
            a1 = _mm512_fmadd_ps(LOAD(p + (c + 16) * EB), _mm512_loadu_ps(x + c + 16), a1); \
            a2 = _mm512_fmadd_ps(LOAD(p + (c + 32) * EB), _mm512_loadu_ps(x + c + 32), a2); \
            a3 = _mm512_fmadd_ps(LOAD(p + (c + 48) * EB), _mm512_loadu_ps(x + c + 48), a3); \
        }                                                                                \
        for (; c + 16 <= cols; c += 16) a0 = _mm512_fmadd_ps(LOAD(p + c * EB), _mm512_loadu_ps(x + c), a0); \
        acc = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))); \
        for (; c < cols; c++) acc += (SCALAR) * x[c];                                    \
    } while (0)

/* q4 group on 16 lanes: the 16 bytes widen once; low nibbles (even elements) meet
 * xg[0..15], high nibbles (odd elements) xg[16..31] (x permuted by prep_x). */
static inline __m512 q4_gdot16(const uint8_t *nib, const float *xg) {
    const __m512i m15 = _mm512_set1_epi32(15), eight = _mm512_set1_epi32(8);
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)nib));
    __m512 lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(b, m15), eight));
    __m512 hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(b, 4), eight));
    return _mm512_fmadd_ps(hi, _mm512_loadu_ps(xg + 16), _mm512_mul_ps(lo, _mm512_loadu_ps(xg)));
}

/* q4_block / q4_tiled / q4tp rows (cols % 32 == 0): acc += gs * scale per group. */
static float q4_dot512(const cq_qmat *m, size_t r, const float *x) {
    const size_t cols = m->cols, gpr = cols / CQ_GROUP;
    const uint8_t *d = m->data;
    __m512 t0 = _mm512_setzero_ps(), t1 = t0;
    size_t g = 0;
    if (m->dtype == CQ_DT_Q4_BLOCK) {
        const uint8_t *nb = d + 16 * r * gpr, *sp = d + 16 * m->rows * gpr + 2 * r * gpr;
        float sc[8];
        for (; g + 8 <= gpr; g += 8) {
            {
                _mm_prefetch((const char *)(nb + 16 * g + CQ_PF_DIST), _MM_HINT_T1);
                _mm_prefetch((const char *)(nb + 16 * g + 64 + CQ_PF_DIST), _MM_HINT_T1);
            }
            _mm256_storeu_ps(sc, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sp + 2 * g))));
            for (int k = 0; k < 8; k += 2) {
                t0 = _mm512_fmadd_ps(q4_gdot16(nb + 16 * (g + k), x + 32 * (g + k)), _mm512_set1_ps(sc[k]), t0);
                t1 = _mm512_fmadd_ps(q4_gdot16(nb + 16 * (g + k + 1), x + 32 * (g + k + 1)), _mm512_set1_ps(sc[k + 1]), t1);
            }
        }
        for (; g < gpr; g++)
            t0 = _mm512_fmadd_ps(q4_gdot16(nb + 16 * g, x + 32 * g), _mm512_set1_ps(h2f_hw(sp + 2 * g)), t0);
    } else if (m->dtype == CQ_DT_Q4_TILED) {
        const uint8_t *tl = d + 18 * r * gpr;
        for (; g + 2 <= gpr; g += 2) {
            _mm_prefetch((const char *)(tl + 18 * g + CQ_PF_DIST), _MM_HINT_T1);
            t0 = _mm512_fmadd_ps(q4_gdot16(tl + 18 * g + 2, x + 32 * g), _mm512_set1_ps(h2f_hw(tl + 18 * g)), t0);
            t1 = _mm512_fmadd_ps(q4_gdot16(tl + 18 * g + 20, x + 32 * g + 32), _mm512_set1_ps(h2f_hw(tl + 18 * g + 18)), t1);
        }
        for (; g < gpr; g++)
            t0 = _mm512_fmadd_ps(q4_gdot16(tl + 18 * g + 2, x + 32 * g), _mm512_set1_ps(h2f_hw(tl + 18 * g)), t0);
    } else { /* q4tp */
        const size_t stride = cq_tp_stride(cols);
        const uint8_t *body = d + r * gpr * 16;
        const uint8_t *cb = d + m->rows * gpr * 16 + 4 * m->rows + r * stride;
        const float *ladder = m->aux + 32 * r;
        for (size_t g0 = 0; g0 < gpr; g0 += 64) {
            uint8_t codes[64];
            size_t ng = gpr - g0 < 64 ? gpr - g0 : 64, gi = 0;
            tp_codes(cb + 5 * (g0 / 8), stride - 5 * (g0 / 8), ng, codes);
            for (; gi + 2 <= ng; gi += 2) {
                size_t gg = g0 + gi;
                _mm_prefetch((const char *)(body + 16 * gg + CQ_PF_DIST), _MM_HINT_T1);
                t0 = _mm512_fmadd_ps(q4_gdot16(body + 16 * gg, x + 32 * gg), _mm512_set1_ps(ladder[codes[gi]]), t0);
                t1 = _mm512_fmadd_ps(q4_gdot16(body + 16 * gg + 16, x + 32 * gg + 32), _mm512_set1_ps(ladder[codes[gi + 1]]), t1);
            }
            for (; gi < ng; gi++)
                t0 = _mm512_fmadd_ps(q4_gdot16(body + 16 * (g0 + gi), x + 32 * (g0 + gi)), _mm512_set1_ps(ladder[codes[gi]]), t0);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(t0, t1));
}

static float dot_row(const cq_qmat *m, size_t r, const float *x) {
    const size_t cols = m->cols;
    float acc = 0.0f;
    switch (m->dtype) {
    case CQ_DT_Q8_ROW:
    case CQ_DT_Q8_2F: {
        const uint8_t *p = m->data + r * cols;
        CQ_DOT_STREAM16(z_i8, 1, (float)(int8_t)p[c]);
        return acc * m->aux[r];
    }
    case CQ_DT_Q4_BLOCK:
    case CQ_DT_Q4_TILED:
    case CQ_DT_Q4TP:
        if (grouped_fast(m)) return q4_dot512(m, r, x);
        return avx2_dot_row(m, r, x);
    default: return avx2_dot_row(m, r, x); /* f32/f16/bf16 measured faster on 8 lanes */
    }
}

#define dequant_row avx2_dequant_row
#define needs_prep avx2_needs_prep
#define prep_x avx2_prep_x
#define CQ_MM_ROWS 16

/* Prefill block: Y[i, j] = w[j] . X[i] for j < nr (<= 16), i < t. Register tile: 4 rows
 * x 6 inputs of 16-lane accumulators (24 zmm). Cache blocking: the columns go in chunks
 * of MM_KC; inside a chunk the decoded rows' chunk (16 x MM_KC floats) stays in L1 for
 * every group of 6 inputs and each input chunk for the 4 row quads; the tiles' partial
 * sums wait in `part` (stack) between chunks. The order depends on the shape only.
 * Measured (one thread, 512x4096, t = 64, loaded VM, best of 30): q8_row 34.5 vs 27.5
 * GMAC/s for the AVX2 block, q4_block 41.5 vs 30.9. */
#define MM_KC 512
#define MM_T 6
static void mm_tile(const float *w, size_t cols, const float *X, size_t c0, size_t c1, __m512 *p,
                    int first) {
    const float *w0 = w, *w1 = w0 + cols, *w2 = w1 + cols, *w3 = w2 + cols;
    __m512 acc[4][MM_T];
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < MM_T; b++) acc[a][b] = first ? _mm512_setzero_ps() : p[a * MM_T + b];
    for (size_t c = c0; c < c1; c += 16) {
        __m512 q0 = _mm512_loadu_ps(w0 + c), q1 = _mm512_loadu_ps(w1 + c);
        __m512 q2 = _mm512_loadu_ps(w2 + c), q3 = _mm512_loadu_ps(w3 + c);
        for (int b = 0; b < MM_T; b++) {
            __m512 v = _mm512_loadu_ps(X + b * cols + c);
            acc[0][b] = _mm512_fmadd_ps(q0, v, acc[0][b]);
            acc[1][b] = _mm512_fmadd_ps(q1, v, acc[1][b]);
            acc[2][b] = _mm512_fmadd_ps(q2, v, acc[2][b]);
            acc[3][b] = _mm512_fmadd_ps(q3, v, acc[3][b]);
        }
    }
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < MM_T; b++) p[a * MM_T + b] = acc[a][b];
}

#define MM_GROUPS 8 /* input groups per pass: the partial sums (48 KiB) live on the stack */
static void matmat_block(const float *w, size_t nr, size_t cols, const float *X, size_t t,
                         float *Y, size_t ldy) {
    const size_t cv = cols & ~(size_t)15, nq = nr / 4, ng = t / MM_T;
    if (nq == 0 || ng == 0 || cv == 0) {
        avx2_matmat_block(w, nr, cols, X, t, Y, ldy);
        return;
    }
    __m512 part[MM_GROUPS * (CQ_MM_ROWS / 4) * 4 * MM_T];
    for (size_t g0 = 0; g0 < ng; g0 += MM_GROUPS) {
        size_t gn = ng - g0 < MM_GROUPS ? ng - g0 : MM_GROUPS;
        const float *Xg = X + g0 * MM_T * cols;
        for (size_t c0 = 0; c0 < cv; c0 += MM_KC) {
            size_t c1 = c0 + MM_KC < cv ? c0 + MM_KC : cv;
            for (size_t g = 0; g < gn; g++)
                for (size_t q = 0; q < nq; q++)
                    mm_tile(w + 4 * q * cols, cols, Xg + g * MM_T * cols, c0, c1,
                            part + (g * nq + q) * 4 * MM_T, c0 == 0);
        }
        for (size_t g = 0; g < gn; g++)
            for (size_t q = 0; q < nq; q++)
                for (int a = 0; a < 4; a++)
                    for (int b = 0; b < MM_T; b++) {
                        size_t j = 4 * q + a, i = (g0 + g) * MM_T + b;
                        float s = _mm512_reduce_add_ps(part[(g * nq + q) * 4 * MM_T + a * MM_T + b]);
                        for (size_t c = cv; c < cols; c++) s += w[j * cols + c] * X[i * cols + c];
                        Y[i * ldy + j] = s;
                    }
    }
    /* rows past the last quad, and inputs past the last group of 6 */
    if (4 * nq < nr)
        avx2_matmat_block(w + 4 * nq * cols, nr - 4 * nq, cols, X, ng * MM_T, Y + 4 * nq, ldy);
    if (ng * MM_T < t)
        avx2_matmat_block(w, nr, cols, X + ng * MM_T * cols, t - ng * MM_T, Y + ng * MM_T * ldy, ldy);
}

#include "matvec_drivers.h"

CQ_MATVEC_OPS(cq_matvec_avx512);
