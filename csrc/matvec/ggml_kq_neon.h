/* ggml_kq_neon.h -- the K-quants' int8-activation rows of the NEON tables: the scalar
 * spec (kq_ref_i8_row) for now. Included by matvec_neon_impl.h. */
#ifndef CQ_GGML_KQ_NEON_H
#define CQ_GGML_KQ_NEON_H
static void kq_i8_rows(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *xq, float *out) {
    for (size_t j = 0; j < nr; j++) out[j] = kq_ref_i8_row(m, r0 + j, xq);
}
#endif
