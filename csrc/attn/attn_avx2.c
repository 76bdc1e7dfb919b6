/* attn_avx2.c -- AVX2/FMA twin of attn_ref.c: vector dot/axpy/scale/sum-of-squares
 * and half-split rotary; top-k and the interleaved tail rotary are the shared scalar
 * code. Dots keep two 8-lane accumulators (rounding-level differences from ref). */
#include "attn_scalar.h"
#include "../simd_avx2.h"

static float vdot(const float *a, const float *b, size_t n) { return cq_dot8(a, b, n); }
static void vaxpy(float *y, float a, const float *x, size_t n) {
    __m256 va = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}
/* attn_gqa's value pass, one query head and 64 output floats at a time in 8
 * accumulators over all the keys: each output element is summed over the keys in
 * order with vaxpy's FMA (its scalar tail: mul, add), so the bits are vaxpy's; what
 * goes is the load and store of the output row per key and head (docs/PERFORMANCE.md
 * §9, "Attention values"). */
#define CQ_HAVE_GQA_VALUES
static void gqa_values(float *og, const float *sc, size_t n, const float *val, size_t kv_row, size_t rep,
                       size_t hd) {
    for (size_t h = 0; h < rep; h++) {
        float *o = og + h * hd;
        const float *s = sc + h * n;
        size_t d = 0;
        for (; d + 64 <= hd; d += 64) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            for (size_t e = 0; e < n; e++) {
                const float *v = val + e * kv_row + d;
                for (int b = 0; b < 64; b += 16) _mm_prefetch((const char *)(v + ATTN_PF_KEYS * kv_row + b), _MM_HINT_T0);
                const __m256 w = _mm256_set1_ps(s[e]);
                a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v), a0);
                a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8), a1);
                a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 16), a2);
                a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 24), a3);
                a4 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 32), a4);
                a5 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 40), a5);
                a6 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 48), a6);
                a7 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 56), a7);
            }
            _mm256_storeu_ps(o + d, a0);
            _mm256_storeu_ps(o + d + 8, a1);
            _mm256_storeu_ps(o + d + 16, a2);
            _mm256_storeu_ps(o + d + 24, a3);
            _mm256_storeu_ps(o + d + 32, a4);
            _mm256_storeu_ps(o + d + 40, a5);
            _mm256_storeu_ps(o + d + 48, a6);
            _mm256_storeu_ps(o + d + 56, a7);
        }
        for (; d + 8 <= hd; d += 8) {
            __m256 a = _mm256_setzero_ps();
            for (size_t e = 0; e < n; e++) a = _mm256_fmadd_ps(_mm256_set1_ps(s[e]), _mm256_loadu_ps(val + e * kv_row + d), a);
            _mm256_storeu_ps(o + d, a);
        }
        for (; d < hd; d++) {
            float a = 0.0f;
            for (size_t e = 0; e < n; e++) a += s[e] * val[e * kv_row + d];
            o[d] = a;
        }
    }
}
/* attn_gqa's score pass: four query heads of a group against each key row at once, the
 * key loaded once for all four and eight accumulator chains in flight instead of
 * vdot's two (a decode row's score pass was bound by the latency of vdot's chains and
 * its reduction, one head at a time). Each head's score has cq_dot8's operations in
 * cq_dot8's order -- the same two 8-lane accumulators, tail and reduction -- so the
 * bits are vdot's. */
#define CQ_HAVE_GQA_SCORES
static void gqa_scores(float *sc, const float *qg, const float *keys, size_t n, size_t kv_row, size_t rep,
                       size_t hd, float scale) {
    for (size_t e = 0; e < n; e++) {
        const float *key = keys + e * kv_row;
        if (e + ATTN_PF_KEYS < n) /* the rows are kv_row apart: the hardware does not follow */
            for (size_t b = 0; b < hd * sizeof(float); b += 64) CQ_PREFETCH((const char *)(key + ATTN_PF_KEYS * kv_row) + b);
        size_t h = 0;
        for (; h + 4 <= rep; h += 4) {
            const float *q0 = qg + h * hd, *q1 = q0 + hd, *q2 = q1 + hd, *q3 = q2 + hd;
            __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
            size_t i = 0;
            for (; i + 16 <= hd; i += 16) {
                const __m256 k0 = _mm256_loadu_ps(key + i), k1 = _mm256_loadu_ps(key + i + 8);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + i), k0, a0);
                b0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + i + 8), k1, b0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + i), k0, a1);
                b1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + i + 8), k1, b1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + i), k0, a2);
                b2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + i + 8), k1, b2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + i), k0, a3);
                b3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + i + 8), k1, b3);
            }
            if (i + 8 <= hd) {
                const __m256 k0 = _mm256_loadu_ps(key + i);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + i), k0, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + i), k0, a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + i), k0, a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + i), k0, a3);
                i += 8;
            }
            float s0 = cq_hsum8(_mm256_add_ps(a0, b0)), s1 = cq_hsum8(_mm256_add_ps(a1, b1));
            float s2 = cq_hsum8(_mm256_add_ps(a2, b2)), s3 = cq_hsum8(_mm256_add_ps(a3, b3));
            for (; i < hd; i++) {
                s0 += q0[i] * key[i];
                s1 += q1[i] * key[i];
                s2 += q2[i] * key[i];
                s3 += q3[i] * key[i];
            }
            sc[h * n + e] = s0 * scale;
            sc[(h + 1) * n + e] = s1 * scale;
            sc[(h + 2) * n + e] = s2 * scale;
            sc[(h + 3) * n + e] = s3 * scale;
        }
        for (; h < rep; h++) sc[h * n + e] = vdot(qg + h * hd, key, hd) * scale;
    }
}
static void vscale(float *y, const float *x, float s, const float *w, size_t n) {
    __m256 vs = _mm256_set1_ps(s);
    size_t i = 0;
    if (w) {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), _mm256_loadu_ps(w + i)));
        for (; i < n; i++) y[i] = x[i] * s * w[i];
    } else {
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
        for (; i < n; i++) y[i] = x[i] * s;
    }
}
static float vsumsq(const float *x, size_t n) { return vdot(x, x, n); }
/* Same roundings as the reference (mul, mul, sub/add: no FMA), so bit-identical. */
static void rope_half_row(float *a, float *b, const float *c, const float *s, size_t h, int inverse) {
    __m256 sg = _mm256_set1_ps(inverse ? -0.0f : 0.0f);
    size_t i = 0;
    for (; i + 8 <= h; i += 8) {
        __m256 x = _mm256_loadu_ps(a + i), y = _mm256_loadu_ps(b + i);
        __m256 vc = _mm256_loadu_ps(c + i), vs = _mm256_xor_ps(_mm256_loadu_ps(s + i), sg);
        _mm256_storeu_ps(a + i, _mm256_sub_ps(_mm256_mul_ps(x, vc), _mm256_mul_ps(y, vs)));
        _mm256_storeu_ps(b + i, _mm256_add_ps(_mm256_mul_ps(x, vs), _mm256_mul_ps(y, vc)));
    }
    for (; i < h; i++) {
        float si = inverse ? -s[i] : s[i], x = a[i], y = b[i];
        a[i] = x * c[i] - y * si;
        b[i] = x * si + y * c[i];
    }
}
/* cq_exp1(s[i] - top) on 8 lanes with exactly its operations -- separate mul and add
 * (no FMA; -ffp-contract=off keeps them apart), floor, the same clamp and 2^n -- so
 * every lane equals the scalar bit for bit and attention's softmax weights are the
 * reference's. The scalar exp was most of a decode step's attention time at small
 * head dims (one exp per key and query head). NaN lanes return their input. */
static void vexp_shift(float *s, size_t n, float top) {
    const __m256 t = _mm256_set1_ps(top), lo = _mm256_set1_ps(CQ_EXP_LO),
                 hi = _mm256_set1_ps(CQ_EXP_HI), one = _mm256_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_sub_ps(_mm256_loadu_ps(s + i), t);
        __m256 v = _mm256_max_ps(lo, _mm256_min_ps(hi, x)); /* = the scalar clamp off NaN */
        __m256 nn = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(v, _mm256_set1_ps(CQ_LOG2E)),
                                                  _mm256_set1_ps(0.5f)));
        __m256 g = _mm256_sub_ps(_mm256_sub_ps(v, _mm256_mul_ps(nn, _mm256_set1_ps(CQ_EXP_C1))),
                                 _mm256_mul_ps(nn, _mm256_set1_ps(CQ_EXP_C2)));
        __m256 p = _mm256_set1_ps(CQ_EXP_P0);
        p = _mm256_add_ps(_mm256_mul_ps(p, g), _mm256_set1_ps(CQ_EXP_P1));
        p = _mm256_add_ps(_mm256_mul_ps(p, g), _mm256_set1_ps(CQ_EXP_P2));
        p = _mm256_add_ps(_mm256_mul_ps(p, g), _mm256_set1_ps(CQ_EXP_P3));
        p = _mm256_add_ps(_mm256_mul_ps(p, g), _mm256_set1_ps(CQ_EXP_P4));
        p = _mm256_add_ps(_mm256_mul_ps(p, g), _mm256_set1_ps(CQ_EXP_P5));
        p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, g), g), g), one);
        __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(nn),
                                                       _mm256_set1_epi32(127)), 23);
        __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
        __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
        _mm256_storeu_ps(s + i, _mm256_blendv_ps(r, x, nan));
    }
    for (; i < n; i++) s[i] = cq_exp1(s[i] - top);
}

#include "attn_body.h"

CQ_ATTN_OPS(cq_attn_avx2);
