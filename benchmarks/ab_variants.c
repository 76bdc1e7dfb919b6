/* ab_variants.c -- in-process A/B of AVX2 matvec-table variants (driven by
 * ab_variants.sh, which compiles each variant of csrc/matvec/matvec_avx2.c with its
 * own -D knobs and renamed ops and links them here).
 *
 *   ab_variants MODE DTYPE_CODE PAYLOAD ROWS COLS ROUNDS THREADS T
 *   MODE: matvec (cycles >= 1 GiB of copies, alternates with the read probe) or
 *         matmat (T inputs, 4 copies of the matrix)
 *
 * This VM's bandwidth drifts by 20-40 % between runs minutes apart, so variants are
 * compared round by round inside one process; it prints each one's best and mean. */
#include "cortiq.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

extern const cq_matvec_ops AB_DECL;
static const cq_matvec_ops *const variants[] = {AB_LIST};
static const char *const names[] = {AB_NAMES};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *huge_alloc(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    madvise(p, n, MADV_HUGEPAGE);
    return p;
}

int main(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr, "usage: %s matvec|matmat DTYPE_CODE PAYLOAD ROWS COLS ROUNDS THREADS T\n", argv[0]);
        return 2;
    }
    const int mm = strcmp(argv[1], "matmat") == 0, dt = atoi(argv[2]);
    const size_t rows = strtoul(argv[4], NULL, 10), cols = strtoul(argv[5], NULL, 10);
    const int rounds = atoi(argv[6]), threads = atoi(argv[7]);
    const size_t t = strtoul(argv[8], NULL, 10), gib = (size_t)1 << 30;
    const size_t nb = cq_qmat_nbytes(dt, rows, cols);
    if (nb == 0) {
        fprintf(stderr, "dtype %d does not take %zu x %zu\n", dt, rows, cols);
        return 2;
    }
    const size_t ncp = mm ? 4 : (gib + nb - 1) / nb;
    uint8_t *w = huge_alloc(nb * ncp);
    FILE *f = fopen(argv[3], "rb");
    if (!f || fread(w, 1, nb, f) != nb) {
        fprintf(stderr, "%s: not a %zu-byte payload\n", argv[3], nb);
        return 2;
    }
    fclose(f);
    for (size_t i = 1; i < ncp; i++) memcpy(w + i * nb, w, nb);
    const size_t naux = cq_qmat_aux_len(dt, rows, cols);
    float *aux = naux ? malloc(naux * sizeof(float)) : NULL;
    cq_qmat *m = malloc(ncp * sizeof *m);
    for (size_t i = 0; i < ncp; i++) m[i] = (cq_qmat){w + i * nb, nb, rows, cols, dt, aux, NULL};
    if (naux && cq_qmat_prepare(&m[0], aux) != CQ_OK) {
        fprintf(stderr, "payload does not decode\n");
        return 2;
    }
    uint8_t *probe = huge_alloc(gib);
    memset(probe, 1, gib);
    const size_t nx = mm ? t * cols : cols, ny = mm ? t * rows : rows;
    float *x = malloc(nx * sizeof(float)), *y = malloc(ny * sizeof(float)), *y0 = malloc(ny * sizeof(float));
    for (size_t i = 0; i < nx; i++) x[i] = (float)((int)(i * 37 % 101) - 50) / 50.0f;
    cq_set_num_threads(threads);

    enum { NV = sizeof variants / sizeof variants[0] };
    double best[NV], sum[NV], best_probe = 1e30;
    uint64_t sink = 0;
    for (int v = 0; v < NV; v++) best[v] = 1e30, sum[v] = 0;
    for (int r = 0; r < rounds; r++)
        for (int v = 0; v < NV; v++) {
            if (!mm) {
                double t0 = now();
                sink += cq_read_sum(probe, gib, threads, 4);
                t0 = now() - t0;
                if (t0 < best_probe) best_probe = t0;
            }
            double t0 = now();
            for (size_t i = 0; i < ncp; i++)
                if (mm) variants[v]->matmat(&m[i], x, t, y);
                else variants[v]->matvec(&m[i], x, y);
            t0 = now() - t0;
            if (t0 < best[v]) best[v] = t0;
            sum[v] += t0;
            if (r == 0 && v == 0) memcpy(y0, y, ny * sizeof(float));
            else if (memcmp(y0, y, ny * sizeof(float)) != 0) printf("  (%s's result differs from %s's)\n", names[v], names[0]);
        }
    const double work = mm ? (double)ncp * rows * cols * t / 1e9 : (double)ncp * nb / 1e9;
    const char *unit = mm ? "GMAC/s" : "GB/s";
    printf("%s, %zu x %zu, dtype %d, %d thread(s)%s", mm ? "matmat" : "matvec", rows, cols, dt, threads,
           mm ? "" : ", read probe ");
    if (!mm) printf("%.1f GB/s", gib / best_probe / 1e9);
    if (mm) printf(", t = %zu", t);
    printf("\n");
    for (int v = 0; v < NV; v++)
        printf("  %-14s best %6.1f  mean %6.1f %s\n", names[v], work / best[v], work * rounds / sum[v], unit);
    return (int)(sink & 0);
}
