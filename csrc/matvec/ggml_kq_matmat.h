/* ggml_kq_matmat.h -- matmat with int8 activations for the ggml K-quants (the kq_mm_*
 * hooks that matmat_i8.h's i8_mm_* functions hand these dtypes to), for the x86 tables:
 * u8 x s8 products by vpdpbusd where the CPU has it, else by vpmaddubsw + vpmaddwd (the
 * u8 weights are at most 63, so a pair of products fits int16: every K-quant but
 * iq4_xs, whose u reaches 241). Included by matmat_i8.h, which defines
 * I8MM_PW / I8MM_VW (inputs per panel and per vector); the including ISA file then
 * defines the register tiles (ggml_kq_matmat_tile.h, instantiated by
 * ggml_kq_matmat_avx512.h / ggml_kq_matmat_avx2.h):
 *   static void kq_mm_tiles(int dtype, nv, nr, w, S, M, xp, wd, n, part, ldp, first)
 *   static int kq_mm_cpu(int dtype)
 * Every variant forms the same integers and float operations, so they give the same
 * bits.
 *
 * The integers are those of the int8 matvec (kq_ref_i8_row), with x quantized the same
 * way (cq_xq_quant32 per group of 32):
 *   u = q + B, the weight's integer as u8 (B: q6_k 32, q3_k 4, iq4_xs 128, else 0)
 *   per 16-weight half h of group g: isum_h = sum u*xq - B * sum xq = sum q*xq exactly
 * and the float combination, per input i and row j, with S = d * sc and M = -(dmin * mn)
 * of the half or group:
 *   q4_k, q5_k (a scale and a min per 32 weights, B = 0: the halves are summed as one):
 *     Y += (isum * d_ig) * S_g + (d_ig * sum_g xq) * M_g
 *   q6_k, q3_k, iq4_xs (a scale per 16; iq4_xs's per 32 given to both halves):
 *     h = isum_a * S_a + isum_b * S_b (a multiply, then an FMA), Y += h * d_ig
 *   q2_k (a scale and a min per 16):
 *     Y += (isum_h * d_ig) * S_h + (d_ig * sum_h xq) * M_h, for both halves
 * so a row equals the int8 matvec within float32 rounding (not bitwise: another order
 * and grouping of the float operations; tests/test_ggml_kquants.py).
 *
 * X is packed once per call into panels of up to I8MM_PW inputs; per group g of a
 * panel of width wd (kq_mm_xg * wd bytes):
 *   [xq: 8 steps of (wd inputs x 4 bytes)][bias_a: wd int32][bias_b: wd int32]
 *   [d: wd floats][xd: wd floats] (q2_k: [xd_a][xd_b])
 * with bias_h = -B * sum_h xq, xd = d * sum xq, xd_h = d * sum_h xq, and zero inputs
 * past t. A thread decodes CQ_MM_ROWS weight rows one 256-weight block at a time into
 * u8 rows in L1 (with each row's 16 half scales S and mins M as floats) and runs the
 * tiles over every panel before the next block. The scale-per-16 formats combine a
 * group's two halves before d (three float operations a group instead of six), which
 * takes a third register set and so smaller tiles (ggml_kq_matmat_tile.h). */
#ifndef CQ_GGML_KQ_MATMAT_H
#define CQ_GGML_KQ_MATMAT_H

/* packed bytes per group and input: q2_k has a min per half, so two xd */
static size_t kq_mm_xg(int dtype) { return dtype == CQ_DT_GGML_Q2_K ? 52 : 48; }
static int kq_mm_offset(int dtype) {
    switch (dtype) {
    case CQ_DT_GGML_Q6_K: return 32;
    case CQ_DT_GGML_Q3_K: return 4;
    case CQ_DT_GGML_IQ4_XS: return 128;
    default: return 0;
    }
}
static size_t kq_mm_panel_at(int dtype, size_t ng, size_t p) { return p * I8MM_PW * kq_mm_xg(dtype) * ng; }

static void kq_mm_tiles(int dtype, size_t nv, size_t nr, const uint8_t *w, const float *S, const float *M,
                        const uint8_t *xp, size_t wd, size_t n, float *part, size_t ldp, int first);
/* nonzero where a tile variant runs dtype on this CPU (else the float32 matmat) */
static int kq_mm_cpu(int dtype);

static size_t kq_mm_pack_bytes(const cq_qmat *m, size_t t) {
    const size_t ng = m->cols / CQ_GROUP, np = (t + I8MM_PW - 1) / I8MM_PW;
    return kq_mm_panel_at(m->dtype, ng, np - 1) + kq_mm_xg(m->dtype) * ng * i8mm_wd(t, np - 1);
}

static void kq_mm_pack(const cq_qmat *m, const float *X, size_t t, uint8_t *buf) {
    const size_t cols = m->cols, ng = cols / CQ_GROUP, np = (t + I8MM_PW - 1) / I8MM_PW;
    const int32_t B = kq_mm_offset(m->dtype);
    const size_t xgb = kq_mm_xg(m->dtype);
    const int halves_min = m->dtype == CQ_DT_GGML_Q2_K;
    memset(buf + kq_mm_panel_at(m->dtype, ng, np - 1), 0, xgb * ng * i8mm_wd(t, np - 1));
    for (size_t i = 0; i < t; i++) {
        const size_t p = i / I8MM_PW, li = i % I8MM_PW, wd = i8mm_wd(t, p);
        const float *x = X + i * cols;
        uint8_t *pb = buf + kq_mm_panel_at(m->dtype, ng, p);
        for (size_t g = 0; g < ng; g++) {
            int8_t q[32];
            const float d = mm_quant32(x + CQ_GROUP * g, q);
            int32_t sa = 0, sb = 0;
            for (int k = 0; k < 16; k++) sa += q[k], sb += q[16 + k];
            uint8_t *gb = pb + xgb * wd * g;
            for (int k4 = 0; k4 < 8; k4++) memcpy(gb + 4 * wd * k4 + 4 * li, q + 4 * k4, 4);
            const int32_t ba = -B * sa, bbias = -B * sb;
            memcpy(gb + 32 * wd + 4 * li, &ba, 4);
            memcpy(gb + 36 * wd + 4 * li, &bbias, 4);
            memcpy(gb + 40 * wd + 4 * li, &d, 4);
            if (halves_min) {
                const float xa = d * (float)sa, xb = d * (float)sb;
                memcpy(gb + 44 * wd + 4 * li, &xa, 4);
                memcpy(gb + 48 * wd + 4 * li, &xb, 4);
            } else {
                const float xd = d * (float)(sa + sb);
                memcpy(gb + 44 * wd + 4 * li, &xd, 4);
            }
        }
    }
}

static size_t kq_mm_scratch_bytes(const cq_qmat *m, size_t t) {
    (void)m;
    return CQ_MM_ROWS * (CQ_KQ_BLOCK + 32 * sizeof(float)) + CQ_MM_ROWS * i8mm_upv(t) * sizeof(float) + 128;
}

/* Block b of row r as u8 weights u = q + B and the float scales and mins of its 16
 * halves: q4_k, q5_k, q6_k by kq_u8_block (ggml_kq_decode_avx2.h), the others from
 * the scalar splitter. */
static void kq_mm_decode(const cq_qmat *m, size_t r, size_t b, uint8_t *u, float *S, float *M) {
    const uint8_t *blk = m->data + (r * (m->cols / CQ_KQ_BLOCK) + b) * kq_block_bytes(m->dtype);
    if (kq_u8_has(m->dtype)) {
        kq_u8_block(m->dtype, blk, u, S, M);
        return;
    }
    kq_ints t;
    kq_block_ints(m->dtype, blk, &t);
    const int B = kq_mm_offset(m->dtype);
    for (int k = 0; k < CQ_KQ_BLOCK; k++) u[k] = (uint8_t)(t.q[k] + B);
    for (int s = 0; s < 16; s++) {
        S[s] = t.d * (float)t.sc[s];
        M[s] = -(t.dmin * (float)t.mn[s]);
    }
}

/* Y[i * ldy + j] = row r0 + j . X[i] for j < nr <= CQ_MM_ROWS, i < t (buf: kq_mm_pack). */
static void kq_mm_block(const cq_qmat *m, size_t r0, size_t nr, const uint8_t *buf, size_t t, float *Y, size_t ldy,
                        float *scratch) {
    const size_t ng = m->cols / CQ_GROUP, nb = m->cols / CQ_KQ_BLOCK, ldp = i8mm_upv(t);
    const size_t np = (t + I8MM_PW - 1) / I8MM_PW, bb = kq_block_bytes(m->dtype);
    uint8_t *w = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *S = (float *)(void *)(w + CQ_MM_ROWS * CQ_KQ_BLOCK), *M = S + 16 * CQ_MM_ROWS, *part = M + 16 * CQ_MM_ROWS;
    /* rows past nr: zeros the tiles multiply and nobody reads */
    memset(w + nr * CQ_KQ_BLOCK, 0, (CQ_MM_ROWS - nr) * CQ_KQ_BLOCK);
    memset(S, 0, 32 * CQ_MM_ROWS * sizeof(float));
    for (size_t b = 0; b < nb; b++) {
        for (size_t j = 0; j < nr; j++) {
            kq_mm_decode(m, r0 + j, b, w + j * CQ_KQ_BLOCK, S + 16 * j, M + 16 * j);
            if (b + 1 < nb) { /* the row's next block into L1 while the tiles run */
                const uint8_t *nx = m->data + ((r0 + j) * nb + b + 1) * bb;
                for (size_t o = 0; o < bb; o += 64) _mm_prefetch((const char *)(nx + o), _MM_HINT_T0);
            }
        }
        for (size_t p = 0; p < np; p++) {
            const size_t wd = i8mm_wd(t, p);
            const uint8_t *xp = buf + kq_mm_panel_at(m->dtype, ng, p) + kq_mm_xg(m->dtype) * wd * 8 * b;
            kq_mm_tiles(m->dtype, wd / I8MM_VW, nr, w, S, M, xp, wd, 8, part + I8MM_PW * p, ldp, b == 0);
        }
    }
    for (size_t i = 0; i < t; i++)
        for (size_t j = 0; j < nr; j++) Y[i * ldy + j] = part[j * ldp + i];
}
#endif
