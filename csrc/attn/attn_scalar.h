/* attn_scalar.h -- scalar bodies of the attn family, shared by the reference and the
 * AVX2 twin (which replaces the dot/axpy/norm inner loops). Compiled with
 * -ffp-contract=off everywhere, so a shared function computes the same bits in
 * every ISA file. */
#ifndef CQ_ATTN_SCALAR_H
#define CQ_ATTN_SCALAR_H
#include "../cortiq.h"
#include "../mathfn/exp8.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
/* attn_gqa reads a kv head's key and value rows kv_row floats apart, a stride the
 * hardware prefetchers do not follow: the rows ATTN_PF_KEYS ahead are prefetched.
 * (With gqa_values: see attn_avx2.c.) */
#if defined(__GNUC__) || defined(__clang__)
#define CQ_PREFETCH(p) __builtin_prefetch(p)
#else
#define CQ_PREFETCH(p) ((void)(p))
#endif
#define ATTN_PF_KEYS 8

static void rope_interleaved_s(float *x, const float *cs, const float *sn, size_t vecs,
                               size_t per_pos, size_t hd, size_t rope_dim, int inverse) {
    size_t half = rope_dim / 2, base = hd - rope_dim;
    for (size_t v = 0; v < vecs; v++) {
        float *p = x + v * hd + base;
        const float *c = cs + (v / per_pos) * half, *s = sn + (v / per_pos) * half;
        for (size_t i = 0; i < half; i++) {
            float si = inverse ? -s[i] : s[i], a = p[2 * i], b = p[2 * i + 1];
            p[2 * i] = a * c[i] - b * si;
            p[2 * i + 1] = a * si + b * c[i];
        }
    }
}

/* Top-k by value (finite only), ties to the lower index, descending order. */
static cq_status topk_s(const float *x, size_t rows, size_t n, size_t k, int64_t *idx,
                        int64_t *count) {
    float *vals = (float *)malloc((k ? k : 1) * sizeof(float));
    if (!vals) return CQ_ERR_NOMEM;
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        int64_t *ir = idx + r * k;
        size_t cnt = 0;
        for (size_t i = 0; i < n && k; i++) {
            float v = xr[i];
            if (!isfinite(v)) continue;
            if (cnt == k && !(v > vals[k - 1])) continue;
            /* first position whose value is < v (equal values keep their place:
             * they have lower indices) */
            size_t lo = 0, hi = cnt;
            while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                if (vals[mid] < v) hi = mid;
                else lo = mid + 1;
            }
            size_t move = (cnt == k ? k - 1 : cnt) - lo;
            memmove(vals + lo + 1, vals + lo, move * sizeof(float));
            memmove(ir + lo + 1, ir + lo, move * sizeof(int64_t));
            vals[lo] = v;
            ir[lo] = (int64_t)i;
            if (cnt < k) cnt++;
        }
        for (size_t j = cnt; j < k; j++) ir[j] = -1;
        count[r] = (int64_t)cnt;
    }
    free(vals);
    return CQ_OK;
}

#endif
