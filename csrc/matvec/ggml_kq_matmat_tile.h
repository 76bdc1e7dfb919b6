/* ggml_kq_matmat_tile.h -- the register tiles of ggml_kq_matmat.h, written once over a
 * vector of KQT_VW int32 / float lanes and included once per instruction set variant.
 * The includer defines:
 *   KQT_SUF                 suffix of the functions made here (kq_mm_tiles_<SUF>)
 *   KQT_TARGET              the target attribute string
 *   KQT_VI, KQT_VF, KQT_VW  the vector types and lanes
 *   KQT_LOADI(p), KQT_SET1I(i), KQT_ZEROI(), KQT_DOT(acc, u8, s8)
 *   KQT_LOADF(p), KQT_LOADUF(p), KQT_STOREUF(p, v), KQT_SET1F(f), KQT_ZEROF(),
 *   KQT_CVT(vi), KQT_MUL(a, b), KQT_FMA(a, b, c)   (a * b + c)
 *   KQT_SHAPES(X)           X(MR, NV) for NV = 1 .. KQT_MAXNV: MR rows x NV vectors
 *   KQT_HSHAPES(X)          the same for the halves tile (q6_k, q3_k, iq4_xs)
 *   KQT_PIN(v)              keeps a vector in a register (an empty asm)
 * and gets
 *   static void kq_mm_tiles_<SUF>(dtype, nv, nr, w, S, M, xp, wd, n, part, ldp, first)
 * (kq_mm_tiles's contract). The header undefines nothing: each inclusion defines the
 * next variant's macros anew. */
#define KQT_CAT2(a, b) a##b
#define KQT_CAT(a, b) KQT_CAT2(a, b)
#define KQT_TILE KQT_CAT(kq_mm_tile_, KQT_SUF)

/* Steps k4 = k0 .. k0 + nk - 1 (4 columns each) of group g into acc[MR * NV]. */
static inline __attribute__((always_inline, target(KQT_TARGET))) void
KQT_CAT(KQT_TILE, _dots)(KQT_VI *acc, const uint8_t *w, const uint8_t *xg, size_t wd, int g, int k0, const int MR,
                         const int NV, const int NK) {
#pragma GCC unroll 8
    for (int kk = 0; kk < NK; kk++) {
        KQT_VI xv[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            xv[v] = KQT_LOADI(xg + 4 * wd * (k0 + kk) + 4 * KQT_VW * v);
            /* kept in a register: folded into each product as a memory operand, the
             * panel would be read MR times a step, and the loads, not the products,
             * set the pace */
            KQT_PIN(xv[v]);
        }
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            int32_t wb;
            memcpy(&wb, w + r * CQ_KQ_BLOCK + 32 * g + 4 * (k0 + kk), 4);
            const KQT_VI b = KQT_SET1I(wb);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r * NV + v] = KQT_DOT(acc[r * NV + v], b, xv[v]);
        }
    }
}

/* Steps k0 .. k0 + NK - 1 of group g into acc[MR * NV], then f += (acc * d) *
 * S[r * 16 + si] per row r and vector. */
static inline __attribute__((always_inline, target(KQT_TARGET))) void
KQT_CAT(KQT_TILE, _span)(KQT_VF *f, KQT_VI *acc, const uint8_t *w, const float *S, const uint8_t *xg, size_t wd, int g,
                         int k0, int si, const int MR, const int NV, const int NK) {
    KQT_CAT(KQT_TILE, _dots)(acc, w, xg, wd, g, k0, MR, NV, NK);
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
        const KQT_VF dv = KQT_LOADF((const float *)(const void *)(xg + 40 * wd + 4 * KQT_VW * v));
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++)
            f[r * NV + v] = KQT_FMA(KQT_MUL(KQT_CVT(acc[r * NV + v]), dv), KQT_SET1F(S[r * 16 + si]), f[r * NV + v]);
    }
}

/* f += xd * M[r * 16 + mi] per row r and vector (the mins' term), xd at byte offset
 * xo * wd of the group. */
static inline __attribute__((always_inline, target(KQT_TARGET))) void
KQT_CAT(KQT_TILE, _mins)(KQT_VF *f, const float *M, const uint8_t *xg, size_t wd, int xo, int mi, const int MR,
                         const int NV) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
        const KQT_VF xd = KQT_LOADF((const float *)(const void *)(xg + xo * wd + 4 * KQT_VW * v));
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) f[r * NV + v] = KQT_FMA(xd, KQT_SET1F(M[r * 16 + mi]), f[r * NV + v]);
    }
}

/* One MR x NV tile over n groups: u8 weights w[r * 256 + 32 g + k], half scales
 * S[r * 16 + 2 g + h] and mins M[r * 16 + 2 g + h], the panel's groups at xp (XG * wd
 * bytes each), partial sums part[r * ldp + KQT_VW v + lane]. HALVES: a scale per 16
 * weights, each half's sum starting from its bias (q6_k, q3_k, iq4_xs; with MINS, q2_k,
 * whose halves have mins too); else one scale and min per 32 (q4_k, q5_k). */
static inline __attribute__((always_inline, target(KQT_TARGET))) void
KQT_TILE(const uint8_t *w, const float *S, const float *M, const uint8_t *xp, size_t wd, size_t n, float *part,
         size_t ldp, int first, const int MR, const int NV, const int HALVES, const int MINS, const int XG) {
    KQT_VF f[12];
    KQT_VI acc[12];
#pragma GCC unroll 12
    for (int k = 0; k < MR * NV; k++) f[k] = first ? KQT_ZEROF() : KQT_LOADUF(part + (k / NV) * ldp + KQT_VW * (k % NV));
    for (size_t g = 0; g < n; g++) {
        const uint8_t *xg = xp + XG * wd * g;
        if (HALVES) {
#pragma GCC unroll 12
            for (int k = 0; k < MR * NV; k++) acc[k] = KQT_LOADI(xg + 32 * wd + 4 * KQT_VW * (k % NV));
            KQT_CAT(KQT_TILE, _span)(f, acc, w, S, xg, wd, (int)g, 0, 2 * (int)g, MR, NV, 4);
            if (MINS) KQT_CAT(KQT_TILE, _mins)(f, M, xg, wd, 44, 2 * (int)g, MR, NV);
#pragma GCC unroll 12
            for (int k = 0; k < MR * NV; k++) acc[k] = KQT_LOADI(xg + 36 * wd + 4 * KQT_VW * (k % NV));
            KQT_CAT(KQT_TILE, _span)(f, acc, w, S, xg, wd, (int)g, 4, 2 * (int)g + 1, MR, NV, 4);
            if (MINS) KQT_CAT(KQT_TILE, _mins)(f, M, xg, wd, 48, 2 * (int)g + 1, MR, NV);
        } else {
#pragma GCC unroll 12
            for (int k = 0; k < MR * NV; k++) acc[k] = KQT_ZEROI();
            KQT_CAT(KQT_TILE, _span)(f, acc, w, S, xg, wd, (int)g, 0, 2 * (int)g, MR, NV, 8);
            KQT_CAT(KQT_TILE, _mins)(f, M, xg, wd, 44, 2 * (int)g, MR, NV);
        }
    }
#pragma GCC unroll 12
    for (int k = 0; k < MR * NV; k++) KQT_STOREUF(part + (k / NV) * ldp + KQT_VW * (k % NV), f[k]);
}

/* One MR x NV tile over n groups for the formats with a scale per 16 weights and no
 * mins (q6_k, q3_k, iq4_xs): per group, the halves' integer sums (each from its bias)
 * are scaled and added as h = float(isum_a) * S_a + float(isum_b) * S_b (a multiply
 * and an FMA), and f += h * d once (an FMA): three float operations a group against
 * the six of a convert, multiply by d and FMA by S per half. The h registers cost a
 * third set of MR * NV, hence the smaller tiles (KQT_HSHAPES). Arguments as KQT_TILE's. */
static inline __attribute__((always_inline, target(KQT_TARGET))) void
KQT_CAT(KQT_TILE, _halves)(const uint8_t *w, const float *S, const uint8_t *xp, size_t wd, size_t n, float *part,
                           size_t ldp, int first, const int MR, const int NV) {
    KQT_VF f[12], h[12];
    KQT_VI acc[12];
#pragma GCC unroll 12
    for (int k = 0; k < MR * NV; k++) f[k] = first ? KQT_ZEROF() : KQT_LOADUF(part + (k / NV) * ldp + KQT_VW * (k % NV));
    for (size_t g = 0; g < n; g++) {
        const uint8_t *xg = xp + 48 * wd * g;
#pragma GCC unroll 12
        for (int k = 0; k < MR * NV; k++) acc[k] = KQT_LOADI(xg + 32 * wd + 4 * KQT_VW * (k % NV));
        KQT_CAT(KQT_TILE, _dots)(acc, w, xg, wd, (int)g, 0, MR, NV, 4);
#pragma GCC unroll 12
        for (int k = 0; k < MR * NV; k++) h[k] = KQT_MUL(KQT_CVT(acc[k]), KQT_SET1F(S[(k / NV) * 16 + 2 * g]));
#pragma GCC unroll 12
        for (int k = 0; k < MR * NV; k++) acc[k] = KQT_LOADI(xg + 36 * wd + 4 * KQT_VW * (k % NV));
        KQT_CAT(KQT_TILE, _dots)(acc, w, xg, wd, (int)g, 4, MR, NV, 4);
#pragma GCC unroll 12
        for (int k = 0; k < MR * NV; k++)
            h[k] = KQT_FMA(KQT_CVT(acc[k]), KQT_SET1F(S[(k / NV) * 16 + 2 * g + 1]), h[k]);
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            const KQT_VF dv = KQT_LOADF((const float *)(const void *)(xg + 40 * wd + 4 * KQT_VW * v));
#pragma GCC unroll 12
            for (int r = 0; r < MR; r++) f[r * NV + v] = KQT_FMA(h[r * NV + v], dv, f[r * NV + v]);
        }
    }
#pragma GCC unroll 12
    for (int k = 0; k < MR * NV; k++) KQT_STOREUF(part + (k / NV) * ldp + KQT_VW * (k % NV), f[k]);
}

/* the three variants: _h halves (q6_k, q3_k, iq4_xs), _m groups with mins (q4_k,
 * q5_k), _hm halves with mins (q2_k) */
#define KQT_FN1(MR, NV, SUF, HALVES, MINS, XG)                                                                   \
    __attribute__((target(KQT_TARGET))) static void KQT_CAT(KQT_TILE, _##MR##x##NV##SUF)(                        \
        const uint8_t *w, const float *S, const float *M, const uint8_t *xp, size_t wd, size_t n, float *part,   \
        size_t ldp, int first) {                                                                                 \
        KQT_TILE(w, S, M, xp, wd, n, part, ldp, first, MR, NV, HALVES, MINS, XG);                                \
    }
#define KQT_FN(MR, NV) KQT_FN1(MR, NV, _m, 0, 1, 48) KQT_FN1(MR, NV, _hm, 1, 1, 52)
KQT_SHAPES(KQT_FN)
#undef KQT_FN
#undef KQT_FN1
#define KQT_FN(MR, NV)                                                                                           \
    __attribute__((target(KQT_TARGET))) static void KQT_CAT(KQT_TILE, _##MR##x##NV##_h)(                         \
        const uint8_t *w, const float *S, const uint8_t *xp, size_t wd, size_t n, float *part, size_t ldp,       \
        int first) {                                                                                             \
        KQT_CAT(KQT_TILE, _halves)(w, S, xp, wd, n, part, ldp, first, MR, NV);                                   \
    }
KQT_HSHAPES(KQT_FN)
#undef KQT_FN

static void KQT_CAT(kq_mm_tiles_, KQT_SUF)(int dtype, size_t nv, size_t nr, const uint8_t *w, const float *S,
                                           const float *M, const uint8_t *xp, size_t wd, size_t n, float *part,
                                           size_t ldp, int first) {
    const int kind = dtype == CQ_DT_GGML_Q4_K || dtype == CQ_DT_GGML_Q5_K ? 1 : dtype == CQ_DT_GGML_Q2_K ? 2 : 0;
    if (kind == 0) {
        switch (nv) {
#define KQT_CASE(MR, NV)                                                                                         \
    case NV:                                                                                                     \
        for (size_t r = 0; r < nr; r += MR)                                                                      \
            KQT_CAT(KQT_TILE, _##MR##x##NV##_h)(w + r * CQ_KQ_BLOCK, S + 16 * r, xp, wd, n, part + r * ldp, ldp, first); \
        break;
            KQT_HSHAPES(KQT_CASE)
#undef KQT_CASE
        default: break;
        }
        return;
    }
    switch (nv) {
#define KQT_CASE(MR, NV)                                                                                         \
    case NV:                                                                                                     \
        for (size_t r = 0; r < nr; r += MR) {                                                                    \
            const uint8_t *wr = w + r * CQ_KQ_BLOCK;                                                             \
            const float *Sr = S + 16 * r, *Mr = M + 16 * r;                                                      \
            float *pr = part + r * ldp;                                                                          \
            if (kind == 1) KQT_CAT(KQT_TILE, _##MR##x##NV##_m)(wr, Sr, Mr, xp, wd, n, pr, ldp, first);           \
            else KQT_CAT(KQT_TILE, _##MR##x##NV##_hm)(wr, Sr, Mr, xp, wd, n, pr, ldp, first);                    \
        }                                                                                                        \
        break;
        KQT_SHAPES(KQT_CASE)
#undef KQT_CASE
    default: break;
    }
}
