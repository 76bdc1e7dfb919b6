/* kernel_check.c -- every kernel of the AArch64 tables (neon, neon_dotprod) against the
 * scalar reference table, on random inputs (seeded), many shapes, odd lengths and
 * tails, misaligned buffers and special values (NaN, inf, -0, subnormals, ties), and
 * for the parallel kernels, 1 against 3 threads. Built by tests/arm64/run.sh with the
 * cross compiler and run under qemu-aarch64 (or natively on an arm64 machine).
 *
 * What "agrees" means is each kernel's contract in csrc/cortiq.h:
 *   bit for bit: hash64, the quantizers and f16 conversions (NaN payloads aside on
 *     f16 -> f32, where a signalling NaN comes back quiet, as with F16C), dequant_rows,
 *     the rotaries, top-k, exp inside attention, the int8-activation matvec rows (the
 *     NEON rows combine the exact integer sums in the reference's order), every result
 *     across thread counts and between matvec / matvec_many / row_dot / rows_dot;
 *   within float32 rounding: sums (dot, matvec, matmat, norms, attention), against the
 *     exact sum in double: |simd - exact| <= k(n) * 2^-23 * sum|terms| with k(n) the
 *     length of the longest accumulation chain plus the combining steps;
 *   exp: relative error <= 2e-7 against exp() on [-87, 88] (cortiq.h), the clamp outside.
 * Exit status 0 when every check passed; the first failures are printed. */
#include "cortiq.h"
#include "matvec/qmat.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- checking ----------------------------------------------------------- */
static long n_checks, n_fails;
static char ctx[256]; /* what is being checked: printed with a failure */

static void fail(const char *what, const char *fmt, double a, double b, double tol, size_t i) {
    n_fails++;
    if (n_fails <= 30) {
        printf("FAIL %s [%s]: ", ctx, what);
        printf(fmt, a, b, tol, i);
        printf("\n");
    }
}

static int both_nan(double a, double b) { return a != a && b != b; }

/* a[i] vs b[i] bit for bit (any NaN equals any NaN when nan_any). */
static void check_fbits(const char *what, const float *a, const float *b, size_t n, int nan_any) {
    n_checks++;
    for (size_t i = 0; i < n; i++) {
        uint32_t x, y;
        memcpy(&x, a + i, 4);
        memcpy(&y, b + i, 4);
        if (x == y || (nan_any && both_nan(a[i], b[i]))) continue;
        fail(what, "%.9g vs %.9g (bits differ; tol %g) at %zu", a[i], b[i], 0.0, i);
        return;
    }
}

static void check_bytes(const char *what, const void *a, const void *b, size_t n) {
    n_checks++;
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) {
            fail(what, "byte %.0f vs %.0f (tol %g) at %zu", x[i], y[i], 0.0, i);
            return;
        }
}

/* |a - b| <= tol[i] (NaN equals NaN, inf equals the same inf) */
static void check_near(const char *what, const float *a, const float *b, const double *tol, size_t n) {
    n_checks++;
    for (size_t i = 0; i < n; i++) {
        double x = a[i], y = b[i];
        if (x == y || both_nan(x, y)) continue;
        if (fabs(x - y) <= tol[i]) continue;
        fail(what, "%.9g vs %.9g (tol %.3g) at %zu", x, y, tol[i], i);
        return;
    }
}

/* |a - b| <= rtol * |b| + atol */
static void check_rel(const char *what, const float *a, const float *b, size_t n, double rtol, double atol) {
    double *tol = malloc((n ? n : 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) tol[i] = rtol * fabs((double)b[i]) + atol;
    check_near(what, a, b, tol, n);
    free(tol);
}

#define EPS 1.1920928955078125e-07 /* 2^-23 */

/* ---- random inputs ------------------------------------------------------ */
static uint64_t rng_state;
static uint64_t rnd64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double urand(void) { return (double)(rnd64() >> 11) * (1.0 / 9007199254740992.0); }
static float nrand(void) { /* roughly normal */
    return (float)((urand() + urand() + urand() + urand() - 2.0) * 1.7320508);
}
static size_t irand(size_t n) { return n ? (size_t)(rnd64() % n) : 0; }

static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = nrand() * scale;
}

static const float SPECIAL[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -0.5f, 1.5f, 2.5f, -2.5f, 1e-40f, -1e-42f,
                                1e-30f, 87.0f, -87.0f, 88.0f, 88.5f, -87.5f, -103.0f, 1e10f, -1e10f};
/* a few special values (and with nonfinite, NaN / inf) at random places */
static void sprinkle(float *x, size_t n, int nonfinite) {
    size_t k = n / 16 + 1;
    for (size_t j = 0; j < k && n; j++) {
        size_t i = irand(n), pick = irand(sizeof SPECIAL / sizeof SPECIAL[0] + (nonfinite ? 3 : 0));
        if (pick < sizeof SPECIAL / sizeof SPECIAL[0]) x[i] = SPECIAL[pick];
        else x[i] = pick % 3 == 0 ? NAN : pick % 3 == 1 ? INFINITY : -INFINITY;
    }
}

/* A buffer of n floats starting `off` floats past a 64-byte boundary (misalignment). */
typedef struct { void *raw; float *p; } fbuf;
static fbuf fb_new(size_t n, size_t off) {
    fbuf b;
    b.raw = malloc((n + off + 16) * sizeof(float) + 64);
    b.p = (float *)(((uintptr_t)b.raw + 63) & ~(uintptr_t)63) + off;
    return b;
}

static uint16_t f2h_trunc(float f) { /* f16 bits of a float in f16's normal range (truncated) */
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t s = (x >> 16) & 0x8000u, e = (x >> 23) & 0xff, m = (x >> 13) & 0x3ff;
    if (e < 113) return (uint16_t)s;
    if (e > 142) return (uint16_t)(s | 0x7bff);
    return (uint16_t)(s | ((e - 112) << 10) | m);
}
static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }

/* ---- the tables under test ------------------------------------------------ */
static const cq_table *REF;
static const cq_table *SIMD[2];
static cq_isa SIMD_ISA[2];
static int NSIMD;

static void use(cq_isa isa) { cq_set_isa(isa); }

/* ================================================================ mathfn ==== */
static void test_mathfn(void) {
    static const size_t sizes[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 100, 257, 1000, 4099};
    for (int t = 0; t < NSIMD; t++) {
        const cq_mathfn_ops *S = SIMD[t]->mathfn, *R = REF->mathfn;
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (size_t off = 0; off < 4; off += 3) {
                const size_t n = sizes[si];
                snprintf(ctx, sizeof ctx, "%s mathfn n=%zu off=%zu", SIMD[t]->name, n, off);
                fbuf x = fb_new(n, off), a = fb_new(n, off + 1), b = fb_new(n, 0), y = fb_new(n, off);
                for (size_t i = 0; i < n; i++) x.p[i] = (float)(urand() * 200.0 - 100.0);
                sprinkle(x.p, n, 1);
                /* exp: against exp() in double, and NaN/inf/clamp like the reference */
                S->exp_f32(x.p, a.p, n);
                R->exp_f32(x.p, b.p, n);
                double *tol = malloc((n + 1) * sizeof(double));
                float *ex = malloc((n + 1) * sizeof(float));
                for (size_t i = 0; i < n; i++) {
                    double v = x.p[i] != x.p[i] ? x.p[i] : x.p[i] < -87.0f ? -87.0 : x.p[i] > 88.0f ? 88.0 : x.p[i];
                    ex[i] = (float)exp(v);
                    tol[i] = 2e-7 * fabs(exp(v)); /* cortiq.h: exp8 */
                }
                check_near("exp vs exp()", a.p, ex, tol, n);
                check_near("ref exp vs exp()", b.p, ex, tol, n);
                /* softmax rows, some fully masked */
                const size_t cols = n ? (n % 37) + 1 : 0, rows = cols ? n / cols : 0;
                memcpy(a.p, x.p, n * sizeof(float));
                for (size_t i = 0; i < rows * cols; i++) /* keep it in softmax's usual range */
                    if (isfinite(a.p[i]) && fabsf(a.p[i]) > 50.0f) a.p[i] = fmodf(a.p[i], 50.0f);
                if (rows > 1)
                    for (size_t c = 0; c < cols; c++) a.p[cols + c] = -INFINITY;
                memcpy(b.p, a.p, n * sizeof(float));
                S->softmax_rows(a.p, rows, cols);
                R->softmax_rows(b.p, rows, cols);
                check_rel("softmax", a.p, b.p, rows * cols, (16 + cols) * EPS, 1e-37);
                /* silu_mul / gate_mul over rows of `cols` with shared a, b / s */
                fill(a.p, n, 2.0f);
                fill(y.p, n, 2.0f);
                float *g1 = malloc((n + 1) * sizeof(float)), *g2 = malloc((n + 1) * sizeof(float));
                float *sa = malloc((cols + 1) * sizeof(float)), *sb = malloc((cols + 1) * sizeof(float));
                fill(sa, cols, 1.0f);
                fill(sb, cols, 1.0f);
                memcpy(g1, a.p, n * sizeof(float));
                memcpy(g2, a.p, n * sizeof(float));
                S->silu_mul(g1, y.p, sa, sb, rows, cols);
                R->silu_mul(g2, y.p, sa, sb, rows, cols);
                check_rel("silu_mul", g1, g2, rows * cols, 16 * EPS, 1e-37);
                memcpy(g1, y.p, n * sizeof(float));
                memcpy(g2, y.p, n * sizeof(float));
                S->gate_mul(g1, a.p, sa, rows, cols);
                R->gate_mul(g2, a.p, sa, rows, cols);
                check_rel("gate_mul", g1, g2, rows * cols, 16 * EPS, 1e-37);
                /* dot against the exact sum; axpy against y + alpha*x */
                fill(a.p, n, 1.0f);
                fill(y.p, n, 1.0f);
                double ex_dot = 0.0, mag = 0.0;
                for (size_t i = 0; i < n; i++) {
                    ex_dot += (double)a.p[i] * y.p[i];
                    mag += fabs((double)a.p[i] * y.p[i]);
                }
                float d1 = S->dot_f32(a.p, y.p, n), d2 = REF->mathfn->dot_f32(a.p, y.p, n), de = (float)ex_dot;
                double dt = (n / 16 + 12) * EPS * mag + 1e-30, rt = (n + 2) * EPS * mag + 1e-30;
                check_near("dot vs exact", &d1, &de, &dt, 1);
                check_near("ref dot vs exact", &d2, &de, &rt, 1);
                memcpy(g1, y.p, n * sizeof(float));
                memcpy(g2, y.p, n * sizeof(float));
                const float alpha = nrand();
                S->axpy_f32(g1, alpha, a.p, n);
                R->axpy_f32(g2, alpha, a.p, n);
                for (size_t i = 0; i < n; i++) tol[i] = 2 * EPS * (fabs(y.p[i]) + fabs(alpha * a.p[i]));
                check_near("axpy", g1, g2, tol, n);
                free(tol);
                free(ex);
                free(g1);
                free(g2);
                free(sa);
                free(sb);
                free(x.raw);
                free(a.raw);
                free(b.raw);
                free(y.raw);
            }
    }
}

/* ================================================================== hash ==== */
static void test_hash(void) {
    const size_t N = 5000;
    uint8_t *buf = malloc(N + 16);
    for (size_t i = 0; i < N + 16; i++) buf[i] = (uint8_t)rnd64();
    for (int t = 0; t < NSIMD; t++)
        for (size_t n = 0; n < N; n += n < 200 ? 1 : 97)
            for (size_t off = 0; off < 9; off += 4) {
                snprintf(ctx, sizeof ctx, "%s hash64 n=%zu off=%zu", SIMD[t]->name, n, off);
                uint64_t a = SIMD[t]->hash->hash64(buf + off, n), b = REF->hash->hash64(buf + off, n);
                check_bytes("hash64", &a, &b, 8);
            }
    free(buf);
}

/* ================================================================= quant ==== */
static void quant_case(int t, size_t rows, size_t cols, int special, int threads) {
    const size_t n = rows * cols;
    snprintf(ctx, sizeof ctx, "%s quant %zux%zu special=%d threads=%d", SIMD[t]->name, rows, cols, special, threads);
    fbuf w = fb_new(n, irand(4));
    fill(w.p, n, (float)pow(10.0, (double)irand(7) - 3.0));
    for (size_t i = 0; i < n / 8; i++) { /* ties: multiples of a half under the row scale */
        size_t k = irand(n);
        w.p[k] = (float)((double)irand(255) - 127.0) * 0.5f;
    }
    if (special == 1) sprinkle(w.p, n, 0);
    if (special == 2 && n) w.p[irand(n)] = irand(2) ? NAN : INFINITY;
    if (special == 3 && n) w.p[irand(n)] = 9e6f; /* above the f16 scale limit of q8 */
    const size_t nb = n + 2 * rows + 2 * cols + 18 * (n / 32 + 1) + 64;
    uint8_t *o1 = calloc(nb, 1), *o2 = calloc(nb, 1);
    double *acc = malloc((cols + 1) * sizeof(double));
    float *colv = malloc((cols + 1) * sizeof(float));
    const cq_quant_ops *S = SIMD[t]->quant, *R = REF->quant;
    cq_set_num_threads(threads);
    cq_status s1 = S->q8_row(w.p, rows, cols, o1), s2 = R->q8_row(w.p, rows, cols, o2);
    check_bytes("q8_row status", &s1, &s2, sizeof s1);
    if (s1 == CQ_OK && s2 == CQ_OK) check_bytes("q8_row", o1, o2, n + 2 * rows);
    memset(o1, 0, nb);
    memset(o2, 0, nb);
    s1 = S->q8_2f(w.p, rows, cols, o1, acc, colv);
    s2 = R->q8_2f(w.p, rows, cols, o2, acc, colv);
    check_bytes("q8_2f status", &s1, &s2, sizeof s1);
    if (s1 == CQ_OK && s2 == CQ_OK) check_bytes("q8_2f", o1, o2, n + 2 * rows + 2 * cols);
    memset(o1, 0, nb);
    memset(o2, 0, nb);
    s1 = S->q4_block(w.p, n, o1);
    s2 = R->q4_block(w.p, n, o2);
    check_bytes("q4_block status", &s1, &s2, sizeof s1);
    if (s1 == CQ_OK && s2 == CQ_OK) check_bytes("q4_block", o1, o2, 18 * ((n + 31) / 32));
    memset(o1, 0, nb);
    memset(o2, 0, nb);
    s1 = S->q4_tiled(w.p, n, o1);
    s2 = R->q4_tiled(w.p, n, o2);
    check_bytes("q4_tiled status", &s1, &s2, sizeof s1);
    if (s1 == CQ_OK && s2 == CQ_OK) check_bytes("q4_tiled", o1, o2, 18 * ((n + 31) / 32));
    cq_set_num_threads(1);
    free(o1);
    free(o2);
    free(acc);
    free(colv);
    free(w.raw);
}

static void test_quant(void) {
    for (int t = 0; t < NSIMD; t++) {
        for (int it = 0; it < 60; it++) quant_case(t, 1 + irand(9), 1 + irand(200), it % 4, 1);
        quant_case(t, 64, 1024, 0, 3); /* parallel: identical for any thread count */
        quant_case(t, 3, 40000, 1, 3);
        quant_case(t, 0, 10, 0, 1);
        /* f16 conversions: every f16 value back and forth; floats around every boundary */
        snprintf(ctx, sizeof ctx, "%s f16 conversions", SIMD[t]->name);
        uint8_t *h = malloc(2 * 65536 + 8), *h1 = malloc(2 * 65536 + 8), *h2 = malloc(2 * 65536 + 8);
        float *f1 = malloc(65536 * sizeof(float) + 16), *f2 = malloc(65536 * sizeof(float) + 16);
        for (uint32_t v = 0; v < 65536; v++) put16(h + 2 * v + 1, (uint16_t)v); /* odd address */
        SIMD[t]->quant->f16_to_f32(h + 1, f1, 65536);
        REF->quant->f16_to_f32(h + 1, f2, 65536);
        check_fbits("f16_to_f32 (all values)", f1, f2, 65536, 1);
        const size_t nf = 65536;
        for (size_t i = 0; i < nf; i++) {
            uint32_t b = (uint32_t)rnd64();
            switch (i % 4) {
            case 0: break; /* any float, NaN payloads included */
            case 1: b = (b & 0x80000000u) | ((0x33000000u + (b & 0x0fffffffu)) & 0x7fffffffu); break; /* near f16 */
            case 2: b = (b & 0x80001fffu) | 0x38000000u | ((uint32_t)irand(64) << 21) ; break;
            default: b = (b & 0x80000000u) | (0x38800000u + ((uint32_t)irand(1 << 10) << 13) + 0x1000u); break; /* ties */
            }
            memcpy(f1 + i, &b, 4);
        }
        SIMD[t]->quant->f32_to_f16(f1 + 1, h1 + 1, nf - 1);
        REF->quant->f32_to_f16(f1 + 1, h2 + 1, nf - 1);
        check_bytes("f32_to_f16", h1 + 1, h2 + 1, 2 * (nf - 1));
        free(h);
        free(h1);
        free(h2);
        free(f1);
        free(f2);
    }
}

/* ================================================================ matvec ==== */
/* the ggml K-quants (256-weight blocks: cols a multiple of 256) */
static const int KQ_DTYPES[] = {CQ_DT_GGML_Q4_K, CQ_DT_GGML_Q5_K, CQ_DT_GGML_Q6_K, CQ_DT_GGML_Q2_K, CQ_DT_GGML_Q3_K, CQ_DT_GGML_IQ4_XS};
static const char *kq_name(int dt) {
    switch (dt) {
    case CQ_DT_GGML_Q4_K: return "q4_k"; case CQ_DT_GGML_Q5_K: return "q5_k"; case CQ_DT_GGML_Q6_K: return "q6_k";
    case CQ_DT_GGML_Q2_K: return "q2_k"; case CQ_DT_GGML_Q3_K: return "q3_k"; default: return "iq4_xs";
    }
}
static const int DTYPES[] = {CQ_DT_F32, CQ_DT_F16, CQ_DT_BF16, CQ_DT_Q8_ROW, CQ_DT_Q8_2F, CQ_DT_Q4_BLOCK,
                             CQ_DT_Q4_TILED, CQ_DT_Q4TP, CQ_DT_Q2TP, CQ_DT_VBIT, CQ_DT_VBIT_RO,
                             CQ_DT_GGML_Q8_0, CQ_DT_GGML_Q4_0, CQ_DT_GGML_Q4_1, CQ_DT_GGML_Q5_0,
                             CQ_DT_GGML_Q5_1, CQ_DT_GGML_IQ4_NL};
static const char *dt_name(int dt) {
    switch (dt) {
    case CQ_DT_F32: return "f32"; case CQ_DT_F16: return "f16"; case CQ_DT_BF16: return "bf16";
    case CQ_DT_GGML_Q4_K: case CQ_DT_GGML_Q5_K: case CQ_DT_GGML_Q6_K: case CQ_DT_GGML_Q2_K: case CQ_DT_GGML_Q3_K: case CQ_DT_GGML_IQ4_XS:
        return kq_name(dt);
    case CQ_DT_Q8_ROW: return "q8_row"; case CQ_DT_Q8_2F: return "q8_2f"; case CQ_DT_Q4_BLOCK: return "q4_block";
    case CQ_DT_Q4_TILED: return "q4_tiled"; case CQ_DT_Q4TP: return "q4tp"; case CQ_DT_Q2TP: return "q2tp";
    case CQ_DT_VBIT: return "vbit"; case CQ_DT_VBIT_RO: return "vbit_ro";
    case CQ_DT_GGML_Q8_0: return "q8_0"; case CQ_DT_GGML_Q4_0: return "q4_0"; case CQ_DT_GGML_Q4_1: return "q4_1";
    case CQ_DT_GGML_Q5_0: return "q5_0"; case CQ_DT_GGML_Q5_1: return "q5_1"; default: return "iq4_nl";
    }
}
static int dt_grouped_only(int dt) {
    return dt == CQ_DT_Q4TP || dt == CQ_DT_Q2TP || dt == CQ_DT_VBIT || dt == CQ_DT_VBIT_RO || dt >= 64;
}

/* A random, valid payload of dtype dt (at `off` bytes past an aligned address) with its
 * aux and rowoff; m->act left EXACT. */
typedef struct { cq_qmat m; void *raw; float *aux; uint64_t *rowoff; } qm;
static float scale_for(void) { return (float)(0.5 + urand()) * 0.01f; }
static qm qm_new(int dt, size_t rows, size_t cols, size_t off) {
    qm q;
    memset(&q, 0, sizeof q);
    const size_t n = rows * cols, gpr = cols / 32;
    size_t nb = cq_qmat_nbytes(dt, rows, cols);
    uint8_t widths[4096];
    if (dt == CQ_DT_VBIT || dt == CQ_DT_VBIT_RO) {
        static const uint8_t W[] = {3, 4, 5, 6, 8};
        nb = rows + 2 * rows * gpr + (dt == CQ_DT_VBIT_RO ? 4 * (rows + 1) : 0);
        for (size_t r = 0; r < rows; r++) {
            widths[r] = W[irand(5)];
            nb += (cols * widths[r] + 7) / 8;
        }
    }
    q.raw = malloc(nb + off + 64);
    uint8_t *d = (uint8_t *)(((uintptr_t)q.raw + 63) & ~(uintptr_t)63) + off;
    for (size_t i = 0; i < nb; i++) d[i] = (uint8_t)rnd64();
    switch (dt) {
    case CQ_DT_F32:
        for (size_t i = 0; i < n; i++) {
            float v = nrand();
            memcpy(d + 4 * i, &v, 4);
        }
        break;
    case CQ_DT_F16:
        for (size_t i = 0; i < n; i++) put16(d + 2 * i, i % 97 == 5 ? (uint16_t)(rnd64() & 0x83ff) : f2h_trunc(nrand()));
        break;
    case CQ_DT_BF16:
        for (size_t i = 0; i < n; i++) {
            float v = nrand();
            uint32_t b;
            memcpy(&b, &v, 4);
            put16(d + 2 * i, (uint16_t)(b >> 16));
        }
        break;
    case CQ_DT_Q8_ROW:
    case CQ_DT_Q8_2F:
        for (size_t r = 0; r < rows; r++) put16(d + n + 2 * r, f2h_trunc(scale_for()));
        if (dt == CQ_DT_Q8_2F)
            for (size_t c = 0; c < cols; c++) put16(d + n + 2 * rows + 2 * c, f2h_trunc((float)(0.5 + urand())));
        break;
    case CQ_DT_Q4_BLOCK:
    case CQ_DT_Q4_TILED: {
        const size_t G = (n + 31) / 32;
        for (size_t g = 0; g < G; g++)
            put16(dt == CQ_DT_Q4_TILED ? d + 18 * g : d + 16 * G + 2 * g, f2h_trunc(scale_for() * 10));
        break;
    }
    case CQ_DT_GGML_Q4_K: case CQ_DT_GGML_Q5_K: case CQ_DT_GGML_Q6_K: case CQ_DT_GGML_Q2_K: case CQ_DT_GGML_Q3_K: case CQ_DT_GGML_IQ4_XS: {
        /* d (and dmin) of every block: finite halves of either sign (d, dmin offsets) */
        const size_t bb = nb / (n / 256);
        const size_t od = dt == CQ_DT_GGML_Q6_K ? 208 : dt == CQ_DT_GGML_Q2_K ? 80 : dt == CQ_DT_GGML_Q3_K ? 108 : 0;
        const int has_min = dt == CQ_DT_GGML_Q4_K || dt == CQ_DT_GGML_Q5_K || dt == CQ_DT_GGML_Q2_K;
        for (size_t b = 0; b < n / 256; b++) {
            put16(d + b * bb + od, f2h_trunc(scale_for() * (irand(2) ? 0.1f : -0.1f)));
            if (has_min) put16(d + b * bb + od + 2, f2h_trunc(scale_for() * (irand(2) ? 0.1f : -0.1f)));
        }
        break;
    }
    case CQ_DT_Q4TP:
    case CQ_DT_Q2TP: {
        uint8_t *params = d + rows * gpr * cq_tp_tile(dt);
        for (size_t r = 0; r < rows; r++) {
            put16(params + 4 * r, f2h_trunc((float)(-10.0 + 4.0 * urand())));
            put16(params + 4 * r + 2, f2h_trunc((float)(0.05 + 0.2 * urand())));
        }
        break;
    }
    case CQ_DT_GGML_Q8_0: case CQ_DT_GGML_Q4_0: case CQ_DT_GGML_Q4_1: case CQ_DT_GGML_Q5_0:
    case CQ_DT_GGML_Q5_1: case CQ_DT_GGML_IQ4_NL: { /* random codes; finite f16 scale (and min) per block */
        const size_t nblk = rows * gpr, bb = nblk ? nb / nblk : 0;
        const int min = dt == CQ_DT_GGML_Q4_1 || dt == CQ_DT_GGML_Q5_1;
        for (size_t b = 0; b < rows * gpr; b++) {
            put16(d + bb * b, f2h_trunc(scale_for()));
            if (min) put16(d + bb * b + 2, f2h_trunc(scale_for() * (urand() < 0.5 ? -4 : 4)));
        }
        break;
    }
    default: { /* vbit, vbit_ro */
        for (size_t r = 0; r < rows; r++) d[r] = widths[r];
        for (size_t i = 0; i < rows * gpr; i++) put16(d + rows + 2 * i, f2h_trunc(scale_for()));
        if (dt == CQ_DT_VBIT_RO) {
            uint32_t rel = 0;
            for (size_t r = 0; r <= rows; r++) {
                uint8_t *o = d + rows + 2 * rows * gpr + 4 * r;
                o[0] = (uint8_t)rel; o[1] = (uint8_t)(rel >> 8); o[2] = (uint8_t)(rel >> 16); o[3] = (uint8_t)(rel >> 24);
                if (r < rows) rel += (uint32_t)((cols * widths[r] + 7) / 8);
            }
        }
    }
    }
    q.m.data = d;
    q.m.nbytes = nb;
    q.m.rows = rows;
    q.m.cols = cols;
    q.m.dtype = dt;
    size_t na = cq_qmat_aux_len(dt, rows, cols);
    if (na) {
        q.aux = malloc(na * sizeof(float));
        cq_qmat_prepare(&q.m, q.aux);
        q.m.aux = q.aux;
    }
    if (dt == CQ_DT_VBIT || dt == CQ_DT_VBIT_RO) {
        q.rowoff = malloc((rows + 1) * sizeof(uint64_t));
        if (cq_qmat_prepare_rows(&q.m, q.rowoff) != CQ_OK) {
            printf("internal: bad vbit payload\n");
            exit(2);
        }
        q.m.rowoff = q.rowoff;
    }
    return q;
}
static void qm_free(qm *q) {
    free(q->raw);
    free(q->aux);
    free(q->rowoff);
}

/* tol[r] for a float32-x row: (chain + slack) * eps * sum|w x|, from the exact rows */
static void row_tols(const float *W, size_t rows, size_t cols, const float *x, double *exact, double *tol) {
    for (size_t r = 0; r < rows; r++) {
        double s = 0.0, mag = 0.0;
        for (size_t c = 0; c < cols; c++) {
            const double p = (double)W[r * cols + c] * x[c];
            s += p;
            mag += fabs(p);
        }
        exact[r] = s;
        tol[r] = (cols / 8 + 40) * EPS * mag + 1e-35;
    }
}

static void matvec_case(int t, int dt, size_t rows, size_t cols, int act, int special) {
    const size_t off = irand(4), xoff = irand(4);
    snprintf(ctx, sizeof ctx, "%s matvec %s %zux%zu act=%s off=%zu xoff=%zu special=%d", SIMD[t]->name, dt_name(dt),
             rows, cols, act ? "int8" : "exact", off, xoff, special);
    qm q = qm_new(dt, rows, cols, off);
    q.m.act = act;
    const cq_matvec_ops *S = SIMD[t]->matvec, *R = REF->matvec;
    const size_t T = 1 + irand(30); /* matmat inputs */
    fbuf X = fb_new(T * cols, xoff);
    fill(X.p, T * cols, 1.0f);
    if (special) sprinkle(X.p, cols, special > 1);
    const float *x = X.p;
    float *W = malloc((rows * cols + 1) * sizeof(float)), *W2 = malloc((rows * cols + 1) * sizeof(float));
    float *y1 = malloc((T * rows + 1) * sizeof(float)), *y2 = malloc((T * rows + 1) * sizeof(float));
    float *y3 = malloc((T * rows + 1) * sizeof(float));
    double *ex = malloc((T * rows + 1) * sizeof(double)), *tol = malloc((T * rows + 1) * sizeof(double));
    float *exf = malloc((T * rows + 1) * sizeof(float));
    /* dequant_rows: the reference's values bit for bit (and all of them) */
    cq_status s1 = S->dequant_rows(&q.m, 0, rows, W2), s2 = R->dequant_rows(&q.m, 0, rows, W);
    check_bytes("dequant status", &s1, &s2, sizeof s1);
    check_fbits("dequant_rows", W2, W, rows * cols, 1);
    if (rows > 2) {
        const size_t r0 = 1 + irand(rows - 2), nr = 1 + irand(rows - r0);
        S->dequant_rows(&q.m, r0, nr, W2);
        check_fbits("dequant_rows part", W2, W + r0 * cols, nr * cols, 1);
    } /* W: the reference's weights, for the exact sums below */
    const int i8 = act == CQ_ACT_INT8 && cq_xq_family(dt) >= 0 && cols % 32 == 0 && cols > 0;
    /* matvec */
    s1 = S->matvec(&q.m, x, y1);
    s2 = R->matvec(&q.m, x, y2);
    check_bytes("matvec status", &s1, &s2, sizeof s1);
    if (i8) {
        check_fbits("int8 matvec vs ref", y1, y2, rows, 1);
    } else {
        row_tols(W, rows, cols, x, ex, tol);
        for (size_t r = 0; r < rows; r++) exf[r] = (float)ex[r];
        check_near("matvec vs exact", y1, exf, tol, rows);
        check_near("ref matvec vs exact", y2, exf, tol, rows);
    }
    /* threads, matvec_many, row_dot, rows_dot: the same bits */
    cq_set_num_threads(3);
    S->matvec(&q.m, x, y3);
    cq_set_num_threads(1);
    check_fbits("matvec 3 threads", y3, y1, rows, 0);
    {
        qm q2 = qm_new(dt, rows, cols, 0);
        q2.m.act = act;
        cq_qmat ms[2] = {q.m, q2.m};
        float *z = malloc((rows + 1) * sizeof(float)), *z2 = malloc((rows + 1) * sizeof(float));
        float *ys[2] = {y3, z};
        S->matvec_many(ms, 2, x, ys);
        S->matvec(&q2.m, x, z2);
        check_fbits("matvec_many[0]", y3, y1, rows, 0);
        check_fbits("matvec_many[1]", z, z2, rows, 0);
        free(z);
        free(z2);
        qm_free(&q2);
    }
    if (rows) {
        const size_t r = irand(rows);
        float v = 0;
        S->row_dot(&q.m, r, x, &v);
        check_fbits("row_dot", &v, y1 + r, 1, 0);
        const size_t r0 = irand(rows), nr = 1 + irand(rows - r0);
        S->rows_dot(&q.m, r0, nr, x, y3);
        check_fbits("rows_dot", y3, y1 + r0, nr, 0);
    }
    /* matmat: T inputs at once, against the exact sums (int8: t int8 matvecs) */
    s1 = S->matmat(&q.m, X.p, T, y1);
    s2 = R->matmat(&q.m, X.p, T, y2);
    check_bytes("matmat status", &s1, &s2, sizeof s1);
    if (i8) {
        check_fbits("int8 matmat vs ref", y1, y2, T * rows, 1);
    } else {
        for (size_t i = 0; i < T; i++) {
            row_tols(W, rows, cols, X.p + i * cols, ex + i * rows, tol + i * rows);
            for (size_t r = 0; r < rows; r++) exf[i * rows + r] = (float)ex[i * rows + r];
        }
        check_near("matmat vs exact", y1, exf, tol, T * rows);
        cq_set_num_threads(3);
        S->matmat(&q.m, X.p, T, y3);
        cq_set_num_threads(1);
        check_fbits("matmat 3 threads", y3, y1, T * rows, 0);
    }
    free(W);
    free(W2);
    free(y1);
    free(y2);
    free(y3);
    free(ex);
    free(exf);
    free(tol);
    free(X.raw);
    qm_free(&q);
}

/* The K-quants' float32 path (dequant_rows, the row dots of matvec / row_dot / rows_dot,
 * matmat) against the reference with special block scales: some blocks' d or dmin set
 * to +-0, a subnormal, a large value (f16 up to 65504), inf or NaN (`special` 0..5), and
 * x with zeros and large values. The weights must be the reference's bit for bit; a
 * row whose reference dot is finite within float32 rounding of the exact sum, one that
 * is not the same inf or a NaN too (a sum of +-inf and NaN terms has one class in any
 * order); matmat likewise, and the same bits for 1 and 3 threads. */
static uint16_t kq_special_half(int special) {
    const uint16_t sign = irand(2) ? 0x8000u : 0;
    switch (special) {
    case 1: return sign; /* +-0 */
    case 2: return (uint16_t)(sign | (1 + irand(0x3ff))); /* subnormal */
    case 3: return (uint16_t)(sign | (0x7800u + irand(0x400))); /* 32768 .. 65504 */
    case 4: return (uint16_t)(sign | 0x7c00u); /* inf */
    case 5: return (uint16_t)(0x7c01u + irand(0x3ff)); /* NaN */
    default: return f2h_trunc(scale_for() * (irand(2) ? 0.1f : -0.1f));
    }
}

static void kq_exact_case(int t, int dt, size_t rows, size_t nblk, int special, int xkind) {
    const size_t cols = 256 * nblk, off = irand(4), xoff = irand(4), T = 1 + irand(13);
    snprintf(ctx, sizeof ctx, "%s kq exact %s %zux%zu special=%d x=%d off=%zu xoff=%zu t=%zu", SIMD[t]->name, dt_name(dt),
             rows, cols, special, xkind, off, xoff, T);
    qm q = qm_new(dt, rows, cols, off);
    uint8_t *d = (uint8_t *)q.m.data;
    const size_t bb = q.m.nbytes / (rows * nblk);
    const size_t od = dt == CQ_DT_GGML_Q6_K ? 208 : dt == CQ_DT_GGML_Q2_K ? 80 : dt == CQ_DT_GGML_Q3_K ? 108 : 0;
    const int has_min = dt == CQ_DT_GGML_Q4_K || dt == CQ_DT_GGML_Q5_K || dt == CQ_DT_GGML_Q2_K;
    if (special)
        for (size_t b = 0; b < rows * nblk; b++) {
            if (irand(3)) continue; /* about a third of the blocks */
            put16(d + b * bb + od + (has_min && irand(2) ? 2 : 0), kq_special_half(special));
        }
    fbuf X = fb_new(T * cols, xoff);
    fill(X.p, T * cols, 1.0f);
    for (size_t i = 0; i < T * cols; i++) {
        if (xkind == 1 && irand(3) == 0) X.p[i] = irand(2) ? 0.0f : -0.0f;
        if (xkind == 2 && irand(16) == 0) X.p[i] = (irand(2) ? 1.0f : -1.0f) * (float)pow(10.0, 5.0 + (double)irand(11));
    }
    const cq_matvec_ops *S = SIMD[t]->matvec, *R = REF->matvec;
    float *W = malloc(rows * cols * sizeof(float)), *W2 = malloc(rows * cols * sizeof(float));
    float *y1 = malloc(T * rows * sizeof(float)), *y2 = malloc(T * rows * sizeof(float)), *y3 = malloc(T * rows * sizeof(float));
    float *exf = malloc(T * rows * sizeof(float));
    double *ex = malloc(T * rows * sizeof(double)), *tol = malloc(T * rows * sizeof(double));
    R->dequant_rows(&q.m, 0, rows, W);
    S->dequant_rows(&q.m, 0, rows, W2);
    check_fbits("kq dequant_rows", W2, W, rows * cols, 1);
    if (rows > 1) {
        const size_t r0 = 1 + irand(rows - 1), nr = 1 + irand(rows - r0);
        S->dequant_rows(&q.m, r0, nr, W2);
        check_fbits("kq dequant_rows part", W2, W + r0 * cols, nr * cols, 1);
    }
    /* against the exact sums; a non-finite reference row: the same value or NaN for NaN */
    for (size_t i = 0; i < T; i++) {
        row_tols(W, rows, cols, X.p + i * cols, ex + i * rows, tol + i * rows);
        for (size_t r = 0; r < rows; r++) exf[i * rows + r] = (float)ex[i * rows + r];
    }
    S->matvec(&q.m, X.p, y1);
    R->matvec(&q.m, X.p, y2);
    for (size_t r = 0; r < rows; r++)
        if (!isfinite(y2[r])) exf[r] = y2[r];
    check_near("kq matvec vs exact", y1, exf, tol, rows);
    check_near("kq ref matvec vs exact", y2, exf, tol, rows);
    const size_t rd = irand(rows), r0 = irand(rows), nr = 1 + irand(rows - r0);
    float v = 0.0f;
    S->row_dot(&q.m, rd, X.p, &v);
    check_fbits("kq row_dot", &v, y1 + rd, 1, 0);
    S->rows_dot(&q.m, r0, nr, X.p, y3);
    check_fbits("kq rows_dot", y3, y1 + r0, nr, 0);
    S->matmat(&q.m, X.p, T, y1);
    R->matmat(&q.m, X.p, T, y2);
    for (size_t i = 0; i < T * rows; i++)
        if (!isfinite(y2[i])) exf[i] = y2[i];
    check_near("kq matmat vs exact", y1, exf, tol, T * rows);
    cq_set_num_threads(3);
    S->matmat(&q.m, X.p, T, y3);
    cq_set_num_threads(1);
    check_fbits("kq matmat 3 threads", y3, y1, T * rows, 0);
    free(W); free(W2); free(y1); free(y2); free(y3); free(exf); free(ex); free(tol); free(X.raw);
    qm_free(&q);
}

static void test_matvec(void) {
    static const size_t COLS[] = {1, 3, 4, 7, 16, 17, 31, 32, 33, 63, 64, 96, 100, 128, 160, 255, 256, 320, 1000, 1024, 2080};
    for (int t = 0; t < NSIMD; t++)
        for (size_t di = 0; di < sizeof DTYPES / sizeof DTYPES[0]; di++) {
            const int dt = DTYPES[di];
            for (size_t ci = 0; ci < sizeof COLS / sizeof COLS[0]; ci++) {
                size_t cols = COLS[ci];
                if (dt_grouped_only(dt) && cols % 32) continue;
                const size_t rows = 1 + irand(cols > 500 ? 12 : 40);
                matvec_case(t, dt, rows, cols, CQ_ACT_EXACT, (int)(ci % 3));
                if (cq_xq_family(dt) >= 0) matvec_case(t, dt, rows, cols, CQ_ACT_INT8, (int)(ci % 3 == 1));
            }
            /* big enough for the pool (>= 2^16 weights) and for several matmat blocks */
            matvec_case(t, dt, 150, 512, CQ_ACT_EXACT, 0);
            if (cq_xq_family(dt) >= 0) matvec_case(t, dt, 150, 512, CQ_ACT_INT8, 0);
        }
    /* the K-quants: whole 256-weight blocks; the int8 rows bit for bit against the spec */
    static const size_t KQ_COLS[] = {256, 512, 768, 2304};
    for (int t = 0; t < NSIMD; t++)
        for (size_t di = 0; di < sizeof KQ_DTYPES / sizeof KQ_DTYPES[0]; di++)
            for (size_t ci = 0; ci < sizeof KQ_COLS / sizeof KQ_COLS[0]; ci++) {
                const size_t cols = KQ_COLS[ci], rows = ci == 1 ? 150 : 1 + irand(30);
                matvec_case(t, KQ_DTYPES[di], rows, cols, CQ_ACT_EXACT, (int)(ci % 3));
                matvec_case(t, KQ_DTYPES[di], rows, cols, CQ_ACT_INT8, (int)(ci % 3));
            }
    /* the K-quants' float32 path: odd row counts, 1 to 9 blocks, special scales and x */
    static const size_t KQ_NBLK[] = {1, 2, 3, 9};
    for (int t = 0; t < NSIMD; t++)
        for (size_t di = 0; di < sizeof KQ_DTYPES / sizeof KQ_DTYPES[0]; di++)
            for (int special = 0; special < 6; special++)
                for (int xkind = 0; xkind < 3; xkind++)
                    kq_exact_case(t, KQ_DTYPES[di], 2 * irand(14) + 1, KQ_NBLK[irand(4)], special, xkind);
}

/* ================================================================== attn ==== */
static void test_attn(void) {
    for (int t = 0; t < NSIMD; t++) {
        const cq_attn_ops *S = SIMD[t]->attn, *R = REF->attn;
        for (int it = 0; it < 40; it++) {
            const size_t rows = 1 + irand(5), n = 1 + irand(it < 20 ? 40 : 300);
            snprintf(ctx, sizeof ctx, "%s attn norms rows=%zu n=%zu", SIMD[t]->name, rows, n);
            fbuf x = fb_new(rows * n, irand(4)), w = fb_new(n, irand(4));
            float *a = malloc(rows * n * sizeof(float)), *b = malloc(rows * n * sizeof(float));
            fill(x.p, rows * n, 3.0f);
            fill(w.p, n, 1.0f);
            const float eps = 1e-6f, rt = (n / 16 + 24) * EPS;
            S->rmsnorm(x.p, it & 1 ? w.p : NULL, eps, a, rows, n);
            R->rmsnorm(x.p, it & 1 ? w.p : NULL, eps, b, rows, n);
            check_rel("rmsnorm", a, b, rows * n, rt, 1e-30);
            memcpy(a, x.p, rows * n * sizeof(float));
            memcpy(b, x.p, rows * n * sizeof(float));
            S->justnorm(a, eps, rows, n);
            R->justnorm(b, eps, rows, n);
            check_rel("justnorm", a, b, rows * n, rt, 1e-30);
            free(a);
            free(b);
            free(x.raw);
            free(w.raw);
        }
        for (int it = 0; it < 30; it++) { /* rotaries: bit for bit */
            const size_t tt = 1 + irand(4), heads = 1 + irand(4), hd = 2 * (1 + irand(40));
            const size_t h = hd / 2, rope_dim = 2 * (1 + irand(h)), per_pos = 1 + irand(3);
            snprintf(ctx, sizeof ctx, "%s attn rope t=%zu heads=%zu hd=%zu", SIMD[t]->name, tt, heads, hd);
            const size_t nx = tt * heads * hd;
            float *x = malloc(nx * sizeof(float)), *a = malloc(nx * sizeof(float)), *b = malloc(nx * sizeof(float));
            float *cs = malloc(tt * heads * h * sizeof(float) + 4), *sn = malloc(tt * heads * h * sizeof(float) + 4);
            fill(x, nx, 1.0f);
            sprinkle(x, nx, 1);
            for (size_t i = 0; i < tt * heads * h; i++) {
                cs[i] = cosf((float)i * 0.37f);
                sn[i] = sinf((float)i * 0.37f);
            }
            for (int inv = 0; inv < 2; inv++) {
                memcpy(a, x, nx * sizeof(float));
                memcpy(b, x, nx * sizeof(float));
                S->rope_halfsplit(a, cs, sn, tt, heads, hd, inv);
                R->rope_halfsplit(b, cs, sn, tt, heads, hd, inv);
                check_fbits("rope_halfsplit", a, b, nx, 0);
                memcpy(a, x, nx * sizeof(float));
                memcpy(b, x, nx * sizeof(float));
                const size_t vecs = tt * heads;
                S->rope_interleaved(a, cs, sn, vecs, per_pos, hd, rope_dim, inv);
                R->rope_interleaved(b, cs, sn, vecs, per_pos, hd, rope_dim, inv);
                check_fbits("rope_interleaved", a, b, nx, 0);
            }
            /* top-k: exact, NaN/inf skipped, ties to the lower index */
            const size_t k = 1 + irand(12);
            int64_t *i1 = malloc(tt * heads * k * sizeof(int64_t)), *i2 = malloc(tt * heads * k * sizeof(int64_t));
            int64_t c1[16], c2[16];
            for (size_t i = 0; i < nx; i += 3) x[i] = (float)(int)(x[i] * 4); /* ties */
            S->topk(x, tt * heads, hd, k, i1, c1);
            R->topk(x, tt * heads, hd, k, i2, c2);
            check_bytes("topk idx", i1, i2, tt * heads * k * sizeof(int64_t));
            check_bytes("topk count", c1, c2, tt * heads * sizeof(int64_t));
            /* qk_prep, slerp, gate_norm (rotary + norms: within rounding) */
            fill(x, nx, 1.0f);
            float *scl = malloc(heads * hd * sizeof(float));
            fill(scl, heads * hd, 1.0f);
            memcpy(a, x, nx * sizeof(float));
            memcpy(b, x, nx * sizeof(float));
            S->qk_prep(a, cs, sn, it & 1 ? scl : NULL, tt, heads, hd, 1e-6f);
            R->qk_prep(b, cs, sn, it & 1 ? scl : NULL, tt, heads, hd, 1e-6f);
            check_rel("qk_prep", a, b, nx, (hd / 16 + 24) * EPS, 1e-6);
            float *o1 = malloc(nx * sizeof(float)), *o2 = malloc(nx * sizeof(float)), *al = malloc(hd * sizeof(float));
            fill(o1, nx, 1.0f);
            memcpy(o2, o1, nx * sizeof(float));
            for (size_t i = 0; i < hd; i++) al[i] = (float)urand();
            memcpy(a, x, nx * sizeof(float));
            memcpy(b, x, nx * sizeof(float));
            S->slerp(a, o1, al, tt * heads, hd, 1e-6f);
            R->slerp(b, o2, al, tt * heads, hd, 1e-6f);
            check_rel("slerp", a, b, nx, (hd / 8 + 48) * EPS, 1e-6);
            memcpy(a, x, nx * sizeof(float));
            memcpy(b, x, nx * sizeof(float));
            S->gate_norm(a, o1, al, tt * heads, hd, 1e-6f);
            R->gate_norm(b, o1, al, tt * heads, hd, 1e-6f);
            check_rel("gate_norm", a, b, nx, (hd / 8 + 48) * EPS, 1e-6);
            free(x); free(a); free(b); free(cs); free(sn); free(i1); free(i2); free(scl); free(o1); free(o2); free(al);
        }
        for (int it = 0; it < 24; it++) { /* attention: GQA and sparse with sink */
            const size_t nk = 1 + irand(3), rep = 1 + irand(3), nh = nk * rep, hd = 1 + irand(it < 12 ? 20 : 140);
            const size_t tq = 1 + irand(4), nkeys = tq + irand(40), first = irand(3), window = irand(3) ? 0 : 1 + irand(10);
            const size_t pos0 = first + nkeys - tq;
            snprintf(ctx, sizeof ctx, "%s attn_gqa t=%zu nh=%zu nk=%zu hd=%zu nkeys=%zu window=%zu", SIMD[t]->name, tq, nh,
                     nk, hd, nkeys, window);
            float *q = malloc(tq * nh * hd * sizeof(float)), *K = malloc(nkeys * nk * hd * sizeof(float));
            float *V = malloc(nkeys * nk * hd * sizeof(float));
            float *o1 = malloc(tq * nh * hd * sizeof(float)), *o2 = malloc(tq * nh * hd * sizeof(float));
            fill(q, tq * nh * hd, 1.0f);
            fill(K, nkeys * nk * hd, 1.0f);
            fill(V, nkeys * nk * hd, 1.0f);
            const float scale = 1.0f / sqrtf((float)hd);
            for (int th = 1; th <= 3; th += 2) {
                cq_set_num_threads(th);
                cq_status s1 = S->attn_gqa(q, K, V, o1, tq, nh, nk, hd, nkeys, pos0, first, window, scale);
                cq_status s2 = R->attn_gqa(q, K, V, o2, tq, nh, nk, hd, nkeys, pos0, first, window, scale);
                check_bytes("attn_gqa status", &s1, &s2, sizeof s1);
                check_rel("attn_gqa", o1, o2, tq * nh * hd, 0.0, (hd / 8 + 64) * EPS * 4);
            }
            cq_set_num_threads(1);
            /* sparse: kv [nkv, hd] as key and value, idx with masked slots */
            const size_t m = 1 + irand(20);
            int64_t idx[32];
            for (size_t j = 0; j < m; j++) idx[j] = irand(5) ? (int64_t)irand(nkeys) : -1;
            float sink[16];
            for (size_t h = 0; h < nh; h++) sink[h] = nrand();
            cq_status s1 = S->sparse_attend(q, K, nkeys, idx, m, it & 1 ? sink : NULL, scale, nh, hd, o1);
            cq_status s2 = R->sparse_attend(q, K, nkeys, idx, m, it & 1 ? sink : NULL, scale, nh, hd, o2);
            check_bytes("sparse status", &s1, &s2, sizeof s1);
            check_rel("sparse_attend", o1, o2, nh * hd, 0.0, (hd / 8 + 64) * EPS * 4);
            /* small integers for q and K (every dot exact in any order) and 0/1 values (every
             * product exact): the output is then bit for bit the reference's exactly when the
             * softmax exp is (attn_body.h: vexp_shift) */
            for (size_t i = 0; i < tq * nh * hd; i++) q[i] = (float)((int)irand(7) - 3);
            for (size_t i = 0; i < nkeys * nk * hd; i++) {
                K[i] = (float)((int)irand(7) - 3);
                V[i] = (float)irand(2);
            }
            S->attn_gqa(q, K, V, o1, tq, nh, nk, hd, nkeys, pos0, first, window, scale);
            R->attn_gqa(q, K, V, o2, tq, nh, nk, hd, nkeys, pos0, first, window, scale);
            check_fbits("attn_gqa (exact sums)", o1, o2, tq * nh * hd, 0);
            free(q); free(K); free(V); free(o1); free(o2);
        }
    }
}

/* =================================================================== mix ==== */
static void test_mix(void) {
    for (int t = 0; t < NSIMD; t++) {
        const cq_mix_ops *S = SIMD[t]->mix, *R = REF->mix;
        for (int it = 0; it < 30; it++) {
            const size_t hc = 1 + irand(4), dim = 1 + irand(it < 15 ? 30 : 700), n = hc * dim, mix = (2 + hc) * hc;
            snprintf(ctx, sizeof ctx, "%s mix hc=%zu dim=%zu", SIMD[t]->name, hc, dim);
            fbuf x = fb_new(n, irand(4));
            float *fn = malloc(mix * n * sizeof(float)), *a = malloc((n + mix) * sizeof(float)), *b = malloc((n + mix) * sizeof(float));
            fill(x.p, n, 1.0f);
            fill(fn, mix * n, 0.1f);
            S->hc_mixes(x.p, n, fn, mix, 1e-6f, a);
            R->hc_mixes(x.p, n, fn, mix, 1e-6f, b);
            double *tol = malloc((n + mix + 1) * sizeof(double));
            for (size_t i = 0; i < mix; i++) {
                double mag = 0;
                for (size_t c = 0; c < n; c++) mag += fabs((double)fn[i * n + c] * x.p[c]);
                tol[i] = (n + 64) * EPS * mag * 1.5 + 1e-30; /* (r = rsqrt(mean x^2): relative) */
            }
            check_near("hc_mixes", a, b, tol, mix);
            float pre[8], post[8], comb[64], pre2[8], post2[8], comb2[64], mixes[64], s3[3] = {0.7f, 1.1f, 0.9f};
            fill(mixes, mix, 1.0f);
            fill(b, mix, 0.5f);
            S->hc_split_sinkhorn(mixes, s3, b, hc, 3, 1e-6f, pre, post, comb);
            R->hc_split_sinkhorn(mixes, s3, b, hc, 3, 1e-6f, pre2, post2, comb2);
            check_fbits("split_sinkhorn pre", pre, pre2, hc, 0);
            check_fbits("split_sinkhorn comb", comb, comb2, hc * hc, 0);
            S->hc_fold(x.p, pre, hc, dim, a);
            R->hc_fold(x.p, pre, hc, dim, b);
            check_rel("hc_fold", a, b, dim, 0.0, (hc + 4) * EPS * 8);
            fbuf w = fb_new(dim, 1);
            fill(w.p, dim, 1.0f);
            S->hc_fold_norm(x.p, pre, hc, dim, it & 1 ? w.p : NULL, 1e-6f, a);
            R->hc_fold_norm(x.p, pre, hc, dim, it & 1 ? w.p : NULL, 1e-6f, b);
            check_rel("hc_fold_norm", a, b, dim, (dim / 8 + 64) * EPS, 1e-5);
            float *blk = malloc(dim * sizeof(float)), *o1 = malloc(n * sizeof(float)), *o2 = malloc(n * sizeof(float));
            fill(blk, dim, 1.0f);
            S->hc_expand(blk, x.p, post, comb, hc, dim, o1);
            R->hc_expand(blk, x.p, post, comb, hc, dim, o2);
            check_rel("hc_expand", o1, o2, n, 0.0, (hc + 4) * EPS * 16);
            memcpy(o1, x.p, n * sizeof(float));
            memcpy(o2, x.p, n * sizeof(float));
            S->rms_weighted(o1, it & 1 ? NULL : x.p, dim, 1e-6f);
            R->rms_weighted(o2, it & 1 ? NULL : x.p, dim, 1e-6f);
            check_rel("rms_weighted", o1, o2, dim, (dim / 8 + 64) * EPS, 1e-6);
            /* swiglu, with and without the clamp, special values included */
            float *g1 = malloc(n * sizeof(float)), *g2 = malloc(n * sizeof(float)), *u = malloc(n * sizeof(float));
            fill(g1, n, 6.0f);
            fill(u, n, 3.0f);
            sprinkle(g1, n, 1);
            sprinkle(u, n, 1);
            for (size_t i = 0; i < n; i += 7) g1[i] = -80.0f - (float)irand(20);
            memcpy(g2, g1, n * sizeof(float));
            const float lim = it % 3 ? 7.0f : 0.0f;
            S->swiglu(g1, u, n, lim, 0.75f);
            R->swiglu(g2, u, n, lim, 0.75f);
            check_rel("swiglu", g1, g2, n, 16 * EPS, 1e-35);
            /* pool_by_score: shared scalar code */
            const size_t slots = 1 + irand(5);
            float *kv = malloc(slots * dim * sizeof(float)), *sc = malloc(slots * dim * sizeof(float));
            fill(kv, slots * dim, 1.0f);
            fill(sc, slots * dim, 1.0f);
            sc[0] = -INFINITY;
            S->pool_by_score(kv, sc, slots, dim, o1);
            R->pool_by_score(kv, sc, slots, dim, o2);
            check_fbits("pool_by_score", o1, o2, dim, 0);
            free(fn); free(a); free(b); free(tol); free(blk); free(o1); free(o2); free(g1); free(g2); free(u);
            free(kv); free(sc); free(x.raw); free(w.raw);
        }
        /* grouped_rows and rows_sum go through the active matvec: each table against itself
         * (matvec's rows, bit for bit) and against the reference (within rounding) */
        for (size_t di = 0; di < sizeof DTYPES / sizeof DTYPES[0]; di++) {
            const int dt = DTYPES[di];
            const size_t groups = 1 + irand(4), lora = 1 + irand(20), per = 32 * (1 + irand(6));
            snprintf(ctx, sizeof ctx, "%s mix grouped_rows/rows_sum %s", SIMD[t]->name, dt_name(dt));
            qm q = qm_new(dt, groups * lora, per, irand(3));
            /* two inputs at once: each one's rows are its own row_dot's */
            float *x = malloc(2 * groups * per * sizeof(float)), *o1 = malloc(2 * groups * lora * sizeof(float));
            float *o2 = malloc(groups * lora * sizeof(float)), *y = malloc(2 * groups * lora * sizeof(float));
            fill(x, 2 * groups * per, 1.0f);
            use(SIMD_ISA[t]);
            cq_set_num_threads(3);
            S->grouped_rows(&q.m, x, 2, groups, o1);
            cq_set_num_threads(1);
            for (size_t i = 0; i < 2; i++)
                for (size_t r = 0; r < groups * lora; r++)
                    SIMD[t]->matvec->row_dot(&q.m, r, x + i * groups * per + (r / lora) * per,
                                             y + i * groups * lora + r);
            check_fbits("grouped_rows vs row_dot", o1, y, 2 * groups * lora, 0);
            qm q2 = qm_new(dt, groups * lora, per, 0);
            cq_qmat ms[2] = {q.m, q2.m};
            const float *xs[2] = {x, x + (groups - 1) * per};
            S->rows_sum(ms, 2, xs, o1);
            use(CQ_ISA_REF);
            R->rows_sum(ms, 2, xs, o2);
            double *tol = malloc(groups * lora * sizeof(double));
            float *W = malloc(groups * lora * per * sizeof(float));
            for (size_t r = 0; r < groups * lora; r++) tol[r] = 0;
            for (int j = 0; j < 2; j++) {
                REF->matvec->dequant_rows(&ms[j], 0, groups * lora, W);
                for (size_t r = 0; r < groups * lora; r++)
                    for (size_t c = 0; c < per; c++) tol[r] += (per / 4 + 64) * EPS * fabs((double)W[r * per + c] * xs[j][c]);
            }
            check_near("rows_sum vs ref", o1, o2, tol, groups * lora);
            free(x); free(o1); free(o2); free(y); free(tol); free(W);
            qm_free(&q);
            qm_free(&q2);
        }
    }
}

/* =============================================================== nystrom ==== */
typedef struct {
    cq_nys_view v;
    float *buf;
} nys;
static nys nys_new(size_t d, size_t dv, size_t m, size_t rep, size_t sink_len, size_t w, int exact_only, uint64_t seed) {
    nys s;
    memset(&s, 0, sizeof s);
    const size_t total = sink_len * (d + dv) + w * (d + dv) + m * d + rep * (m * d + m * m + m * dv + 2 * m) +
                         sink_len + w + 3 * m + 16;
    s.buf = calloc(total, sizeof(float));
    float *p = s.buf;
    uint64_t keep = rng_state;
    rng_state = seed; /* both twins get the same state */
    cq_nys_view *g = &s.v;
    g->d = d; g->dv = dv; g->m = m; g->rep = rep; g->sink_len = sink_len; g->w = w;
    g->exact_only = exact_only; g->rect_fm = (int)(seed & 1); g->scale = 1.0f / sqrtf((float)d);
    float *sk = p; p += sink_len * d; fill(sk, sink_len * d, 1.0f); g->sink_k = sk;
    float *sv = p; p += sink_len * dv; fill(sv, sink_len * dv, 1.0f); g->sink_v = sv;
    g->win_k = p; p += w * d;
    g->win_v = p; p += w * dv;
    float *kt = p; p += m * d; fill(kt, m * d, 1.0f); g->k_tilde = kt;
    float *qt = p; p += rep * m * d; fill(qt, rep * m * d, 1.0f); g->q_tilde = qt;
    float *mu = p; p += rep * m * m;
    for (size_t i = 0; i < rep * m * m; i++) mu[i] = (float)urand() * 0.2f + (i % (m + 1) == 0 ? 1.0f : 0.0f);
    g->mu = mu;
    g->t_hat = p; p += rep * m * dv;
    g->z_hat = p; p += rep * m;
    g->m_max = p; p += rep * m;
    for (size_t i = 0; i < rep * m; i++) g->m_max[i] = -INFINITY;
    g->scratch = p;
    rng_state = keep;
    return s;
}

static void test_nystrom(void) {
    for (int t = 0; t < NSIMD; t++)
        for (int it = 0; it < 12; it++) {
            const size_t d = 1 + irand(70), dv = 1 + irand(70), m = 1 + irand(8), rep = 1 + irand(3);
            const size_t sink = irand(3), w = 1 + irand(6);
            const int exact_only = it % 4 == 3;
            snprintf(ctx, sizeof ctx, "%s nystrom d=%zu dv=%zu m=%zu rep=%zu w=%zu exact_only=%d", SIMD[t]->name, d, dv, m,
                     rep, w, exact_only);
            const uint64_t seed = rnd64();
            nys a = nys_new(d, dv, m, rep, sink, w, exact_only, seed), b = nys_new(d, dv, m, rep, sink, w, exact_only, seed);
            float *q = malloc(rep * d * sizeof(float)), *k = malloc(4 * d * sizeof(float)), *v = malloc(4 * dv * sizeof(float));
            float *y1 = malloc(rep * dv * sizeof(float)), *y2 = malloc(rep * dv * sizeof(float));
            fill(k, 4 * d, 1.0f);
            fill(v, 4 * dv, 1.0f);
            if (!exact_only) {
                SIMD[t]->nystrom->absorb(&a.v, k, v, 4);
                REF->nystrom->absorb(&b.v, k, v, 4);
            }
            const double tol = (d + dv + 8 * m + 64) * EPS * 16;
            for (size_t step = 0; step < w + 3; step++) {
                fill(q, rep * d, 1.0f);
                fill(k, d, 1.0f);
                fill(v, dv, 1.0f);
                const int restep = step > 0 && step % 3 == 0;
                cq_status s1 = SIMD[t]->nystrom->step(&a.v, q, k, v, y1, restep);
                cq_status s2 = REF->nystrom->step(&b.v, q, k, v, y2, restep);
                check_bytes("nystrom step status", &s1, &s2, sizeof s1);
                if (s1 == CQ_OK) check_rel("nystrom step", y1, y2, rep * dv, 0.0, tol);
            }
            check_rel("nystrom t_hat", a.v.t_hat, b.v.t_hat, rep * m * dv, 1e-4, 1e-5);
            check_rel("nystrom z_hat", a.v.z_hat, b.v.z_hat, rep * m, 1e-4, 1e-6);
            SIMD[t]->nystrom->readout(&a.v, q, y1);
            REF->nystrom->readout(&b.v, q, y2);
            check_rel("nystrom readout", y1, y2, rep * dv, 0.0, tol);
            /* seg_means: f64 sums, the same code */
            const size_t rows = m + irand(30);
            float *x = malloc(rows * d * sizeof(float));
            fill(x, rows * d, 1.0f);
            double *m1 = malloc(m * d * sizeof(double)), *m2 = malloc(m * d * sizeof(double));
            SIMD[t]->nystrom->seg_means(x, d, d, NULL, rows, m, m1);
            REF->nystrom->seg_means(x, d, d, NULL, rows, m, m2);
            check_bytes("seg_means", m1, m2, m * d * sizeof(double));
            free(x); free(m1); free(m2); free(q); free(k); free(v); free(y1); free(y2); free(a.buf); free(b.buf);
        }
}

/* ================================================================= main ==== */
int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20261201u;
    rng_state = seed;
    REF = cq_table_for(CQ_ISA_REF);
    const cq_isa want[2] = {CQ_ISA_NEON, CQ_ISA_NEON_DOTPROD};
    for (int i = 0; i < 2; i++) {
        if (!cq_table_for(want[i])) {
            printf("FAIL: table %d not compiled in\n", (int)want[i]);
            return 1;
        }
        if (cq_isa_usable(want[i])) {
            SIMD_ISA[NSIMD] = want[i];
            SIMD[NSIMD++] = cq_table_for(want[i]);
        }
    }
    const uint32_t f = cq_cpu_features();
    printf("seed %llu; cpu: asimd=%d asimddp=%d; best table: %s; testing:", (unsigned long long)seed,
           !!(f & CQ_CPU_ASIMD), !!(f & CQ_CPU_ASIMDDP), cq_table_for(cq_isa_best())->name);
    for (int i = 0; i < NSIMD; i++) printf(" %s", SIMD[i]->name);
    printf(" (against ref)\n");
    if (!NSIMD) {
        printf("FAIL: no NEON table usable on this CPU\n");
        return 1;
    }
    if (argc > 2 && (f & CQ_CPU_ASIMDDP) != (strcmp(argv[2], "dotprod") == 0 ? CQ_CPU_ASIMDDP : 0)) {
        printf("FAIL: expected the dot product extension to be %s\n", strcmp(argv[2], "dotprod") == 0 ? "present" : "absent");
        return 1;
    }
    /* dispatch: no x86 table in an AArch64 build; a table the CPU lacks is refused */
    snprintf(ctx, sizeof ctx, "dispatch");
    n_checks++;
    if (cq_table_for(CQ_ISA_AVX2) || cq_table_for(CQ_ISA_AVX512) || cq_isa_usable(CQ_ISA_AVX2))
        fail("x86 tables", "compiled into an AArch64 build (%g %g %g %zu)", 0, 0, 0, 0);
    const cq_status dp = cq_set_isa(CQ_ISA_NEON_DOTPROD);
    if ((dp == CQ_OK) != !!(f & CQ_CPU_ASIMDDP))
        fail("set_isa(neon_dotprod)", "status %g with asimddp %g (%g %zu)", dp, !!(f & CQ_CPU_ASIMDDP), 0, 0);
    if (cq_isa_best() != (f & CQ_CPU_ASIMDDP ? CQ_ISA_NEON_DOTPROD : CQ_ISA_NEON))
        fail("isa_best", "best %g (%g %g %zu)", cq_isa_best(), 0, 0, 0);
    cq_set_isa(CQ_ISA_REF);
    cq_set_num_threads(1);
    test_mathfn();
    printf("mathfn  done (%ld checks, %ld failures)\n", n_checks, n_fails);
    test_hash();
    printf("hash    done (%ld checks, %ld failures)\n", n_checks, n_fails);
    test_quant();
    printf("quant   done (%ld checks, %ld failures)\n", n_checks, n_fails);
    test_matvec();
    printf("matvec  done (%ld checks, %ld failures)\n", n_checks, n_fails);
    test_attn();
    printf("attn    done (%ld checks, %ld failures)\n", n_checks, n_fails);
    test_mix();
    printf("mix     done (%ld checks, %ld failures)\n", n_checks, n_fails);
    test_nystrom();
    printf("nystrom done (%ld checks, %ld failures)\n", n_checks, n_fails);
    printf("%s: %ld checks, %ld failures\n", n_fails ? "FAILED" : "OK", n_checks, n_fails);
    return n_fails ? 1 : 0;
}
