/* i8_multi.h -- what the x86 tables' int8 multi-input row tiles share (matvec_batch
 * with int8 activations: CQ_HAVE_I8_MULTI in matvec_drivers.h). A tile is R rows by J
 * inputs (R <= RMAX, J <= 4, constants after inlining): each weight step of its rows
 * is loaded and unpacked once, and every input's integer sums, their conversion and
 * its float multiply-adds are those of the table's single-input int8 row kernel, in
 * its order, so each output equals the int8 matvec of its input bit for bit. Integer
 * sums are exact, so a tile may form them differently (vpdpbusd where that kernel uses
 * vpmaddubsw + vpmaddwd, or the weights offset to unsigned bytes with a correction
 * made once per call: i8_multi_prep).
 *
 * I8M_ROWS(TILE, RMAX): the body of a rows function with parameters (m, r0, nr, xq,
 * corr, t, Y, ldy): inputs four at a time (outer: four inputs' x stay in L1 while the
 * claim's rows, already in L2, stream past), rows RMAX at a time, then the one left;
 * TILE(m, r, xq, corr, Y, ldy, R, J) writes Y[k * ldy + r + i], i < R, k < J. */
#ifndef CQ_I8_MULTI_H
#define CQ_I8_MULTI_H
#define I8M_ROWS(TILE, RMAX)                                                                  \
    for (size_t j0 = 0; j0 < t; j0 += 4) {                                                    \
        const cq_xq *const *x_ = xq + j0;                                                     \
        const int32_t *const *c_ = corr + j0;                                                 \
        float *y_ = Y + j0 * ldy;                                                             \
        const size_t J_ = t - j0 < 4 ? t - j0 : 4;                                            \
        for (size_t r = r0; r < r0 + nr; r += (RMAX)) {                                       \
            const size_t R_ = (RMAX) > 1 && r0 + nr - r >= 2 ? (RMAX) : 1;                    \
            switch (J_ + 4 * (R_ - 1)) {                                                      \
            case 1: TILE(m, r, x_, c_, y_, ldy, 1, 1); break;                                 \
            case 2: TILE(m, r, x_, c_, y_, ldy, 1, 2); break;                                 \
            case 3: TILE(m, r, x_, c_, y_, ldy, 1, 3); break;                                 \
            case 4: TILE(m, r, x_, c_, y_, ldy, 1, 4); break;                                 \
            case 5: TILE(m, r, x_, c_, y_, ldy, (RMAX), 1); break;                            \
            case 6: TILE(m, r, x_, c_, y_, ldy, (RMAX), 2); break;                            \
            case 7: TILE(m, r, x_, c_, y_, ldy, (RMAX), 3); break;                            \
            default: TILE(m, r, x_, c_, y_, ldy, (RMAX), 4);                                  \
            }                                                                                 \
        }                                                                                     \
    }
#endif
