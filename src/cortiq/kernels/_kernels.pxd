# The Cython mirror of csrc/cortiq.h. Keep it in the order of the header.
from libc.stdint cimport uint32_t, uint8_t, uint16_t, int8_t, uint64_t, int64_t

cdef extern from "cortiq.h" nogil:
    ctypedef enum cq_status:
        CQ_OK
        CQ_ERR_SHAPE
        CQ_ERR_ARG
        CQ_ERR_NOMEM
        CQ_ERR_UNSUPPORTED
    const char *cq_status_str(cq_status s)

    uint32_t cq_cpu_features()
    void cq_hide_cpu_features(uint32_t mask)
    size_t cq_l1d_bytes()

    ctypedef struct cq_mathfn_ops:
        void (*exp_f32)(const float *x, float *out, size_t n) noexcept nogil
        void (*softmax_rows)(float *x, size_t rows, size_t cols) noexcept nogil
        void (*silu_mul)(float *g, const float *u, const float *a, const float *b, size_t rows, size_t cols) noexcept nogil
        void (*gate_mul)(float *y, const float *g, const float *s, size_t rows, size_t cols) noexcept nogil
        float (*dot_f32)(const float *a, const float *b, size_t n) noexcept nogil
        void (*axpy_f32)(float *y, float alpha, const float *x, size_t n) noexcept nogil

    ctypedef struct cq_hash_ops:
        uint64_t (*hash64)(const uint8_t *p, size_t n) noexcept nogil

    ctypedef struct cq_quant_ops:
        cq_status (*q8_row)(const float *w, size_t rows, size_t cols, uint8_t *out) noexcept nogil
        cq_status (*q8_2f)(const float *w, size_t rows, size_t cols, uint8_t *out, double *acc, float *colv) noexcept nogil
        cq_status (*q4_block)(const float *w, size_t n, uint8_t *out) noexcept nogil
        cq_status (*q4_tiled)(const float *w, size_t n, uint8_t *out) noexcept nogil
        void (*f32_to_f16)(const float *x, uint8_t *out, size_t n) noexcept nogil
        void (*f16_to_f32)(const uint8_t *x, float *out, size_t n) noexcept nogil

    ctypedef struct cq_mix_ops:
        void (*hc_mixes)(const float *x, size_t n, const float *fn, size_t mix, float eps, float *out) noexcept nogil
        void (*hc_split_sinkhorn)(const float *mixes, const float *scale3, const float *base, size_t hc, size_t iters, float eps, float *pre, float *post, float *comb) noexcept nogil
        void (*hc_head_pre)(const float *mixes, float scale, const float *base, size_t hc, float eps, float *pre) noexcept nogil
        void (*hc_fold)(const float *x, const float *pre, size_t hc, size_t dim, float *out) noexcept nogil
        void (*hc_fold_norm)(const float *x, const float *pre, size_t hc, size_t dim, const float *w, float eps, float *out) noexcept nogil
        void (*hc_expand)(const float *blk, const float *res, const float *post, const float *comb, size_t hc, size_t dim, float *out) noexcept nogil
        void (*rms_weighted)(float *v, const float *w, size_t n, float eps) noexcept nogil
        void (*swiglu)(float *g, const float *u, size_t n, float limit, float weight) noexcept nogil
        void (*pool_by_score)(const float *kv, const float *score, size_t slots, size_t width, float *out) noexcept nogil
        cq_status (*grouped_rows)(const cq_qmat *m, const float *x, size_t n, size_t groups, float *out) noexcept nogil
        cq_status (*rows_sum)(const cq_qmat *ms, size_t n, const float *const *xs, float *out) noexcept nogil

    # ---- matvec family (csrc/matvec) ----
    ctypedef struct cq_qmat:
        const uint8_t *data
        size_t nbytes
        size_t rows
        size_t cols
        int dtype
        const float *aux
        const uint64_t *rowoff
        int act
    enum:
        CQ_ACT_EXACT
        CQ_ACT_INT8
    size_t cq_qmat_nbytes(int dtype, size_t rows, size_t cols)
    size_t cq_qmat_aux_len(int dtype, size_t rows, size_t cols)
    cq_status cq_qmat_prepare(const cq_qmat *m, float *aux)
    cq_status cq_qmat_prepare_rows(const cq_qmat *m, uint64_t *rowoff)
    uint64_t cq_read_sum(const uint8_t *p, size_t n, int threads, int streams)

    ctypedef struct cq_matvec_ops:
        cq_status (*matvec)(const cq_qmat *m, const float *x, float *y) noexcept nogil
        cq_status (*matvec_many)(const cq_qmat *ms, size_t n, const float *x, float *const *ys) noexcept nogil
        cq_status (*matmat)(const cq_qmat *m, const float *X, size_t t, float *Y) noexcept nogil
        cq_status (*dequant_rows)(const cq_qmat *m, size_t r0, size_t nr, float *out) noexcept nogil
        cq_status (*row_dot)(const cq_qmat *m, size_t r, const float *x, float *res) noexcept nogil
        cq_status (*rows_dot)(const cq_qmat *m, size_t r0, size_t nr, const float *x, float *out) noexcept nogil
        cq_status (*matvec_batch)(const cq_qmat *ms, size_t n, const float *X, size_t t, float *const *ys) noexcept nogil
        int (*matmat_int8)(int dtype) noexcept nogil

    # ---- attn family (csrc/attn) ----
    ctypedef struct cq_attn_ops:
        void (*rmsnorm)(const float *x, const float *w, float eps, float *y, size_t rows, size_t n) noexcept nogil
        void (*justnorm)(float *x, float eps, size_t rows, size_t n) noexcept nogil
        void (*rope_halfsplit)(float *x, const float *cos, const float *sin, size_t t, size_t heads, size_t hd, int inverse) noexcept nogil
        void (*rope_interleaved)(float *x, const float *cos, const float *sin, size_t vecs, size_t per_pos, size_t hd, size_t rope_dim, int inverse) noexcept nogil
        cq_status (*topk)(const float *x, size_t rows, size_t n, size_t k, int64_t *idx, int64_t *count) noexcept nogil
        cq_status (*attn_gqa)(const float *q, const float *keys, const float *vals, float *out, size_t t, size_t nh, size_t nk, size_t hd, size_t nkeys, size_t pos0, size_t first, size_t window, float scale) noexcept nogil
        cq_status (*sparse_attend)(const float *q, const float *kv, size_t nkv, const int64_t *idx, size_t m, const float *sink, float scale, size_t nh, size_t hd, float *out) noexcept nogil
        void (*qk_prep)(float *x, const float *cos, const float *sin, const float *scale, size_t t, size_t heads, size_t hd, float eps) noexcept nogil
        void (*slerp)(float *x, float *out, const float *alpha, size_t rows, size_t n, float eps) noexcept nogil
        void (*gate_norm)(float *y, const float *g, const float *s, size_t rows, size_t n, float eps) noexcept nogil

    # nystrom + linalg
    ctypedef struct cq_nys_view:
        size_t d, dv, m, rep
        size_t sink_len, w, win_len, win_head, far_len
        int exact_only, rect_fm
        float scale
        const float *sink_k
        const float *sink_v
        float *win_k
        float *win_v
        const float *k_tilde
        const float *q_tilde
        const float *mu
        float *t_hat
        float *z_hat
        float *m_max
        float *scratch

    ctypedef struct cq_nystrom_ops:
        void (*absorb)(cq_nys_view *g, const float *k, const float *v, size_t n) noexcept nogil
        cq_status (*step)(cq_nys_view *g, const float *q, const float *k, const float *v, float *y, int restep) noexcept nogil
        void (*readout)(cq_nys_view *g, const float *q, float *y) noexcept nogil
        cq_status (*seg_means)(const float *x, size_t ld, size_t d, const uint32_t *index, size_t rows, size_t m, double *out) noexcept nogil

    ctypedef struct cq_linalg_ops:
        int (*ridge_pinv)(const double *A, size_t m, double *M, double *work) noexcept nogil
        cq_status (*key_residuals)(const float *k, size_t rows, size_t ld, size_t hd, size_t m, float *out, double *work) noexcept nogil

    ctypedef struct cq_table:
        const char *name
        const cq_mathfn_ops *mathfn
        const cq_hash_ops *hash
        const cq_quant_ops *quant
        const cq_matvec_ops *matvec
        const cq_attn_ops *attn
        const cq_mix_ops *mix
        const cq_nystrom_ops *nystrom
        const cq_linalg_ops *linalg

    ctypedef enum cq_isa:
        CQ_ISA_REF
        CQ_ISA_AVX2
        CQ_ISA_AVX512
        CQ_ISA_NEON
        CQ_ISA_NEON_DOTPROD
        CQ_ISA_COUNT

    const cq_table *cq_table_for(cq_isa isa)
    int cq_isa_usable(cq_isa isa)
    cq_isa cq_isa_best()
    cq_status cq_set_isa(cq_isa isa)
    const cq_table *cq_active()

    const char *cq_compiler()

cdef extern from "pool.h":
    void cq_set_num_threads(int n)
    int cq_get_num_threads()
    int cq_pool_workers()
    unsigned long cq_pool_stalls()
    int cq_pool_spin_us()
    void cq_pool_set_spin_us(int us)
