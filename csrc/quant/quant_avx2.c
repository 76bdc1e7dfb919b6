/* quant_avx2.c -- AVX2 twin of quant_ref.c's kernels, bit-exact with them: the same
 * IEEE float32 divisions (vdivps), round-to-nearest-even (vroundps), clamps and f16
 * scale rule; the q8_2f column sums stay float64, row by row, with separate multiply
 * and add (no FMA). Scalar code handles the tails; the loops are quant_drivers.h's. */
#include <immintrin.h>

#include "cortiq.h"
#include "quant_common.h"

#define RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* max |x| over n floats; *bad set when some |x| is not <= limit (NaN included) */
static float absmax(const float *x, size_t n, float limit, int *bad) {
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
    const __m256 lim = _mm256_set1_ps(limit);
    __m256 m = _mm256_setzero_ps(), b = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), _mm256_castsi256_ps(absmask));
        b = _mm256_or_ps(b, _mm256_cmp_ps(a, lim, _CMP_NLE_UQ));
        m = _mm256_max_ps(m, a);
    }
    float lanes[8], mm = 0.0f;
    _mm256_storeu_ps(lanes, m);
    for (int k = 0; k < 8; k++) mm = lanes[k] > mm ? lanes[k] : mm;
    *bad |= _mm256_movemask_ps(b) != 0;
    return sc_absmax(x, i, n, limit, mm, bad);
}

/* 32 rounded+clamped floats (as int32 in 4 vectors) -> 32 int8 in order */
static inline __m256i pack32(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i v = _mm256_packs_epi16(ab, cd);
    return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static inline __m256i qvec(__m256 x, __m256 s, __m256 lo, __m256 hi) {
    __m256 v = _mm256_round_ps(_mm256_div_ps(x, s), RNE);
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    return _mm256_cvtps_epi32(v);
}

/* 32 columns at a time; colv (q8_2f) divides x first, as the reference does */
static void codes(const float *x, const float *colv, size_t n, float s, float lo_f, int8_t *q) {
    const __m256 sv = _mm256_set1_ps(s), lo = _mm256_set1_ps(lo_f), hi = _mm256_set1_ps(127.0f);
    size_t c = 0;
#define CQ_XV(k) (colv ? _mm256_div_ps(_mm256_loadu_ps(x + c + (k)), _mm256_loadu_ps(colv + c + (k))) \
                       : _mm256_loadu_ps(x + c + (k)))
    for (; c + 32 <= n; c += 32) {
        __m256i v = pack32(qvec(CQ_XV(0), sv, lo, hi), qvec(CQ_XV(8), sv, lo, hi),
                           qvec(CQ_XV(16), sv, lo, hi), qvec(CQ_XV(24), sv, lo, hi));
        _mm256_storeu_si256((__m256i *)(q + c), v);
    }
#undef CQ_XV
    sc_codes(x, colv, c, n, s, lo_f, q);
}

static int colsq(const float *x, size_t c0, size_t c1, double *acc) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 lim = _mm256_set1_ps(LIMIT_Q8);
    __m256 bv = _mm256_setzero_ps();
    size_t c = c0;
    for (; c + 8 <= c1; c += 8) {
        __m256 xv = _mm256_loadu_ps(x + c);
        bv = _mm256_or_ps(bv, _mm256_cmp_ps(_mm256_and_ps(xv, absmask), lim, _CMP_NLE_UQ));
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(xv));
        __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(xv, 1));
        _mm256_storeu_pd(acc + c, _mm256_add_pd(_mm256_loadu_pd(acc + c), _mm256_mul_pd(lo, lo)));
        _mm256_storeu_pd(acc + c + 4, _mm256_add_pd(_mm256_loadu_pd(acc + c + 4), _mm256_mul_pd(hi, hi)));
    }
    return sc_colsq(x, c, c1, acc) | (_mm256_movemask_ps(bv) != 0);
}

static float absmax_div(const float *x, const float *colv, size_t n) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 mv = _mm256_setzero_ps();
    size_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256 a = _mm256_div_ps(_mm256_loadu_ps(x + c), _mm256_loadu_ps(colv + c));
        mv = _mm256_max_ps(mv, _mm256_and_ps(a, absmask));
    }
    float lanes[8], am = 0.0f;
    _mm256_storeu_ps(lanes, mv);
    for (int k = 0; k < 8; k++) am = lanes[k] > am ? lanes[k] : am;
    return sc_absmax_div(x, colv, c, n, am);
}

/* one zero-padded group of 32 floats -> 16 nibble bytes + f16 scale bits */
static int group4(const float *g, uint8_t *nib, uint16_t *scale_bits) {
    int bad = 0;
    float am = absmax(g, 32, LIMIT_Q4, &bad), s;
    if (bad) return 1;
    *scale_bits = cq_scale_f16(am / 7.0f, &s);
    const __m256 sv = _mm256_set1_ps(s), lo = _mm256_set1_ps(-8.0f), hi = _mm256_set1_ps(7.0f);
    __m256i v = pack32(qvec(_mm256_loadu_ps(g), sv, lo, hi), qvec(_mm256_loadu_ps(g + 8), sv, lo, hi),
                       qvec(_mm256_loadu_ps(g + 16), sv, lo, hi), qvec(_mm256_loadu_ps(g + 24), sv, lo, hi));
    v = _mm256_add_epi8(v, _mm256_set1_epi8(8)); /* codes 0..15 */
    /* u16 word k holds elements 2k (low byte) and 2k+1 (high byte) */
    __m256i t = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi16(0x000f)),
                                _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi16(0x00f0)));
    __m128i packed = _mm_packus_epi16(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    _mm_storeu_si128((__m128i *)nib, packed);
    return 0;
}

static void f32_to_f16_avx2(const float *x, uint8_t *out, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(out + 2 * i), h);
    }
    for (; i < n; i++) cq_put_u16(out + 2 * i, cq_f32_to_f16(x[i]));
}

static void f16_to_f32_avx2(const uint8_t *x, float *out, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + 2 * i))));
    for (; i < n; i++) out[i] = cq_f16_to_f32((uint16_t)(x[2 * i] | (x[2 * i + 1] << 8)));
}

#include "quant_drivers.h"

CQ_QUANT_OPS(cq_quant_avx2, f32_to_f16_avx2, f16_to_f32_avx2);
