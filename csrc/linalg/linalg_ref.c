/* linalg_ref.c -- small dense f64 solves for the far field's seal:
 * the ridge pseudo-inverse of the landmark kernel (docs/nystrom.md §1.4) and the
 * reference engine's key residuals against segment-mean landmarks (exact-row choice). Scalar
 * only: both run once per seal, O(m^3) and O(rows * m * (hd + m)). */
#include "../cortiq.h"
#include <float.h>
#include <math.h>
#include <string.h>

/* In-place lower Cholesky of a[m][m] (lower triangle read/written). 0 on a
 * non-positive or non-finite pivot. */
static int chol(double *a, size_t m) {
    for (size_t j = 0; j < m; j++) {
        for (size_t i = j; i < m; i++) {
            double s = a[i * m + j];
            for (size_t c = 0; c < j; c++) s -= a[i * m + c] * a[j * m + c];
            if (i == j) {
                if (!(s > 0.0) || !isfinite(s)) return 0;
                a[j * m + j] = sqrt(s);
            } else {
                a[i * m + j] = s / a[j * m + j];
            }
        }
    }
    return 1;
}

/* Solve L L^T x = b in place (x overwrites b). */
static void chol_solve(const double *l, size_t m, double *b) {
    for (size_t i = 0; i < m; i++) {
        double s = b[i];
        for (size_t c = 0; c < i; c++) s -= l[i * m + c] * b[c];
        b[i] = s / l[i * m + i];
    }
    for (size_t i = m; i-- > 0;) {
        double s = b[i];
        for (size_t c = i + 1; c < m; c++) s -= l[c * m + i] * b[c];
        b[i] = s / l[i * m + i];
    }
}

static int ridge_pinv(const double *A, size_t m, double *M, double *work) {
    double *G = work, *L = work + m * m, *col = work + 2 * m * m;
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < m; j++) {
            double s = 0.0;
            for (size_t r = 0; r < m; r++) s += A[r * m + i] * A[r * m + j];
            G[i * m + j] = s;
        }
    double mean = 0.0;
    for (size_t i = 0; i < m; i++) mean += G[i * m + i];
    mean /= (double)(m ? m : 1);
    if (!(mean > DBL_MIN)) mean = DBL_MIN;
    double lam = 1e-6 * mean;
    for (int attempt = 1; attempt <= 12; attempt++, lam *= 10.0) {
        memcpy(L, G, m * m * sizeof(double));
        for (size_t i = 0; i < m; i++) L[i * m + i] += lam;
        if (!chol(L, m)) continue;
        /* column c of M solves (G + lam I) x = column c of A^T = row c of A */
        for (size_t c = 0; c < m; c++) {
            for (size_t i = 0; i < m; i++) col[i] = A[c * m + i];
            chol_solve(L, m, col);
            for (size_t i = 0; i < m; i++) M[i * m + c] = col[i];
        }
        return attempt;
    }
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < m; j++) M[i * m + j] = i == j ? 1.0 / mean : 0.0;
    return 0;
}

#define KR_RIDGE 1e-4

static cq_status key_residuals(const float *k, size_t rows, size_t ld, size_t hd, size_t m,
                               float *out, double *work) {
    if (m == 0 || rows == 0) return CQ_ERR_ARG;
    double *L = work, *G = work + m * hd, *y = G + m * m, *c = y + m;
    for (size_t a = 0; a < m; a++) {
        size_t lo = a * rows / m, hi = (a + 1) * rows / m;
        if (hi < lo + 1) hi = lo + 1;
        if (hi > rows) hi = rows;
        double *l = L + a * hd;
        for (size_t j = 0; j < hd; j++) l[j] = 0.0;
        for (size_t r = lo; r < hi; r++)
            for (size_t j = 0; j < hd; j++) l[j] += (double)k[r * ld + j];
        double f = hi > lo ? 1.0 / (double)(hi - lo) : 0.0;
        for (size_t j = 0; j < hd; j++) l[j] *= f;
    }
    for (size_t a = 0; a < m; a++)
        for (size_t b = 0; b <= a; b++) {
            double s = 0.0;
            for (size_t j = 0; j < hd; j++) s += L[a * hd + j] * L[b * hd + j];
            G[a * m + b] = s + (a == b ? KR_RIDGE : 0.0);
        }
    /* the reference engine's Cholesky: pivots floored at 1e-12, never fails */
    for (size_t a = 0; a < m; a++)
        for (size_t b = 0; b <= a; b++) {
            double v = G[a * m + b];
            for (size_t e = 0; e < b; e++) v -= G[a * m + e] * G[b * m + e];
            G[a * m + b] = a == b ? sqrt(v > 1e-12 ? v : 1e-12) : v / G[b * m + b];
        }
    for (size_t r = 0; r < rows; r++) {
        const float *kr = k + r * ld;
        double kk = 0.0;
        for (size_t j = 0; j < hd; j++) kk += (double)kr[j] * (double)kr[j];
        for (size_t a = 0; a < m; a++) {
            double s = 0.0;
            for (size_t j = 0; j < hd; j++) s += L[a * hd + j] * (double)kr[j];
            y[a] = c[a] = s;
        }
        chol_solve(G, m, c);
        double cy = 0.0, cc = 0.0;
        for (size_t a = 0; a < m; a++) {
            cy += c[a] * y[a];
            cc += c[a] * c[a];
        }
        out[r] = (float)(kk - cy - KR_RIDGE * cc);
    }
    return CQ_OK;
}

const cq_linalg_ops cq_linalg_ref = {ridge_pinv, key_residuals};
