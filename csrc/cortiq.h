/* cortiq.h -- THE C API of cortiq's kernels.
 *
 * Rules for everything declared here:
 *  - Pure functions over flat, caller-owned buffers. No allocation in hot loops,
 *    no I/O, no printing, no exit. Functions that can fail return cq_status.
 *  - Lengths are element counts (size_t); float means IEEE binary32.
 *  - Every kernel exists as a scalar reference (the spec, *_ref.c) and, where it
 *    pays, SIMD twins with the same contract: AVX2/FMA (*_avx2.c) and AVX-512
 *    (*_avx512.c) on x86-64, NEON (*_neon.c, *_neon_dotprod.c) on AArch64. Callers reach them
 *    through the active table (cq_active()), chosen once by dispatch.c.
 *  - Parallel kernels run on the process-wide thread pool (pool.h) and split work
 *    into pieces decided by the problem shape only, each computed by one thread, so
 *    results are bit-identical for any thread count and any calling thread.
 */
#ifndef CORTIQ_H
#define CORTIQ_H

#include <stddef.h>
#include <stdint.h>
#include "pool.h" /* the thread count: cq_set_num_threads / cq_get_num_threads */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes ------------------------------------------------------- */
typedef enum cq_status {
    CQ_OK = 0,
    CQ_ERR_SHAPE = 1,     /* inconsistent lengths or shapes */
    CQ_ERR_ARG = 2,       /* an argument out of its domain */
    CQ_ERR_NOMEM = 3,     /* a scratch allocation failed (never in hot loops) */
    CQ_ERR_UNSUPPORTED = 4, /* dtype/layout not handled by this kernel */
} cq_status;

const char *cq_status_str(cq_status s);

/* ---- CPU features and dispatch (cpu.c, dispatch.c) ---------------------- */
enum {
    CQ_CPU_SSE42 = 1u << 0,
    CQ_CPU_AVX = 1u << 1,
    CQ_CPU_AVX2 = 1u << 2,
    CQ_CPU_FMA = 1u << 3,
    CQ_CPU_F16C = 1u << 4,
    CQ_CPU_AVX512F = 1u << 5,
    CQ_CPU_AVX512BW = 1u << 6,
    CQ_CPU_AVX512VL = 1u << 7,
    CQ_CPU_AVX512DQ = 1u << 8,
    CQ_CPU_AVX512VNNI = 1u << 9,
    CQ_CPU_AVXVNNI = 1u << 10,
    CQ_CPU_OS_YMM = 1u << 11, /* XCR0 says the OS saves YMM state */
    CQ_CPU_OS_ZMM = 1u << 12, /* XCR0 says the OS saves opmask/ZMM state */
    CQ_CPU_AVX512VBMI = 1u << 13,
    CQ_CPU_ASIMD = 1u << 14,   /* AArch64 Advanced SIMD (NEON): every AArch64 CPU */
    CQ_CPU_ASIMDDP = 1u << 15, /* AArch64 dot product (sdot/udot, FEAT_DotProd) */
    CQ_CPU_GFNI = 1u << 16,    /* x86 Galois-field affine byte transforms (vgf2p8affineqb) */
};
/* Feature bits of this CPU (CQ_CPU_*), read once: CPUID + XGETBV on x86, the kernel's
 * HWCAP on Linux/AArch64, sysctl on macOS/arm64. */
uint32_t cq_cpu_features(void);
/* For tests: report the CQ_CPU_* bits in mask as absent (0 restores), so a kernel's
 * fallback for CPUs without a feature (e.g. AVX-512 without VNNI) runs here too. */
void cq_hide_cpu_features(uint32_t mask);
/* Bytes of L1 data cache of this CPU (CPUID; 32 KiB when it does not say): the wide-row
 * kernels size their x chunks by it. */
size_t cq_l1d_bytes(void);

/* ---- kernel families ---------------------------------------------------- */
/* mathfn: elementwise transcendental helpers (csrc/mathfn).
 * exp8 is the Cephes-style single-precision exp of the reference engine
 * (cortiq-engine 0.8.64): inputs are clamped to [-87, 88] (so exp(+inf) = exp(88),
 * exp(-inf) = exp(-87)), NaN propagates; relative error <= 2e-7 against exp on [-87, 88]. */
typedef struct cq_mathfn_ops {
    /* out[i] = exp8(x[i]); out may alias x. */
    void (*exp_f32)(const float *x, float *out, size_t n);
    /* In place, each of `rows` rows of `cols` (row stride `cols`): subtract the row
     * max, exp8, divide by the sum. A row whose max is -inf is left as is. */
    void (*softmax_rows)(float *x, size_t rows, size_t cols);
    /* The reference engine's silu_rows, per row of `cols`: g = silu(g*a) * (u*b) with a, b of
     * length cols shared by all rows. g must not alias u/a/b. */
    void (*silu_mul)(float *g, const float *u, const float *a, const float *b,
                     size_t rows, size_t cols);
    /* The reference engine's gate_rows, per row: y = y * sigmoid(g*s), s of length cols. */
    void (*gate_mul)(float *y, const float *g, const float *s, size_t rows, size_t cols);
    /* sum a[i]*b[i]: AVX2 keeps two 8-lane FMA accumulators, so it differs from a
     * sequential sum at rounding level (bounded by n * eps * sum|a*b|). */
    float (*dot_f32)(const float *a, const float *b, size_t n);
    /* y[i] += alpha * x[i]; y must not partially overlap x. */
    void (*axpy_f32)(float *y, float alpha, const float *x, size_t n);
} cq_mathfn_ops;

extern const cq_mathfn_ops cq_mathfn_ref;
extern const cq_mathfn_ops cq_mathfn_avx2;
extern const cq_mathfn_ops cq_mathfn_neon;

/* hash: hash64 of docs/cmf-format.md §6.1 (csrc/hash). XOR-folded over little-endian u64 words
 * (last partial word zero-padded), so any evaluation order gives the same value.
 * hash64(empty) = 0. Bit-identical across ISAs. */
typedef struct cq_hash_ops {
    uint64_t (*hash64)(const uint8_t *p, size_t n);
} cq_hash_ops;

extern const cq_hash_ops cq_hash_ref;
extern const cq_hash_ops cq_hash_avx2;
extern const cq_hash_ops cq_hash_neon;

/* quant: the CMF writers' quantizers (csrc/quant), bit-exact with src/cortiq/cmf/quant.py.
 * Inputs are row-major float32; `out` receives the payload bytes exactly as stored in
 * the file (little-endian f16 scales, no alignment requirement). CQ_ERR_ARG when an
 * input is NaN/inf or too large for an f16 scale (|w| > 65504*127 for q8, *7 for q4).
 * Rows/groups are split over the kernel pool; output is identical for any count.
 * The AVX2 twin is bit-identical to the reference (same IEEE divisions and roundings). */
typedef struct cq_quant_ops {
    /* out: [int8 q : rows*cols][f16 scale : rows] */
    cq_status (*q8_row)(const float *w, size_t rows, size_t cols, uint8_t *out);
    /* out: [int8 q : rows*cols][f16 row_scale : rows][f16 col : cols];
     * scratch acc[cols] (double) and colv[cols] (float) owned by the caller */
    cq_status (*q8_2f)(const float *w, size_t rows, size_t cols, uint8_t *out,
                       double *acc, float *colv);
    /* out: [u8 nibbles : 16*G][f16 scale : G], G = ceil(n/32), last group zero-padded */
    cq_status (*q4_block)(const float *w, size_t n, uint8_t *out);
    /* out: G x [f16 scale][16 nibble bytes] */
    cq_status (*q4_tiled)(const float *w, size_t n, uint8_t *out);
    /* round-to-nearest-even f32 -> f16 (little-endian bytes) and back */
    void (*f32_to_f16)(const float *x, uint8_t *out, size_t n);
    void (*f16_to_f32)(const uint8_t *x, float *out, size_t n);
} cq_quant_ops;

extern const cq_quant_ops cq_quant_ref;
extern const cq_quant_ops cq_quant_avx2;
extern const cq_quant_ops cq_quant_neon;

/* ---- matvec: stored matrices times float32 activations (csrc/matvec) ----------
 * A cq_qmat is one 2-D CMF payload read in place (any alignment). dtype = CMF id.
 * Activations are float32 (m->act == CQ_ACT_EXACT, the default) or quantized to int8
 * per group of 32 (CQ_ACT_INT8: qmat.h, cq_xq); weights are decoded exactly as
 * docs/cmf-format.md §7 says. Row r of the output is
 * always computed by one thread in a fixed order: bit-identical for any thread
 * count. The SIMD twins sum in a different order than the reference (and factor a
 * row/group scale out of its partial sum), so they agree with it within float32
 * rounding of sum|w*x|, not bitwise. */
enum {
    CQ_DT_F32 = 0, CQ_DT_F16 = 1, CQ_DT_BF16 = 2, CQ_DT_Q8_ROW = 3, CQ_DT_Q4_BLOCK = 4,
    CQ_DT_VBIT = 8, CQ_DT_Q8_2F = 9, CQ_DT_VBIT_RO = 10, CQ_DT_Q4_TILED = 11, CQ_DT_Q4TP = 15,
    CQ_DT_Q2TP = 16,
    /* ggml block formats (docs/cmf-format.md §7.9): id = 64 + ggml type number */
    CQ_DT_GGML_Q4_0 = 66, CQ_DT_GGML_Q4_1 = 67, CQ_DT_GGML_Q5_0 = 70, CQ_DT_GGML_Q5_1 = 71,
    CQ_DT_GGML_Q8_0 = 72, CQ_DT_GGML_Q2_K = 74, CQ_DT_GGML_Q3_K = 75, CQ_DT_GGML_Q4_K = 76,
    CQ_DT_GGML_Q5_K = 77, CQ_DT_GGML_Q6_K = 78, CQ_DT_GGML_IQ4_NL = 84, CQ_DT_GGML_IQ4_XS = 87,
};
typedef struct cq_qmat {
    const uint8_t *data; /* the payload bytes as stored in the file */
    size_t nbytes;
    size_t rows, cols;
    int dtype;
    /* Decoded side tables from cq_qmat_prepare (cq_qmat_aux_len floats, NULL if 0):
     * q8_row: row scales [rows]; q8_2f: row scales [rows] then col [cols];
     * q4tp/q2tp: per row the 32 tile scales indexed by code (q2tp: code 0 -> 0). */
    const float *aux;
    /* vbit/vbit_ro only: rows+1 byte offsets of each row's codes from `data`, from
     * cq_qmat_prepare_rows (NULL otherwise). */
    const uint64_t *rowoff;
    /* How products with this matrix treat the activations: CQ_ACT_EXACT (float32) or
     * CQ_ACT_INT8 (x quantized per group of 32 to int8, integer sums; taken by q8_row,
     * q8_2f, q4_block, q4_tiled, q4tp, q2tp with cols % 32 == 0, the others stay
     * float32). A field of the matrix rather than a process-wide switch, so models
     * loaded with different precisions share one process. */
    int act;
} cq_qmat;
enum { CQ_ACT_EXACT = 0, CQ_ACT_INT8 = 1 };
/* Payload size of a dtype/shape, 0 when the dtype/shape is not supported here
 * (q4tp/q2tp need cols % 32 == 0) or data-dependent (vbit, vbit_ro: see
 * cq_qmat_prepare_rows). */
size_t cq_qmat_nbytes(int dtype, size_t rows, size_t cols);
size_t cq_qmat_aux_len(int dtype, size_t rows, size_t cols);
/* Fill aux (cq_qmat_aux_len floats) from m->data; m->aux is not read. */
cq_status cq_qmat_prepare(const cq_qmat *m, float *aux);
/* vbit/vbit_ro: validate the payload (2-D, cols % 32 == 0, widths in {3,4,5,6,8},
 * vbit_ro offsets the exact prefix sums, total length == nbytes; CQ_ERR_SHAPE /
 * CQ_ERR_ARG otherwise) and fill rowoff[rows + 1]. */
cq_status cq_qmat_prepare_rows(const cq_qmat *m, uint64_t *rowoff);

typedef struct cq_matvec_ops {
    /* y[r] = sum_c W[r,c] x[c], r < rows; x has cols floats, y rows floats. */
    cq_status (*matvec)(const cq_qmat *m, const float *x, float *y);
    /* n matrices sharing x (same cols): ys[i] = ms[i] x, one parallel region;
     * bit-identical to n matvec calls. */
    cq_status (*matvec_many)(const cq_qmat *ms, size_t n, const float *x, float *const *ys);
    /* Y[t, rows] = X[t, cols] W^T: decodes a block of rows once and reuses it for
     * all t inputs. Equal to t matvecs within float32 rounding (not bitwise). */
    cq_status (*matmat)(const cq_qmat *m, const float *X, size_t t, float *Y);
    /* out[nr, cols] = rows r0 .. r0+nr-1 decoded to float32 (exact). */
    cq_status (*dequant_rows)(const cq_qmat *m, size_t r0, size_t nr, float *out);
    /* *res = sum_c W[r,c] x[c], bit-identical to matvec's y[r]. Prepares x for the row
     * (q8_2f, grouped dtypes) on every call: for many rows sharing x use rows_dot. */
    cq_status (*row_dot)(const cq_qmat *m, size_t r, const float *x, float *res);
    /* out[j] = row r0+j dotted with x for j < nr, on the calling thread only (for use
     * inside a caller's parallel region); x prepared once; bit-identical to matvec. */
    cq_status (*rows_dot)(const cq_qmat *m, size_t r0, size_t nr, const float *x, float *out);
    /* t inputs X[t, cols] against n matrices sharing cols: ys[i][j * rows_i + r] =
     * (ms[i] X[j])[r], with the weights streamed once for all t (several sequences'
     * decode rows in one pass). Bit-identical to matvec_many per input for t == 1, for
     * int8 activations and in tables without a multi-input row kernel; else equal to
     * it within float32 rounding (matvec_drivers.h: CQ_HAVE_ROWS_MULTI). */
    cq_status (*matvec_batch)(const cq_qmat *ms, size_t n, const float *X, size_t t, float *const *ys);
    /* Nonzero where matmat multiplies a matrix of this dtype (act = CQ_ACT_INT8, cols a
     * multiple of 256) with int8 activations on this CPU; 0 where the float32 matmat
     * does the work under every precision (an x86 table on a CPU without vpdpbusd, whose
     * integer tiles would be slower) or the dtype has no int8 path. */
    int (*matmat_int8)(int dtype);
} cq_matvec_ops;

/* Benchmark probe: sum of the buffer's 64-bit words over `threads` threads, each
 * thread reading its part as `streams` (1..8) streams side by side (reads every byte
 * once; used to measure the machine's read bandwidth). */
uint64_t cq_read_sum(const uint8_t *p, size_t n, int threads, int streams);

extern const cq_matvec_ops cq_matvec_ref;
extern const cq_matvec_ops cq_matvec_avx2;
extern const cq_matvec_ops cq_matvec_avx512;
extern const cq_matvec_ops cq_matvec_neon;
extern const cq_matvec_ops cq_matvec_neon_dotprod;

/* ---- attn: norms, rotary, top-k, attention (csrc/attn) -------------------------
 * All buffers float32 row-major; "rows" kernels treat x as [rows, n]. */
typedef struct cq_attn_ops {
    /* Per row: y = x / sqrt(mean(x^2) + eps) (* w when w != NULL). y may alias x. */
    void (*rmsnorm)(const float *x, const float *w, float eps, float *y, size_t rows, size_t n);
    /* Per row, in place: x = x / sqrt(sum(x^2) + eps). */
    void (*justnorm)(float *x, float eps, size_t rows, size_t n);
    /* Half-split (NeoX) pairs (x[i], x[i+h]), h = hd/2, for x [t, heads, hd] and
     * cos/sin [t, h]: x[i] = a*c - b*s, x[i+h] = a*s + b*c (s negated if inverse). */
    void (*rope_halfsplit)(float *x, const float *cos, const float *sin, size_t t,
                           size_t heads, size_t hd, int inverse);
    /* Interleaved pairs (x[b+2i], x[b+2i+1]) on the last rope_dim entries of each of
     * the `vecs` vectors of length hd (b = hd - rope_dim); the vectors are grouped
     * `per_pos` to a position: vector v uses cos/sin row v / per_pos (rope_dim/2 each). */
    void (*rope_interleaved)(float *x, const float *cos, const float *sin, size_t vecs,
                             size_t per_pos, size_t hd, size_t rope_dim, int inverse);
    /* Per row of x [rows, n]: indices of the k largest finite values, ties to the lower
     * index, in descending value order, into idx [rows, k]; count[row] = how many were
     * found (< k when fewer finite values); unused slots get -1. */
    cq_status (*topk)(const float *x, size_t rows, size_t n, size_t k, int64_t *idx, int64_t *count);
    /* Causal windowed GQA. q [t, nh, hd], keys/vals [nkeys, nk, hd] (cache row j is
     * position first + j), out [t, nh, hd]. Query r sits at position pos0 + r and
     * attends positions max(first, pos+1-window) .. pos (window 0 = unlimited).
     * rep = nh / nk query heads share kv head nh / rep; each key row is read once
     * for the whole group. scale multiplies q.k. Parallel over (t, kv head). */
    cq_status (*attn_gqa)(const float *q, const float *keys, const float *vals, float *out,
                          size_t t, size_t nh, size_t nk, size_t hd, size_t nkeys,
                          size_t pos0, size_t first, size_t window, float scale);
    /* Sparse attention with a sink logit, per head h < nh: scores over kv rows
     * idx[0..m) (idx < 0 = masked), logits scale*q.k, plus sink[h] in the softmax
     * denominator only; out[h] = sum p_j kv[idx_j]. kv [nkv, hd] serves as key and
     * value (MQA). q, out [nh, hd]. sink may be NULL (= -inf). */
    cq_status (*sparse_attend)(const float *q, const float *kv, size_t nkv, const int64_t *idx,
                               size_t m, const float *sink, float scale, size_t nh, size_t hd,
                               float *out);
    /* Fused per-token steps of a Dory sub-layer (one C call instead of several; each
     * equals the composition of the separate kernels, bit for bit on one ISA):
     * qk_prep: x [t, heads, hd]: half-split rotary by cos/sin [t, hd/2], then justnorm of
     *   each head, then *scale[head*hd + i] when scale != NULL. */
    void (*qk_prep)(float *x, const float *cos, const float *sin, const float *scale,
                    size_t t, size_t heads, size_t hd, float eps);
    /* slerp: per row of x, out [rows, n]: x = justnorm(x^ + alpha*(out^ - x^)) with
     *   x^, out^ the justnorms (out is overwritten with out^ - x^ scaled by alpha). */
    void (*slerp)(float *x, float *out, const float *alpha, size_t rows, size_t n, float eps);
    /* gate_norm: per row: y = justnorm(y * sigmoid(g*s)) (mathfn gate_mul, then justnorm). */
    void (*gate_norm)(float *y, const float *g, const float *s, size_t rows, size_t n,
                      float eps);
} cq_attn_ops;

extern const cq_attn_ops cq_attn_ref;
extern const cq_attn_ops cq_attn_avx2;
extern const cq_attn_ops cq_attn_neon;

/* mix: DeepSeek-V4 hyper-connections and small per-token helpers (csrc/mix).
 * The state is hc copies of a dim vector, x[j*dim + d]. */
typedef struct cq_mix_ops {
    /* out[m] = rsqrt(mean(x^2) + eps) * sum_c fn[m*n + c] * x[c] for m < mix, n = hc*dim.
     * Rows over the kernel pool when mix*n >= 2^18 (each row on one thread:
     * bit-identical for any thread count). */
    void (*hc_mixes)(const float *x, size_t n, const float *fn, size_t mix, float eps,
                     float *out);
    /* pre = sigmoid(m*s0 + b) + eps; post = 2 sigmoid(m*s1 + b); comb = row softmax of
     * m*s2 + b, + eps, one column normalisation, then iters-1 row+column rounds;
     * every division by (sum + eps). mixes/base have (2+hc)*hc entries, scale3 three. */
    void (*hc_split_sinkhorn)(const float *mixes, const float *scale3, const float *base,
                              size_t hc, size_t iters, float eps, float *pre, float *post,
                              float *comb);
    /* head gate: pre[j] = sigmoid(mixes[j]*scale + base[j]) + eps. */
    void (*hc_head_pre)(const float *mixes, float scale, const float *base, size_t hc,
                        float eps, float *pre);
    /* out[d] = sum_j pre[j] * x[j*dim + d]. */
    void (*hc_fold)(const float *x, const float *pre, size_t hc, size_t dim, float *out);
    /* hc_fold, then RMSNorm of out with weight w (w NULL = no weight). */
    void (*hc_fold_norm)(const float *x, const float *pre, size_t hc, size_t dim,
                         const float *w, float eps, float *out);
    /* out[j*dim+d] = post[j]*blk[d] + sum_k comb[k*hc+j] * res[k*dim+d] (the transpose);
     * out must not overlap res or blk. */
    void (*hc_expand)(const float *blk, const float *res, const float *post,
                      const float *comb, size_t hc, size_t dim, float *out);
    /* In place: v = v * rsqrt(mean(v^2) + eps) * w (w NULL = no weight). */
    void (*rms_weighted)(float *v, const float *w, size_t n, float eps);
    /* In place on g: g = silu(min(g, L)) * clamp(u, -L, L) * weight (limit <= 0: no
     * clamp) -- the reference engine's asymmetric swiglu_limit. */
    void (*swiglu)(float *g, const float *u, size_t n, float limit, float weight);
    /* Per column d < width: softmax over `slots` of score[t*width+d], weighted sum of
     * kv[t*width+d]; an all -inf column gives 0 (the compressor's pooling). */
    void (*pool_by_score)(const float *kv, const float *score, size_t slots, size_t width,
                          float *out);
    /* The grouped low-rank projection read straight from the stored rows: m has
     * groups*lora rows of per = m->cols; out[r] = row r . x[(r / lora) * per ..], i.e.
     * each group's block of rows against its slice of x (x has groups*per entries).
     * n inputs at once: x is n such vectors in a row, out n rows of m->rows; each
     * block of rows serves all n in turn (read from memory once), and every input's
     * results are bit for bit those of the call for it alone. Blocks of rows through
     * the active matvec.rows_dot (bit-identical to matvec); blocks over the kernel
     * pool, identical for any thread count. */
    cq_status (*grouped_rows)(const cq_qmat *m, const float *x, size_t n, size_t groups,
                              float *out);
    /* The MoE's down projections in one pass: out[r] = sum_j row r of ms[j] . xs[j]
     * (j ascending), for r < ms[0].rows; every ms[j] has that many rows. One pool
     * call over blocks of rows (identical for any thread count) instead of one per
     * expert; each block is one matvec.rows_dot call per matrix. */
    cq_status (*rows_sum)(const cq_qmat *ms, size_t n, const float *const *xs, float *out);
} cq_mix_ops;

extern const cq_mix_ops cq_mix_ref;
extern const cq_mix_ops cq_mix_avx2;
extern const cq_mix_ops cq_mix_neon;
/* ---- nystrom (csrc/nystrom) -------------------------------------------- */
/* The O(1) far field of docs/nystrom.md: one group = one KV head with `rep` query
 * heads. The state's buffers belong to the caller (src/cortiq/models/dory/nystrom.py); the
 * kernels read and update them through this view. Layouts (row-major f32):
 *   sink_k [sink_len][d], sink_v [sink_len][dv]   permanent exact rows
 *   win_k  [w][d], win_v [w][dv]                  the exact ring (exact-only mode: the
 *                                                 growing buffer, capacity w)
 *   k_tilde [m][d]                                key landmarks
 *   per head h: q_tilde [rep][m][d], mu [rep][m][m] (row = key landmark),
 *   t_hat [rep][m][dv], z_hat [rep][m], m_max [rep][m] (running maxima, -inf empty)
 *   scratch: sink_len + w + 3*m floats. */
typedef struct cq_nys_view {
    size_t d, dv, m, rep;
    size_t sink_len, w, win_len, win_head, far_len;
    int exact_only, rect_fm;
    float scale;
    const float *sink_k, *sink_v;
    float *win_k, *win_v;
    const float *k_tilde, *q_tilde, *mu;
    float *t_hat, *z_hat, *m_max;
    float *scratch;
} cq_nys_view;

typedef struct cq_nystrom_ops {
    /* Absorb rows k[n][d], v[n][dv] (in order) into every head's far accumulators
     * with the running-max shifts of docs/nystrom.md §2; far_len += n. */
    void (*absorb)(cq_nys_view *g, const float *k, const float *v, size_t n);
    /* One decode row: the group push (or, with restep, the overwrite of the newest
     * row, docs/nystrom.md §6.4), then each head's readout of q[rep][d] into y[rep][dv].
     * CQ_ERR_SHAPE when an exact-only buffer is full (caller grows it first) or a
     * restep finds no row. */
    cq_status (*step)(cq_nys_view *g, const float *q, const float *k, const float *v,
                      float *y, int restep);
    /* Readout only (no push), every head. */
    void (*readout)(cq_nys_view *g, const float *q, float *y);
    /* Segment means in f64 of `rows` rows of width d taken from x (row stride ld),
     * row r being x[index ? index[r] : r]: segment a covers [a*rows/m, (a+1)*rows/m).
     * CQ_ERR_ARG when m == 0 or rows < m. */
    cq_status (*seg_means)(const float *x, size_t ld, size_t d, const uint32_t *index,
                           size_t rows, size_t m, double *out);
} cq_nystrom_ops;

extern const cq_nystrom_ops cq_nystrom_ref;
extern const cq_nystrom_ops cq_nystrom_avx2;
extern const cq_nystrom_ops cq_nystrom_neon;

/* ---- linalg (csrc/linalg): small dense f64 solves ------------------------- */
typedef struct cq_linalg_ops {
    /* M = (A^T A + lam I)^-1 A^T for A[m][m] (docs/nystrom.md §1.4):
     * lam = 1e-6 * mean(diag A^T A), Cholesky retried with lam*10 up to 12 times, else
     * M = I / mean(diag). work: 2*m*m + m doubles. Returns the number of Cholesky
     * attempts used (0 = fallback). */
    int (*ridge_pinv)(const double *A, size_t m, double *M, double *work);
    /* The reference engine's key_residuals in f64: landmarks = m segment means of the rows of k
     * (row r at k + r*ld, width hd; segment a = [a*rows/m, max((a+1)*rows/m, lo+1))),
     * G = L L^T + 1e-4 I by Cholesky (pivots floored at 1e-12), per row
     * c = G^-1 (L k), out[r] = k.k - c.(L k) - 1e-4 c.c. work: m*hd + m*m + 2*m doubles.
     * CQ_ERR_ARG when m == 0 or rows == 0. */
    cq_status (*key_residuals)(const float *k, size_t rows, size_t ld, size_t hd, size_t m,
                               float *out, double *work);
} cq_linalg_ops;

extern const cq_linalg_ops cq_linalg_ref;

/* ---- the dispatch table ------------------------------------------------- */
typedef struct cq_table {
    const char *name;           /* "ref", "avx2", "avx512", "neon", "neon_dotprod" */
    const cq_mathfn_ops *mathfn;
    const cq_hash_ops *hash;
    const cq_quant_ops *quant;
    const cq_matvec_ops *matvec;
    const cq_attn_ops *attn;
    const cq_mix_ops *mix;
    const cq_nystrom_ops *nystrom;
    const cq_linalg_ops *linalg;
} cq_table;

typedef enum cq_isa {
    CQ_ISA_REF = 0,
    CQ_ISA_AVX2 = 1,
    CQ_ISA_AVX512 = 2,
    CQ_ISA_NEON = 3,         /* AArch64 baseline (armv8-a) */
    CQ_ISA_NEON_DOTPROD = 4, /* + the dot product extension for the int8-activation rows */
    CQ_ISA_COUNT = 5
} cq_isa;

/* Table for an ISA, or NULL when it was not compiled into this build. */
const cq_table *cq_table_for(cq_isa isa);
/* 1 when `isa` is compiled in AND the CPU and OS support it. */
int cq_isa_usable(cq_isa isa);
/* Best usable ISA. */
cq_isa cq_isa_best(void);
/* Make `isa` active; CQ_ERR_UNSUPPORTED when not usable. Not thread-safe: call at
 * import time or from tests, never while kernels run. */
cq_status cq_set_isa(cq_isa isa);
const cq_table *cq_active(void);

/* Compiler identification string baked in at build time. */
const char *cq_compiler(void);

#ifdef __cplusplus
}
#endif
#endif
