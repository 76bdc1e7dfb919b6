/* matvec_avx2.c -- AVX2/FMA twin of matvec_ref.c (row kernels in matvec_avx2_impl.h). */
#include "matvec_avx2_impl.h"

#define dequant_row avx2_dequant_row
#define needs_prep avx2_needs_prep
#define prep_x avx2_prep_x
/* ---- Rows as four weight streams (CQ_ROW_STREAMS, matvec_drivers.h) ----
 * Each kernel computes nk <= 4 rows r0 + k*L side by side; a row's arithmetic is the
 * same whatever nk is, so dot_row (nk = 1), matvec, rows_dot and any thread count give
 * the same bits. CQ_LANES_AI: the nk-row bodies are instantiated for constant nk so the
 * accumulators stay in registers. */
#ifndef CQ_ROW_STREAMS
#define CQ_ROW_STREAMS 4
#endif
#if CQ_ROW_STREAMS < 2 || CQ_ROW_STREAMS > 4
#error "AVX2 reads two to four streams (CQ_LANES_DISPATCH; one: the drivers' row_streams)"
#endif
#define CQ_LANE_PF(a) _mm_prefetch((const char *)(a) + CQ_LANE_PF_NEAR, _MM_HINT_T0) /* qmat.h */
#if defined(__GNUC__)
#define CQ_LANES_AI static inline __attribute__((always_inline))
#else
#define CQ_LANES_AI static __forceinline
#endif
#define CQ_LANES_DISPATCH(BODY, nk, ...)     \
    switch (nk) {                            \
    case 4: BODY(__VA_ARGS__, 4); break;     \
    case 3: BODY(__VA_ARGS__, 3); break;     \
    case 2: BODY(__VA_ARGS__, 2); break;     \
    default: BODY(__VA_ARGS__, 1); break;    \
    }

/* 8-lane streams (f32, f16, bf16, q8_row, q8_2f): per row two accumulators, columns
 * 16j .. 16j+7 and 16j+8 .. 16j+15, 64 columns a step with one prefetch per line per
 * row; then 16- and 8-column steps, then the scalar tail. LOAD(p) gives the 8
 * floats of the EB-byte elements at p. */
#define CQ_LANES8(NAME, LOAD, EB, SCALAR)                                                    \
    CQ_LANES_AI void NAME(const uint8_t *p0, size_t ls, const float *x, size_t cols, float *res, \
                          const int nk) {                                                    \
        __m256 a0[4], a1[4];                                                                 \
        const uint8_t *pk[4];                                                                \
        for (int k = 0; k < nk; k++) {                                                       \
            a0[k] = a1[k] = _mm256_setzero_ps();                                             \
            pk[k] = p0 + k * ls;                                                             \
        }                                                                                    \
        const float *xc = x, *const xe = x + (cols & ~(size_t)63);                           \
        for (; xc < xe; xc += 64) {                                                          \
            for (int k = 0; k < nk; k++)                                                     \
                for (int o = 0; o < 64 * EB; o += 64) CQ_LANE_PF(pk[k] + o);               \
            for (int j = 0; j < 64; j += 16) {                                               \
                const __m256 x0 = _mm256_loadu_ps(xc + j), x1 = _mm256_loadu_ps(xc + j + 8); \
                for (int k = 0; k < nk; k++) {                                               \
                    a0[k] = _mm256_fmadd_ps(LOAD(pk[k] + j * EB), x0, a0[k]);                \
                    a1[k] = _mm256_fmadd_ps(LOAD(pk[k] + (j + 8) * EB), x1, a1[k]);          \
                }                                                                            \
            }                                                                                \
            for (int k = 0; k < nk; k++) pk[k] += 64 * EB;                                   \
        }                                                                                    \
        size_t c = (size_t)(xc - x);                                                         \
        for (; c + 16 <= cols; c += 16)                                                      \
            for (int k = 0; k < nk; k++) {                                                   \
                const uint8_t *p = p0 + k * ls + c * EB;                                     \
                a0[k] = _mm256_fmadd_ps(LOAD(p), _mm256_loadu_ps(x + c), a0[k]);             \
                a1[k] = _mm256_fmadd_ps(LOAD(p + 8 * EB), _mm256_loadu_ps(x + c + 8), a1[k]); \
            }                                                                                \
        if (c + 8 <= cols) {                                                                 \
            for (int k = 0; k < nk; k++)                                                     \
                a0[k] = _mm256_fmadd_ps(LOAD(p0 + k * ls + c * EB), _mm256_loadu_ps(x + c), a0[k]); \
            c += 8;                                                                          \
        }                                                                                    \
        for (int k = 0; k < nk; k++) {                                                       \
            const uint8_t *p = p0 + k * ls;                                                  \
            float acc = cq_hsum8(_mm256_add_ps(a0[k], a1[k]));                               \
            for (size_t cc = c; cc < cols; cc++) acc += (SCALAR) * x[cc];                    \
            res[k] = acc;                                                                    \
        }                                                                                    \
    }
CQ_LANES8(lanes_f32, ld_f32x8, 4, cq_ldf32(p + 4 * cc))
CQ_LANES8(lanes_f16, ld_f16x8, 2, cq_h2f(cq_ld16(p + 2 * cc)))
CQ_LANES8(lanes_bf16, ld_bf16x8, 2, cq_bf2f(cq_ld16(p + 2 * cc)))
CQ_LANES8(lanes_q8, ld_i8x8, 1, (float)(int8_t)p[cc])

#define LANES8_CALL(F, p0, ls, x, cols, res, NK) F(p0, ls, x, cols, res, NK)
/* Streams a matrix's rows are read as: four for the 8-lane kernels, which memory
 * bounds; one (rows in order, as before) for the grouped q4/q2 dtypes, exact or with
 * int8 activations, whose decode bounds them: read as four lanes their rows ran
 * slower (docs/PERFORMANCE.md §9, "Memory streams"). */
static int row_streams(const cq_qmat *m) {
    switch (m->dtype) {
    case CQ_DT_F32: case CQ_DT_F16: case CQ_DT_BF16: case CQ_DT_Q8_ROW: case CQ_DT_Q8_2F: return CQ_ROW_STREAMS;
    default: return 1;
    }
}

/* rows r0 + k*L (k < nk) into out[k*L] (matvec_drivers.h: CQ_ROW_STREAMS) */
static void dot_lanes(const cq_qmat *m, size_t r0, size_t L, int nk, const float *x, float *out) {
    float res[4];
    const size_t cols = m->cols;
    switch (m->dtype) {
    case CQ_DT_F32: CQ_LANES_DISPATCH(LANES8_CALL, nk, lanes_f32, m->data + 4 * r0 * cols, 4 * L * cols, x, cols, res); break;
    case CQ_DT_F16: CQ_LANES_DISPATCH(LANES8_CALL, nk, lanes_f16, m->data + 2 * r0 * cols, 2 * L * cols, x, cols, res); break;
    case CQ_DT_BF16: CQ_LANES_DISPATCH(LANES8_CALL, nk, lanes_bf16, m->data + 2 * r0 * cols, 2 * L * cols, x, cols, res); break;
    case CQ_DT_Q8_ROW:
    case CQ_DT_Q8_2F: /* x is col * x for q8_2f (prep_x): rs * sum q * xp */
        CQ_LANES_DISPATCH(LANES8_CALL, nk, lanes_q8, m->data + r0 * cols, L * cols, x, cols, res);
        for (int k = 0; k < nk; k++) res[k] *= m->aux[r0 + k * L];
        break;
    default:
        /* (row_streams sends no other dtype here but through dot_row) grouped
         * dtypes by their row kernel, vbit / odd grouped shapes by the reference */
        for (int k = 0; k < nk; k++) res[k] = avx2_dot_row(m, r0 + k * L, x);
    }
    for (int k = 0; k < nk; k++) out[k * L] = res[k];
}

static float dot_row(const cq_qmat *m, size_t r, const float *x) {
    float y;
    dot_lanes(m, r, 1, 1, x, &y);
    return y;
}

#define CQ_HAVE_XQ_BUILD
#define xq_build avx2_xq_build
#define CQ_HAVE_I8_ROWS
/* int8 activations (spec: ref_i8_row): the q4 rows (q4_block, q4_tiled, q4tp) are
 * q4_i8_rows, after the int8 matmat tiles whose CPU dispatch (i8mm_cpu) it shares. */
static void q4_i8_rows(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *xq, float *out);

/* q8_row / q8_2f, one group of 32 a step: |w| (u8) times xq carrying w's sign
 * (vpsignb), so the u8 x s8 pairs stay within int16 (|w| <= 128, |xq| <= 127); per
 * group the 8 lane sums are scaled by d in float, and the row by its scale. */
static float i8_row_q8(const cq_qmat *m, size_t r, const cq_xq *xq) {
    const size_t gpr = m->cols / CQ_GROUP;
    const uint8_t *w = m->data + r * m->cols;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 f0 = _mm256_setzero_ps(), f1 = f0;
    for (size_t g = 0; g < gpr; g++) {
        const uint8_t *p = w + CQ_GROUP * g;
        if (!(g & 1)) CQ_STREAM_PF(p);
        const __m256i v = _mm256_loadu_si256((const __m256i *)p);
        const __m256i xs = _mm256_sign_epi8(_mm256_load_si256((const __m256i *)(xq->q + CQ_GROUP * g)), v);
        const __m256i isum = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(v), xs), ones);
        if (g & 1) f1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_broadcast_ss(xq->d + g), f1);
        else f0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_broadcast_ss(xq->d + g), f0);
    }
    return cq_hsum8(_mm256_add_ps(f0, f1)) * m->aux[r];
}

/* q2tp, four groups (32 code bytes, half a CQ_XQ_Q2 block) a step: each phase's u8
 * weights 2v (Q2_PHASE) times its 32 xq bytes, the four phases' int16 pair sums added
 * (at most 4 * 2 * 6 * 127) before one vpmaddwd; from the bias (-3 * the sum of xq),
 * lane L holds half of group L/2, scaled by tile scale * 0.5 * d. */
static float i8_row_q2(const cq_qmat *m, size_t r, const cq_xq *xq) {
    const size_t gpr = m->cols / CQ_GROUP;
    const uint8_t *body = m->data + 8 * r * gpr;
    const __m256i ones = _mm256_set1_epi16(1), m6 = _mm256_set1_epi8(6);
    const __m256i spread = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    float sw[64 + 4];
    __m256 f0 = _mm256_setzero_ps(), f1 = f0;
    for (size_t g0 = 0; g0 < gpr; g0 += 64) {
        const size_t ng = gpr - g0 < 64 ? gpr - g0 : 64;
        avx2_group_scales(m, r, g0, ng, sw);
        for (size_t k = 0; k < ng; k++) sw[k] *= 0.5f;
        for (int k = 0; k < 4; k++) sw[ng + k] = 0.0f;
        for (size_t gi = 0; gi < ng; gi += 4) {
            const size_t g = g0 + gi, n = ng - gi < 4 ? ng - gi : 4;
            const uint8_t *p = body + 8 * g;
            if (!(gi & 4)) CQ_STREAM_PF(p);
            const __m256i v = n == 4 ? _mm256_loadu_si256((const __m256i *)p)
                                     : _mm256_maskload_epi32((const int *)(const void *)p,
                                                             _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(2 * n)),
                                                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
            const int8_t *q = xq->q + 256 * (g / 8) + 32 * ((g / 4) & 1);
            __m256i p16 = _mm256_maddubs_epi16(Q2_PHASE(_mm256_slli_epi16, _mm256_srli_epi16, _mm256_and_si256, v, 0, m6),
                                               _mm256_load_si256((const __m256i *)q));
#define Q2_ADD(j)                                                                                                   \
    p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(Q2_PHASE(_mm256_slli_epi16, _mm256_srli_epi16, _mm256_and_si256, v, j, m6), \
                                                     _mm256_load_si256((const __m256i *)(q + 64 * (j)))))
            Q2_ADD(1);
            Q2_ADD(2);
            Q2_ADD(3);
#undef Q2_ADD
            const size_t lane = 16 * (g / 8) + 8 * ((g / 4) & 1);
            const __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(p16, ones), _mm256_load_si256((const __m256i *)(xq->bias + lane)));
            const __m256 sc = _mm256_mul_ps(_mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sw + gi)), spread),
                                            _mm256_load_ps(xq->dl + lane));
            if (gi & 4) f1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), sc, f1);
            else f0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), sc, f0);
        }
    }
    return cq_hsum8(_mm256_add_ps(f0, f1));
}

#include "ggml_kq_avx2.h"
static void i8_dot_rows(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *xq, float *out) {
    if (kq_is(m->dtype)) {
        kq_i8_rows(m, r0, nr, xq, out);
        return;
    }
    if (ggml_q32_block_bytes(m->dtype)) {
        g32_i8_rows_avx2(m, r0, nr, xq, out);
        return;
    }
    switch (m->dtype) {
    case CQ_DT_Q8_ROW:
    case CQ_DT_Q8_2F:
        for (size_t j = 0; j < nr; j++) out[j] = i8_row_q8(m, r0 + j, xq);
        break;
    case CQ_DT_Q2TP:
        for (size_t j = 0; j < nr; j++) out[j] = i8_row_q2(m, r0 + j, xq);
        break;
    default: q4_i8_rows(m, r0, nr, xq, out);
    }
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
/* 8 inputs x 8 columns of X by eight row loads and a register transpose: a gather
 * per column ran ~37 cycles on Zen 3 (its eight lanes on eight rows), which made
 * packing a sizeable part of a t = 64 matmat in cache. */
#define MM_HAVE_PACK_BLOCK
static inline void mm_pack_block(const float *src, size_t cols, size_t live, float *dst, size_t wd) {
    __m256 r[8], u[8], v[8];
    for (size_t k = 0; k < 8; k++) r[k] = k < live ? _mm256_loadu_ps(src + k * cols) : _mm256_setzero_ps();
    for (int k = 0; k < 8; k += 2) {
        u[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
        u[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
    }
    for (int k = 0; k < 8; k += 4) {
        v[k] = _mm256_shuffle_ps(u[k], u[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
        v[k + 1] = _mm256_shuffle_ps(u[k], u[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
        v[k + 2] = _mm256_shuffle_ps(u[k + 1], u[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
        v[k + 3] = _mm256_shuffle_ps(u[k + 1], u[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int j = 0; j < 4; j++) { /* v[j]: column j (lanes 0-3) and j + 4 (lanes 4-7) of rows 0-3; v[j + 4] rows 4-7 */
        _mm256_storeu_ps(dst + j * wd, _mm256_permute2f128_ps(v[j], v[j + 4], 0x20));
        _mm256_storeu_ps(dst + (j + 4) * wd, _mm256_permute2f128_ps(v[j], v[j + 4], 0x31));
    }
}
#define MM_SHAPES(X) X(4, 3) X(6, 2) X(12, 1)
#define mm_decode avx2_dequant_span
static size_t mm_column(const cq_qmat *m, size_t c) { (void)m; return c; } /* natural order */
#include "matmat_packed.h"
/* int8 matmat where the CPU has a 256-bit vpdpbusd (AVX-VNNI, or AVX-512 VNNI + VL) */
#define group_scales avx2_group_scales
#include "matmat_i8_avx2.h"
#include "ggml_kq_matmat_avx2.h"

/* matvec_batch with int8 x (CQ_HAVE_I8_MULTI in matvec_drivers.h): q8 rows against
 * several inputs at once, each 32-byte group of a row loaded and prepared once for
 * every input of the tile. Each input's integer sums, conversions and multiply-adds
 * into its two accumulators (by g & 1) are i8_row_q8's in its order, and the row ends
 * as it does, so every output equals i8_row_q8 of that input bit for bit. Integer
 * sums are exact, so they may be formed differently: where the CPU has a 256-bit
 * vpdpbusd (i8mm_cpu: AVX-VNNI, or AVX-512 VNNI + VL) the u8 operand is the weights
 * plus 128 (an xor per row and group, shared by the inputs), the s8 one xq as it is,
 * and the sum starts from the input's -128 * (each lane's four xq summed), made once
 * per call (i8_multi_prep); elsewhere |w| is shared and each input takes w's sign
 * (vpsignb) as in i8_row_q8. Tiles of R rows by up to four inputs, as the registers
 * allow (16 for VEX code: 1 x 4; 32 for EVEX: 2 x 4). */
#include "i8_multi.h"
#define Q8M2_STEP(DOT, VNNI, g, F)                                                                        \
    do {                                                                                                  \
        __m256i v_[2], a_[2];                                                                             \
        for (int i = 0; i < R; i++) {                                                                     \
            const uint8_t *p_ = w + i * cols + CQ_GROUP * (g);                                            \
            if (!((g) & 1)) CQ_STREAM_PF(p_);                                                             \
            v_[i] = _mm256_loadu_si256((const __m256i *)p_);                                              \
            a_[i] = VNNI ? _mm256_xor_si256(v_[i], top) : _mm256_abs_epi8(v_[i]);                         \
        }                                                                                                 \
        for (int k = 0; k < J; k++) {                                                                     \
            const __m256i x_ = _mm256_load_si256((const __m256i *)(xq[k]->q + CQ_GROUP * (g)));           \
            const __m256 d_ = _mm256_broadcast_ss(xq[k]->d + (g));                                        \
            for (int i = 0; i < R; i++) {                                                                 \
                const __m256i s_ = VNNI ? DOT(_mm256_load_si256((const __m256i *)(corr[k] + 8 * (g))), a_[i], x_) \
                                        : DOT(zero, a_[i], _mm256_sign_epi8(x_, v_[i]));                  \
                F[i][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s_), d_, F[i][k]);                           \
            }                                                                                             \
        }                                                                                                 \
    } while (0)
#define Q8M2_VARIANT(SUF, TARGET, DOT, VNNI, RMAX)                                                         \
    static inline __attribute__((always_inline, target(TARGET))) void q8m2_tile_##SUF(                     \
        const cq_qmat *m, size_t r, const cq_xq *const *xq, const int32_t *const *corr, float *Y, size_t ldy, \
        const int R, const int J) {                                                                       \
        const size_t cols = m->cols, gpr = cols / CQ_GROUP;                                               \
        const uint8_t *w = m->data + r * cols;                                                            \
        const __m256i zero = _mm256_setzero_si256(), top = _mm256_set1_epi8((char)0x80);                  \
        __m256 f0[2][4], f1[2][4];                                                                        \
        (void)zero, (void)top, (void)corr;                                                                \
        for (int i = 0; i < R; i++)                                                                       \
            for (int k = 0; k < J; k++) f0[i][k] = f1[i][k] = _mm256_setzero_ps();                        \
        for (size_t g = 0; g < gpr; g += 2) {                                                             \
            Q8M2_STEP(DOT, VNNI, g, f0);                                                                  \
            if (g + 1 < gpr) Q8M2_STEP(DOT, VNNI, g + 1, f1);                                             \
        }                                                                                                 \
        for (int i = 0; i < R; i++)                                                                       \
            for (int k = 0; k < J; k++) Y[k * ldy + r + i] = cq_hsum8(_mm256_add_ps(f0[i][k], f1[i][k])) * m->aux[r + i]; \
    }                                                                                                     \
    __attribute__((target(TARGET))) static void q8m2_rows_##SUF(const cq_qmat *m, size_t r0, size_t nr,  \
                                                                const cq_xq *const *xq,                   \
                                                                const int32_t *const *corr, size_t t,     \
                                                                float *Y, size_t ldy) {                   \
        I8M_ROWS(q8m2_tile_##SUF, RMAX)                                                                   \
    }

static inline __m256i q8m2_madd(__m256i acc, __m256i u8, __m256i s8) { /* vpmaddubsw + vpmaddwd */
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), _mm256_set1_epi16(1)));
}
Q8M2_VARIANT(madd, "avx2", q8m2_madd, 0, 1)
#ifdef CQ_HAVE_AVXVNNI_FN
Q8M2_VARIANT(vex, "avxvnni", _mm256_dpbusd_avx_epi32, 1, 1)
#endif
#ifdef CQ_HAVE_VNNI256_FN
Q8M2_VARIANT(evex, "avx512vnni,avx512vl", _mm256_dpbusd_epi32, 1, 2)
#endif

/* q4_block, q4_tiled, q4tp with int8 x, one or two rows (the row kernels of
 * i8_dot_rows). Two groups per 256-bit register: their 32 nibble bytes split into low
 * and high nibbles meet xq's evens and odds of the same two groups (qmat.h: a block of
 * four keeps each half contiguous); DOT2 sums the u8 x s8 products per 4-byte lane from
 * xq's bias (vpdpbusd where the CPU has one, else vpmaddubsw + vpmaddwd: the same
 * integers), lanes 0-3 holding group g and 4-7 group g+1. Four such steps (8 groups)
 * are folded at a time: two rounds of unpack + add sum each group's four lanes (exact
 * integers), one vpermd puts the 8 groups in column order, and one convert, scale
 * multiply (scale * d) and FMA per 8 groups replace the per-step scale broadcast,
 * multiply, convert and FMA. Chunks start at multiples of 8 groups of the row, the
 * accumulator is one register and the row ends with its horizontal sum: the same float
 * operations in the same order in every variant, in the two-row kernel and in the
 * multi-input tiles (q4m2), so they agree bit for bit. Scales are decoded 64 groups at
 * a time. (Read as four lanes side by side these rows ran slower: drv_streams reads
 * every int8 row in row order.) */
static const int32_t Q4_GROUP_ORDER8[8] = {0, 4, 1, 5, 2, 6, 3, 7};
static const int32_t Q4_FIRST8[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
static inline __m256i q4_pair8(__m256i a, __m256i b) {
    return _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
}
/* f + (the 8 groups' integer sums) * (sc * d), n of them valid (sc is zero past n) */
static inline __m256 q4_fold8(__m256 f, __m256i ab, __m256i cd, __m256 sc, const float *d, size_t n) {
    const __m256i u = _mm256_permutevar8x32_epi32(
        _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd)),
        _mm256_loadu_si256((const __m256i *)Q4_GROUP_ORDER8));
    const __m256 dv = n >= 8 ? _mm256_loadu_ps(d)
                             : _mm256_maskload_ps(d, _mm256_loadu_si256((const __m256i *)(Q4_FIRST8 + 8 - n)));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(u), _mm256_mul_ps(sc, dv), f);
}
/* groups g and g+1 (the second only if two) of a row, nibbles at p, gs bytes apart
 * (contiguous for q4_block and q4tp: one load) */
static inline __m256i q4_nibbles2(const uint8_t *p, size_t gs, int two) {
    if (gs == 16 && two) return _mm256_loadu_si256((const __m256i *)p);
    return _mm256_set_m128i(two ? _mm_loadu_si128((const __m128i *)(p + gs)) : _mm_setzero_si128(),
                            _mm_loadu_si128((const __m128i *)p));
}
#define Q4R_SUM(DOT2, v, qe, bias)                                                                        \
    DOT2(bias, _mm256_and_si256(v, m0f), _mm256_load_si256((const __m256i *)(qe)),                        \
         _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f), _mm256_load_si256((const __m256i *)((qe) + 64)))
/* q4r_tile's whole chunks of 8 groups (gi + 8 <= ng), with the group stride GS a
 * constant and no per-step tests: the same loads, integer sums and fold as its general
 * chunk (which takes the row's last, partial chunk), so the same bits. The weights are
 * prefetched once per 64-byte line (q4_block, q4tp: every other step) or per 72-byte
 * block of four groups (q4_tiled), not once per step (most of those pairs were repeats:
 * 2-3 % of a row in cache). With the weights in cache the per-step tests and branches
 * cost about as much as the arithmetic. */
#define Q4R_FULL_CHUNKS(DOT2, GS)                                                                         \
    for (; gi + 8 <= ng; gi += 8) {                                                                       \
        __m256i s[2][4];                                                                                  \
        for (int k = 0; k < 4; k++) {                                                                     \
            const size_t g = g0 + gi + 2 * (size_t)k;                                                     \
            const int8_t *qe = xq->q + 128 * (g / 4) + 16 * (g % 4);                                     \
            const __m256i bias = _mm256_load_si256((const __m256i *)(xq->bias + 4 * g));                  \
            for (int i = 0; i < R; i++) {                                                                 \
                const uint8_t *p = nb + i * (GS) * gpr + (GS) * g;                                        \
                if (!(k & 1)) {                                                                           \
                    if ((GS) == 18)                                                                       \
                        CQ_STREAM_PF_SPAN(p - 2, 72);                                                     \
                    else                                                                                  \
                        CQ_STREAM_PF(p);                                                                  \
                }                                                                                         \
                s[i][k] = Q4R_SUM(DOT2, q4_nibbles2(p, (GS), 1), qe, bias);                               \
            }                                                                                             \
        }                                                                                                 \
        for (int i = 0; i < R; i++)                                                                       \
            f[i] = q4_fold8(f[i], q4_pair8(s[i][0], s[i][1]), q4_pair8(s[i][2], s[i][3]),                 \
                            _mm256_loadu_ps(sw[i] + gi), xq->d + g0 + gi, 8);                             \
    }
#define Q4R_VARIANT(SUF, TARGET, DOT2)                                                                     \
    static inline __attribute__((always_inline, target(TARGET))) void q4r_tile_##SUF(                      \
        const cq_qmat *m, size_t r, const cq_xq *xq, float *out, const int R) {                           \
        const size_t gpr = m->cols / CQ_GROUP, gs = m->dtype == CQ_DT_Q4_TILED ? 18 : 16;                 \
        const uint8_t *nb = m->data + gs * r * gpr + (gs == 18 ? 2 : 0);                                  \
        const __m256i m0f = _mm256_set1_epi8(0x0F);                                                       \
        float sw[2][64 + 8];                                                                              \
        __m256 f[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};                                         \
        for (size_t g0 = 0; g0 < gpr; g0 += 64) {                                                         \
            const size_t ng = gpr - g0 < 64 ? gpr - g0 : 64;                                              \
            for (int i = 0; i < R; i++) {                                                                 \
                avx2_group_scales(m, r + i, g0, ng, sw[i]);                                               \
                _mm256_storeu_ps(sw[i] + ng, _mm256_setzero_ps());                                        \
            }                                                                                             \
            size_t gi = 0;                                                                                \
            if (gs == 18) {                                                                               \
                Q4R_FULL_CHUNKS(DOT2, 18)                                                                 \
            } else {                                                                                      \
                Q4R_FULL_CHUNKS(DOT2, 16)                                                                 \
            }                                                                                             \
            for (; gi < ng; gi += 8) {                                                                    \
                __m256i s[2][4];                                                                          \
                for (int k = 0; k < 4; k++) {                                                             \
                    const size_t gk = gi + 2 * (size_t)k, g = g0 + gk;                                    \
                    if (gk >= ng) {                                                                       \
                        s[0][k] = s[1][k] = _mm256_setzero_si256();                                       \
                        continue;                                                                         \
                    }                                                                                     \
                    const int8_t *qe = xq->q + 128 * (g / 4) + 16 * (g % 4);                             \
                    const __m256i bias = _mm256_load_si256((const __m256i *)(xq->bias + 4 * g));          \
                    for (int i = 0; i < R; i++) {                                                         \
                        const uint8_t *p = nb + i * gs * gpr + gs * g;                                    \
                        CQ_STREAM_PF(p);                                                                  \
                        const __m256i v = q4_nibbles2(p, gs, gk + 1 < ng);                                \
                        s[i][k] = Q4R_SUM(DOT2, v, qe, bias);                                             \
                    }                                                                                     \
                }                                                                                         \
                for (int i = 0; i < R; i++)                                                               \
                    f[i] = q4_fold8(f[i], q4_pair8(s[i][0], s[i][1]), q4_pair8(s[i][2], s[i][3]),         \
                                    _mm256_loadu_ps(sw[i] + gi), xq->d + g0 + gi, ng - gi);               \
            }                                                                                             \
        }                                                                                                 \
        for (int i = 0; i < R; i++) out[i] = cq_hsum8(f[i]);                                              \
    }                                                                                                     \
    __attribute__((target(TARGET))) static void q4r_rows_##SUF(const cq_qmat *m, size_t r0, size_t nr,   \
                                                               const cq_xq *xq, float *out) {             \
        size_t j = 0;                                                                                     \
        for (; j + 2 <= nr; j += 2) q4r_tile_##SUF(m, r0 + j, xq, out + j, 2);                            \
        for (; j < nr; j++) q4r_tile_##SUF(m, r0 + j, xq, out + j, 1);                                    \
    }

/* q4_block, q4_tiled, q4tp with int8 x, several inputs: q4r_tile's chunks of 8 groups,
 * each row's nibbles loaded once per step of two groups and met by every input's xq
 * and bias, each input's chunk folded as q4r_tile folds it (its operations per input,
 * in its order: vpdpbusd twice from the bias gives the integers of its vpmaddubsw pair
 * + vpmaddwd + bias). */
#define Q4M2_VARIANT(SUF, TARGET, DOT2, RMAX)                                                              \
    static inline __attribute__((always_inline, target(TARGET))) void q4m2_tile_##SUF(                     \
        const cq_qmat *m, size_t r, const cq_xq *const *xq, const int32_t *const *corr, float *Y, size_t ldy, \
        const int R, const int J) {                                                                       \
        const size_t gpr = m->cols / CQ_GROUP, gs = m->dtype == CQ_DT_Q4_TILED ? 18 : 16;                 \
        const uint8_t *nb = m->data + gs * r * gpr + (gs == 18 ? 2 : 0);                                  \
        const __m256i m0f = _mm256_set1_epi8(0x0F);                                                       \
        __m256 F[2][4];                                                                                   \
        float sw[2][64 + 8];                                                                              \
        (void)corr;                                                                                       \
        for (int i = 0; i < R; i++)                                                                       \
            for (int k = 0; k < J; k++) F[i][k] = _mm256_setzero_ps();                                    \
        for (size_t g0 = 0; g0 < gpr; g0 += 64) {                                                         \
            const size_t ng = gpr - g0 < 64 ? gpr - g0 : 64;                                              \
            for (int i = 0; i < R; i++) {                                                                 \
                avx2_group_scales(m, r + i, g0, ng, sw[i]);                                               \
                _mm256_storeu_ps(sw[i] + ng, _mm256_setzero_ps());                                        \
            }                                                                                             \
            for (size_t gi = 0; gi < ng; gi += 8) {                                                       \
                __m256i P[2][4][2]; /* [row][input][steps 0-1, 2-3] paired */                             \
                for (int h = 0; h < 2; h++) {                                                             \
                    __m256i s_[2][4][2];                                                                  \
                    for (int b = 0; b < 2; b++) {                                                         \
                        const size_t gk = gi + 4 * (size_t)h + 2 * (size_t)b, g_ = g0 + gk;               \
                        if (gk >= ng) {                                                                   \
                            for (int i = 0; i < R; i++)                                                   \
                                for (int k = 0; k < J; k++) s_[i][k][b] = _mm256_setzero_si256();         \
                            continue;                                                                     \
                        }                                                                                 \
                        __m256i v_[2];                                                                    \
                        for (int i = 0; i < R; i++) {                                                     \
                            const uint8_t *p_ = nb + i * gs * gpr + gs * g_;                              \
                            CQ_STREAM_PF(p_);                                                             \
                            v_[i] = q4_nibbles2(p_, gs, gk + 1 < ng);                                     \
                        }                                                                                 \
                        for (int k = 0; k < J; k++) {                                                     \
                            const int8_t *qe_ = xq[k]->q + 128 * (g_ / 4) + 16 * (g_ % 4);               \
                            const __m256i bias_ = _mm256_load_si256((const __m256i *)(xq[k]->bias + 4 * g_)); \
                            for (int i = 0; i < R; i++) s_[i][k][b] = Q4R_SUM(DOT2, v_[i], qe_, bias_);   \
                        }                                                                                 \
                    }                                                                                     \
                    for (int i = 0; i < R; i++)                                                           \
                        for (int k = 0; k < J; k++) P[i][k][h] = q4_pair8(s_[i][k][0], s_[i][k][1]);      \
                }                                                                                         \
                for (int i = 0; i < R; i++) {                                                             \
                    const __m256 sc_ = _mm256_loadu_ps(sw[i] + gi);                                       \
                    for (int k = 0; k < J; k++)                                                           \
                        F[i][k] = q4_fold8(F[i][k], P[i][k][0], P[i][k][1], sc_, xq[k]->d + g0 + gi, ng - gi); \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
        for (int i = 0; i < R; i++)                                                                       \
            for (int k = 0; k < J; k++) Y[k * ldy + r + i] = cq_hsum8(F[i][k]);                           \
    }                                                                                                     \
    __attribute__((target(TARGET))) static void q4m2_rows_##SUF(const cq_qmat *m, size_t r0, size_t nr,  \
                                                                const cq_xq *const *xq,                   \
                                                                const int32_t *const *corr, size_t t,     \
                                                                float *Y, size_t ldy) {                   \
        I8M_ROWS(q4m2_tile_##SUF, RMAX)                                                                   \
    }

/* bias + (lo, xe) + (hi, xo) summed per 4-byte lane: i8_row's integers */
#define Q4M2_MADD(b, lo, xe, hi, xo)                                                                      \
    _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, xe), _mm256_maddubs_epi16(hi, xo)), \
                                       _mm256_set1_epi16(1)),                                             \
                     b)
#define Q4M2_VEX(b, lo, xe, hi, xo) _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(b, lo, xe), hi, xo)
#define Q4M2_EVEX(b, lo, xe, hi, xo) _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(b, lo, xe), hi, xo)
Q4M2_VARIANT(madd, "avx2", Q4M2_MADD, 1)
#ifdef CQ_HAVE_AVXVNNI_FN
Q4M2_VARIANT(vex, "avxvnni", Q4M2_VEX, 1)
#endif
#ifdef CQ_HAVE_VNNI256_FN
Q4M2_VARIANT(evex, "avx512vnni,avx512vl", Q4M2_EVEX, 2)
#endif
Q4R_VARIANT(madd, "avx2", Q4M2_MADD)
#ifdef CQ_HAVE_AVXVNNI_FN
Q4R_VARIANT(vex, "avxvnni", Q4M2_VEX)
#endif
#ifdef CQ_HAVE_VNNI256_FN
Q4R_VARIANT(evex, "avx512vnni,avx512vl", Q4M2_EVEX)
#endif
static void q4_i8_rows(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *xq, float *out) {
    switch (i8mm_cpu()) {
#ifdef CQ_HAVE_AVXVNNI_FN
    case 1: q4r_rows_vex(m, r0, nr, xq, out); return;
#endif
#ifdef CQ_HAVE_VNNI256_FN
    case 2: q4r_rows_evex(m, r0, nr, xq, out); return;
#endif
    default: q4r_rows_madd(m, r0, nr, xq, out);
    }
}

/* q2tp with int8 x, several inputs: i8_row_q2's steps of four groups, each row's four
 * phases and scales made once per step and met by every input's xq, bias and d
 * (i8_row_q2's operations per input, in its order; vpdpbusd four times from the bias
 * gives the integers of its int16 phase sums + vpmaddwd + bias). One row a tile. */
#define Q2M2_STEP(DOT4, gi, F)                                                                            \
    do {                                                                                                  \
        const size_t g_ = g0 + (gi), n_ = ng - (gi) < 4 ? ng - (gi) : 4;                                  \
        const uint8_t *p_ = body + 8 * g_;                                                                \
        if (!((gi) & 4)) CQ_STREAM_PF(p_);                                                                \
        const __m256i v_ = n_ == 4 ? _mm256_loadu_si256((const __m256i *)p_)                              \
                                   : _mm256_maskload_epi32((const int *)(const void *)p_,                 \
                                                           _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(2 * n_)), \
                                                                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))); \
        const __m256i ph0_ = Q2_PHASE(_mm256_slli_epi16, _mm256_srli_epi16, _mm256_and_si256, v_, 0, m6);  \
        const __m256i ph1_ = Q2_PHASE(_mm256_slli_epi16, _mm256_srli_epi16, _mm256_and_si256, v_, 1, m6);  \
        const __m256i ph2_ = Q2_PHASE(_mm256_slli_epi16, _mm256_srli_epi16, _mm256_and_si256, v_, 2, m6);  \
        const __m256i ph3_ = Q2_PHASE(_mm256_slli_epi16, _mm256_srli_epi16, _mm256_and_si256, v_, 3, m6);  \
        const __m256 d_ = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sw + (gi))), spread); \
        const size_t lane_ = 16 * (g_ / 8) + 8 * ((g_ / 4) & 1);                                          \
        for (int k = 0; k < J; k++) {                                                                     \
            const int8_t *q_ = xq[k]->q + 256 * (g_ / 8) + 32 * ((g_ / 4) & 1);                           \
            const __m256i s_ = DOT4(_mm256_load_si256((const __m256i *)(xq[k]->bias + lane_)), ph0_, ph1_, ph2_, ph3_, q_); \
            F[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s_), _mm256_mul_ps(d_, _mm256_load_ps(xq[k]->dl + lane_)), F[k]); \
        }                                                                                                 \
    } while (0)
#define Q2M2_VARIANT(SUF, TARGET, DOT4)                                                                    \
    static inline __attribute__((always_inline, target(TARGET))) void q2m2_tile_##SUF(                     \
        const cq_qmat *m, size_t r, const cq_xq *const *xq, const int32_t *const *corr, float *Y, size_t ldy, \
        const int R, const int J) {                                                                       \
        const size_t gpr = m->cols / CQ_GROUP;                                                            \
        const uint8_t *body = m->data + 8 * r * gpr;                                                      \
        const __m256i m6 = _mm256_set1_epi8(6), spread = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);       \
        __m256 f0[4], f1[4];                                                                              \
        float sw[64 + 4];                                                                                 \
        (void)corr, (void)R;                                                                              \
        for (int k = 0; k < J; k++) f0[k] = f1[k] = _mm256_setzero_ps();                                  \
        for (size_t g0 = 0; g0 < gpr; g0 += 64) {                                                         \
            const size_t ng = gpr - g0 < 64 ? gpr - g0 : 64;                                              \
            avx2_group_scales(m, r, g0, ng, sw);                                                          \
            for (size_t k = 0; k < ng; k++) sw[k] *= 0.5f;                                                \
            for (int k = 0; k < 4; k++) sw[ng + k] = 0.0f;                                                \
            for (size_t gi = 0; gi < ng; gi += 8) {                                                       \
                Q2M2_STEP(DOT4, gi, f0);                                                                  \
                if (gi + 4 < ng) Q2M2_STEP(DOT4, gi + 4, f1);                                             \
            }                                                                                             \
        }                                                                                                 \
        for (int k = 0; k < J; k++) Y[k * ldy + r] = cq_hsum8(_mm256_add_ps(f0[k], f1[k]));               \
    }                                                                                                     \
    __attribute__((target(TARGET))) static void q2m2_rows_##SUF(const cq_qmat *m, size_t r0, size_t nr,  \
                                                                const cq_xq *const *xq,                   \
                                                                const int32_t *const *corr, size_t t,     \
                                                                float *Y, size_t ldy) {                   \
        I8M_ROWS(q2m2_tile_##SUF, 1)                                                                      \
    }

/* bias + the four phases against their xq bytes, per 4-byte lane: i8_row_q2's integers */
#define Q2M2_LD(q, j) _mm256_load_si256((const __m256i *)((q) + 64 * (j)))
#define Q2M2_MADD(b, p0, p1, p2, p3, q)                                                                   \
    _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(                \
                                                            _mm256_maddubs_epi16(p0, Q2M2_LD(q, 0)),       \
                                                            _mm256_maddubs_epi16(p1, Q2M2_LD(q, 1))),      \
                                                        _mm256_maddubs_epi16(p2, Q2M2_LD(q, 2))),          \
                                                    _mm256_maddubs_epi16(p3, Q2M2_LD(q, 3))),              \
                                       _mm256_set1_epi16(1)),                                             \
                     b)
#define Q2M2_VEX(b, p0, p1, p2, p3, q)                                                                    \
    _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(       \
                                                                                b, p0, Q2M2_LD(q, 0)),     \
                                                                            p1, Q2M2_LD(q, 1)),            \
                                                    p2, Q2M2_LD(q, 2)),                                   \
                            p3, Q2M2_LD(q, 3))
#define Q2M2_EVEX(b, p0, p1, p2, p3, q)                                                                   \
    _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_dpbusd_epi32(b, p0, Q2M2_LD(q, 0)), \
                                                                p1, Q2M2_LD(q, 1)),                       \
                                            p2, Q2M2_LD(q, 2)),                                           \
                        p3, Q2M2_LD(q, 3))
Q2M2_VARIANT(madd, "avx2", Q2M2_MADD)
#ifdef CQ_HAVE_AVXVNNI_FN
Q2M2_VARIANT(vex, "avxvnni", Q2M2_VEX)
#endif
#ifdef CQ_HAVE_VNNI256_FN
Q2M2_VARIANT(evex, "avx512vnni,avx512vl", Q2M2_EVEX)
#endif

#define CQ_HAVE_I8_MULTI
static int i8_multi_takes(const cq_qmat *m) {
    switch (m->dtype) {
    case CQ_DT_Q8_ROW: case CQ_DT_Q8_2F: case CQ_DT_Q4_BLOCK: case CQ_DT_Q4_TILED: case CQ_DT_Q4TP:
    case CQ_DT_Q2TP: return 1;
    default: return 0;
    }
}
/* The correction of the q8 vpdpbusd tiles: out[L] = -128 * (xq bytes 4L .. 4L + 3
 * summed) (8 lanes a group: xq's padding to 64 columns is zero). The q4 tiles start
 * from xq's bias. */
static size_t i8_multi_prep_words(const cq_qmat *m) {
    return m->dtype == CQ_DT_Q8_ROW || m->dtype == CQ_DT_Q8_2F ? ((m->cols + 63) & ~(size_t)63) / 4 : 0;
}
static void i8_multi_prep(const cq_qmat *m, const cq_xq *xq, int32_t *out) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1), zero = _mm256_setzero_si256();
    for (size_t c = 0; c < m->cols; c += 32) {
        const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, _mm256_load_si256((const __m256i *)(xq->q + c))), ones16);
        _mm256_store_si256((__m256i *)(out + c / 4), _mm256_sub_epi32(zero, _mm256_slli_epi32(s, 7)));
    }
}
static void i8_rows_multi(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *const *xq,
                          const int32_t *const *corr, size_t t, float *Y, size_t ldy) {
    const int q8 = m->dtype == CQ_DT_Q8_ROW || m->dtype == CQ_DT_Q8_2F, q2 = m->dtype == CQ_DT_Q2TP;
    switch (i8mm_cpu()) {
#ifdef CQ_HAVE_AVXVNNI_FN
    case 1:
        if (q8) q8m2_rows_vex(m, r0, nr, xq, corr, t, Y, ldy);
        else if (q2) q2m2_rows_vex(m, r0, nr, xq, corr, t, Y, ldy);
        else q4m2_rows_vex(m, r0, nr, xq, corr, t, Y, ldy);
        return;
#endif
#ifdef CQ_HAVE_VNNI256_FN
    case 2:
        if (q8) q8m2_rows_evex(m, r0, nr, xq, corr, t, Y, ldy);
        else if (q2) q2m2_rows_evex(m, r0, nr, xq, corr, t, Y, ldy);
        else q4m2_rows_evex(m, r0, nr, xq, corr, t, Y, ldy);
        return;
#endif
    default:
        if (q8) q8m2_rows_madd(m, r0, nr, xq, corr, t, Y, ldy);
        else if (q2) q2m2_rows_madd(m, r0, nr, xq, corr, t, Y, ldy);
        else q4m2_rows_madd(m, r0, nr, xq, corr, t, Y, ldy);
    }
}

/* matvec_batch's multi-input rows: 8 lanes, two rows a tile (rows_multi.h). */
#define CQ_MULTI_R 2
#define MULTI_VEC __m256
#define MULTI_LANES 8
#define MULTI_ZERO() _mm256_setzero_ps()
#define MULTI_LOAD(p) _mm256_loadu_ps(p)
#define MULTI_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define MULTI_HSUM(v) cq_hsum8(v)
static inline __attribute__((always_inline)) __m256 multi_w(int q8, const uint8_t *p, size_t c) {
    return q8 ? _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(p + c)))) : _mm256_loadu_ps((const float *)(const void *)p + c);
}
#include "rows_multi.h"

#include "matvec_drivers.h"

CQ_MATVEC_OPS(cq_matvec_avx2);
