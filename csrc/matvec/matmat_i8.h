/* matmat_i8.h -- matmat with int8 activations (the CQ_HAVE_I8_MM hooks of i8_x.h) for
 * q8_row, q8_2f, q4_block, q4_tiled, q4tp and q2tp (the ggml K-quants: ggml_kq_matmat.h,
 * behind the same hooks), written once for the SIMD tables
 * whose CPU has a u8 x s8 dot product instruction (vpdpbusd: AVX-512 VNNI, AVX-VNNI or
 * AVX-512 VNNI on 256 bits). Included after matmat_packed.h by a file that defines
 *   I8MM_PW, I8MM_VW  inputs per panel and per vector (AVX-512: 64, 16; AVX2: 24, 8)
 * and, after including it, the register tiles:
 *   static int i8mm_cpu(void)  -- nonzero where a tile variant runs on this CPU
 *   static void i8mm_tiles(size_t nv, size_t nr, w, sc, xp, wd, n, part, ldp, first,
 *                          rowscale)  -- rows 0 .. nr-1 of the block against one panel
 *                          of nv vectors (see i8_mm_block)
 * Where i8mm_cpu() is 0 the float32 matmat does the work (i8_mm_takes).
 *
 * The integer algorithm (per input i, row j, group g of 32 columns):
 *   xq_i, d_ig as the int8 matvec quantizes them (qmat.h: cq_xq_quant32; q8_2f on col*x)
 *   u_j = the weights as u8: q8 w + 128 (w ^ 0x80), q4 the nibble (q + 8), q2tp 2v
 *   isum = sum_k u_jk xq_ik - B * sum_k xq_ik     (B = 128, 8, 3: the u8 offset)
 *        = sum_k q_jk xq_ik exactly (q the weight's integer: q8 w, q4 nibble - 8, q2 2v - 3)
 *   Y[i][j] = rs_j * sum_g d_ig * isum            (q8_row, q8_2f: rs the row scale)
 *           = sum_g (d_ig * isum) * s_jg          (q4: the group scale; q2tp: scale * 0.5)
 * The same integers as the int8 matvec, combined in another order (so equal to it
 * within float32 rounding, not bitwise; tests/test_int8_act.py).
 *
 * Lanes run over I8MM_VW inputs, as in matmat_packed.h: X is packed once per call into
 * panels of up to I8MM_PW inputs, per group [xq: 8 steps of (wd inputs x 4 bytes)]
 * [bias -B*sum xq: wd int32][d: wd floats] (wd the panel's width, a multiple of
 * I8MM_VW, zero inputs past t); a thread decodes CQ_MM_ROWS weight rows 256 columns at
 * a time into u8 rows in L1 and runs register tiles of MR rows x NV vectors: per 4
 * columns NV panel loads, MR broadcasts of 4 weight bytes and MR*NV vpdpbusd (4
 * multiply-adds a lane, against 1 for an FMA); per group and tile MR*NV converts and
 * FMAs apply the scales. */
#ifndef CQ_MATMAT_I8_H
#define CQ_MATMAT_I8_H

#define CQ_HAVE_I8_MM
#define I8MM_KG 8 /* groups per chunk: 256 columns */
#define I8MM_KC (CQ_GROUP * I8MM_KG)

static size_t i8mm_upv(size_t n) { return (n + I8MM_VW - 1) / I8MM_VW * I8MM_VW; }
static size_t i8mm_up64(size_t n) { return (n + 63) & ~(size_t)63; }
/* Width of panel p (inputs I8MM_PW p ..) and where it starts in the packed buffer. */
static size_t i8mm_wd(size_t t, size_t p) {
    const size_t n = t - I8MM_PW * p;
    return n >= I8MM_PW ? I8MM_PW : i8mm_upv(n);
}
static size_t i8mm_panel_at(size_t ng, size_t p) { return p * I8MM_PW * 40 * ng; }
static int i8mm_offset(int dtype) {
    switch (dtype) {
    case CQ_DT_Q8_ROW: case CQ_DT_Q8_2F: case CQ_DT_GGML_Q8_0: case CQ_DT_GGML_IQ4_NL: return 128;
    case CQ_DT_Q2TP: return 3;
    case CQ_DT_GGML_Q5_0: return 16;
    default: return 8; /* q4 and q4_0 */
    }
}

static int i8mm_cpu(void);
static void i8mm_tiles(size_t nv, size_t nr, const uint8_t *w, const float *sc, const uint8_t *xp, size_t wd,
                       size_t n, float *part, size_t ldp, int first, int rowscale);
/* The ggml formats whose weight is d * code go through the tiles (u = code + offset,
 * the block's d as the group scale); the others (a min, or the K-quants' sub-block
 * scales) take i8_x.h's portable int8 matmat (t int8 matvecs), as all do without a
 * vpdpbusd. */
static int i8mm_ggml_tiles(const cq_qmat *m) {
    switch (m->dtype) {
    case CQ_DT_GGML_Q8_0: case CQ_DT_GGML_Q4_0: case CQ_DT_GGML_Q5_0: case CQ_DT_GGML_IQ4_NL: return 1;
    default: return 0;
    }
}
static size_t i8pm_pack_bytes(const cq_qmat *m, size_t t);
static void i8pm_pack(const cq_qmat *m, const float *X, size_t t, uint8_t *buf);
static size_t i8pm_scratch_bytes(const cq_qmat *m, size_t t);
static void i8pm_block(const cq_qmat *m, size_t r0, size_t nr, const uint8_t *buf, size_t t, float *Y, size_t ldy,
                       float *scratch);
static int i8mm_portable(const cq_qmat *m) { return cq_dt_ggml(m->dtype) && !(i8mm_ggml_tiles(m) && i8mm_cpu()); }
/* One group of a prompt row quantized as the int8 matvec quantizes it (qmat.h cq_xq):
 * the 8-lane builder where it applies, the scalar spec otherwise (the same bytes). */
static inline float mm_quant32(const float *xg, int8_t *q) {
    int32_t qi[32];
    float d;
    if (!avx2_quant32(xg, qi, &d)) return cq_xq_quant32(xg, q);
    for (int k = 0; k < 32; k++) q[k] = (int8_t)qi[k];
    return d;
}
#include "ggml_kq_matmat.h" /* the K-quants' own pack, decode and tiles (kq_mm_*) */
/* The K-quants take their own tiles where this CPU has them (else the portable path). */
static int i8mm_kq(const cq_qmat *m) { return kq_is(m->dtype) && kq_mm_cpu(m->dtype); }
static int i8_mm_takes(const cq_qmat *m) { return i8_takes(m) && (i8mm_kq(m) || i8mm_portable(m) || i8mm_cpu()); }

static size_t i8_mm_pack_bytes(const cq_qmat *m, size_t t) {
    if (i8mm_kq(m)) return kq_mm_pack_bytes(m, t);
    if (i8mm_portable(m)) return i8pm_pack_bytes(m, t);
    const size_t ng = m->cols / CQ_GROUP, np = (t + I8MM_PW - 1) / I8MM_PW;
    return i8mm_panel_at(ng, np - 1) + 40 * ng * i8mm_wd(t, np - 1) + i8mm_up64(m->cols * sizeof(float));
}

static void i8_mm_pack(const cq_qmat *m, const float *X, size_t t, uint8_t *buf) {
    if (i8mm_kq(m)) {
        kq_mm_pack(m, X, t, buf);
        return;
    }
    if (i8mm_portable(m)) {
        i8pm_pack(m, X, t, buf);
        return;
    }
    const size_t cols = m->cols, ng = cols / CQ_GROUP, np = (t + I8MM_PW - 1) / I8MM_PW;
    const int32_t B = i8mm_offset(m->dtype);
    float *xs = (float *)(void *)(buf + i8_mm_pack_bytes(m, t) - i8mm_up64(cols * sizeof(float)));
    /* the last panel's padding inputs: zeros (xq, bias and d) */
    const size_t lp = np - 1;
    memset(buf + i8mm_panel_at(ng, lp), 0, 40 * ng * i8mm_wd(t, lp));
    for (size_t i = 0; i < t; i++) {
        const size_t p = i / I8MM_PW, li = i % I8MM_PW, wd = i8mm_wd(t, p);
        const float *x = X + i * cols;
        if (m->dtype == CQ_DT_Q8_2F) { /* col * x, as the int8 matvec (i8_x_build) */
            const float *col = m->aux + m->rows;
            for (size_t c = 0; c < cols; c++) xs[c] = col[c] * x[c];
            x = xs;
        }
        uint8_t *pb = buf + i8mm_panel_at(ng, p);
        for (size_t g = 0; g < ng; g++) {
            int8_t q[32];
            const float d = mm_quant32(x + CQ_GROUP * g, q);
            int32_t s = 0;
            for (int k = 0; k < 32; k++) s += q[k];
            uint8_t *gb = pb + 40 * wd * g;
            for (int k4 = 0; k4 < 8; k4++) memcpy(gb + 4 * wd * k4 + 4 * li, q + 4 * k4, 4);
            const int32_t bias = -B * s;
            memcpy(gb + 32 * wd + 4 * li, &bias, 4);
            memcpy(gb + 36 * wd + 4 * li, &d, 4);
        }
    }
}

static size_t i8_mm_scratch_bytes(const cq_qmat *m, size_t t) {
    if (i8mm_kq(m)) return kq_mm_scratch_bytes(m, t);
    if (i8mm_portable(m)) return i8pm_scratch_bytes(m, t);
    return CQ_MM_ROWS * I8MM_KC + CQ_MM_ROWS * I8MM_KG * sizeof(float) + CQ_MM_ROWS * i8mm_upv(t) * sizeof(float) + 128;
}

/* Groups [ga, ga + n) of row r as u8 weights (32 bytes a group) and their scales. */
static void i8mm_decode(const cq_qmat *m, size_t r, size_t ga, size_t n, uint8_t *u, float *sc) {
    const size_t gpr = m->cols / CQ_GROUP;
    switch (m->dtype) {
    case CQ_DT_Q8_ROW:
    case CQ_DT_Q8_2F: {
        const uint8_t *p = m->data + r * m->cols + CQ_GROUP * ga;
        const __m256i flip = _mm256_set1_epi8((char)0x80);
        for (size_t g = 0; g < n; g++)
            _mm256_store_si256((__m256i *)(u + 32 * g),
                               _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 32 * g)), flip));
        return; /* (the row scale is applied to the whole row) */
    }
    case CQ_DT_Q2TP: {
        const uint8_t *p = m->data + 8 * (r * gpr + ga);
        const __m128i m6 = _mm_set1_epi8(6);
        group_scales(m, r, ga, n, sc);
        for (size_t g = 0; g < n; g++) {
            const __m128i v = _mm_loadl_epi64((const __m128i *)(p + 8 * g));
            const __m128i e0 = Q2_PHASE(_mm_slli_epi16, _mm_srli_epi16, _mm_and_si128, v, 0, m6);
            const __m128i e1 = Q2_PHASE(_mm_slli_epi16, _mm_srli_epi16, _mm_and_si128, v, 1, m6);
            const __m128i e2 = Q2_PHASE(_mm_slli_epi16, _mm_srli_epi16, _mm_and_si128, v, 2, m6);
            const __m128i e3 = Q2_PHASE(_mm_slli_epi16, _mm_srli_epi16, _mm_and_si128, v, 3, m6);
            const __m128i a = _mm_unpacklo_epi8(e0, e1), b = _mm_unpacklo_epi8(e2, e3);
            _mm_store_si128((__m128i *)(u + 32 * g), _mm_unpacklo_epi16(a, b));
            _mm_store_si128((__m128i *)(u + 32 * g + 16), _mm_unpackhi_epi16(a, b));
            sc[g] *= 0.5f;
        }
        return;
    }
    case CQ_DT_GGML_Q8_0: case CQ_DT_GGML_Q4_0: case CQ_DT_GGML_Q5_0: case CQ_DT_GGML_IQ4_NL: {
        const size_t bb = ggml_q32_block_bytes(m->dtype);
        const uint8_t *p = m->data + bb * (r * gpr + ga);
        const __m256i off = _mm256_set1_epi8((char)i8mm_offset(m->dtype));
        for (size_t g = 0; g < n; g++, p += bb) {
            _mm256_store_si256((__m256i *)(u + 32 * g), _mm256_add_epi8(g32_codes(m->dtype, p), off));
            sc[g] = g32_h2f(p);
        }
        return;
    }
    default: { /* q4: nibbles (element 2k low, 2k+1 high of byte k) into column order */
        const size_t gs = m->dtype == CQ_DT_Q4_TILED ? 18 : 16;
        const uint8_t *p = m->data + gs * (r * gpr + ga) + (gs == 18 ? 2 : 0);
        const __m128i m0f = _mm_set1_epi8(0x0F);
        group_scales(m, r, ga, n, sc);
        for (size_t g = 0; g < n; g++) {
            const __m128i v = _mm_loadu_si128((const __m128i *)(p + gs * g));
            const __m128i lo = _mm_and_si128(v, m0f), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m0f);
            _mm_store_si128((__m128i *)(u + 32 * g), _mm_unpacklo_epi8(lo, hi));
            _mm_store_si128((__m128i *)(u + 32 * g + 16), _mm_unpackhi_epi8(lo, hi));
        }
    }
    }
}

/* Y[i * ldy + j] = row r0 + j . X[i] for j < nr <= CQ_MM_ROWS, i < t (buf: i8_mm_pack). */
static void i8_mm_block(const cq_qmat *m, size_t r0, size_t nr, const uint8_t *buf, size_t t, float *Y, size_t ldy,
                        float *scratch) {
    if (i8mm_kq(m)) {
        kq_mm_block(m, r0, nr, buf, t, Y, ldy, scratch);
        return;
    }
    if (i8mm_portable(m)) {
        i8pm_block(m, r0, nr, buf, t, Y, ldy, scratch);
        return;
    }
    const size_t cols = m->cols, ng = cols / CQ_GROUP, ldp = i8mm_upv(t), np = (t + I8MM_PW - 1) / I8MM_PW;
    const int rowscale = m->dtype == CQ_DT_Q8_ROW || m->dtype == CQ_DT_Q8_2F;
    uint8_t *w = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *sc = (float *)(void *)(w + CQ_MM_ROWS * I8MM_KC), *part = sc + CQ_MM_ROWS * I8MM_KG;
    /* rows past nr: zeros the tiles multiply and nobody reads */
    memset(w + nr * I8MM_KC, 0, (CQ_MM_ROWS - nr) * I8MM_KC);
    memset(sc, 0, CQ_MM_ROWS * I8MM_KG * sizeof(float));
    for (size_t ga = 0; ga < ng; ga += I8MM_KG) {
        const size_t n = ng - ga < I8MM_KG ? ng - ga : I8MM_KG;
        for (size_t j = 0; j < nr; j++) i8mm_decode(m, r0 + j, ga, n, w + j * I8MM_KC, sc + j * I8MM_KG);
        mm_prefetch_next(m, r0, nr, CQ_GROUP * (ga + n), I8MM_KC);
        for (size_t p = 0; p < np; p++) {
            const size_t wd = i8mm_wd(t, p);
            const uint8_t *xp = buf + i8mm_panel_at(ng, p) + 40 * wd * ga;
            i8mm_tiles(wd / I8MM_VW, nr, w, sc, xp, wd, n, part + I8MM_PW * p, ldp, ga == 0, rowscale);
        }
    }
    for (size_t i = 0; i < t; i++)
        for (size_t j = 0; j < nr; j++) Y[i * ldy + j] = rowscale ? part[j * ldp + i] * m->aux[r0 + j] : part[j * ldp + i];
}
#endif
