/* hash_common.h -- pieces of hash64 (docs/cmf-format.md §6.1) shared by the ISA twins.
 *
 *   fmix(x): x ^= x>>33; x *= 0xFF51AFD7ED558CCD; x ^= x>>33; x *= 0xC4CEB9FE1A85EC53; x ^= x>>33
 *   acc = XOR over words i of fmix(w_i) ^ (i * 0x9E3779B97F4A7C15)   (w_i little-endian,
 *         the last partial word zero-padded)
 *   hash64 = fmix(acc ^ n)
 */
#ifndef CQ_HASH_COMMON_H
#define CQ_HASH_COMMON_H
#include <stdint.h>
#include <string.h>

#define CQ_H_M1 0xFF51AFD7ED558CCDull
#define CQ_H_M2 0xC4CEB9FE1A85EC53ull
#define CQ_H_G 0x9E3779B97F4A7C15ull

static inline uint64_t cq_h_fmix(uint64_t x) {
    x ^= x >> 33;
    x *= CQ_H_M1;
    x ^= x >> 33;
    x *= CQ_H_M2;
    x ^= x >> 33;
    return x;
}

static inline uint64_t cq_h_load_le(const uint8_t *p) {
    uint64_t w;
    memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

/* Fold words [i0, nw) of p (nw = n/8 complete words) plus the zero-padded tail into acc
 * and finish. Shared scalar tail of every twin. */
static inline uint64_t cq_h_finish(const uint8_t *p, size_t n, size_t i0, uint64_t acc) {
    size_t nw = n / 8, i;
    for (i = i0; i < nw; i++) acc ^= cq_h_fmix(cq_h_load_le(p + 8 * i)) ^ ((uint64_t)i * CQ_H_G);
    if (n % 8) {
        uint8_t last[8] = {0};
        memcpy(last, p + 8 * nw, n % 8);
        acc ^= cq_h_fmix(cq_h_load_le(last)) ^ ((uint64_t)nw * CQ_H_G);
    }
    return cq_h_fmix(acc ^ (uint64_t)n);
}
#endif
