/* hash_ref.c -- portable hash64 (docs/cmf-format.md §6.1). Four independent accumulators so the
 * two 64-bit multiplies of consecutive words overlap; the word index term i*G is kept as
 * a running sum (no multiply). The XOR fold makes the grouping irrelevant to the result. */
#include "cortiq.h"
#include "hash_common.h"

static uint64_t hash64_ref(const uint8_t *p, size_t n) {
    size_t nw = n / 8, i = 0;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    uint64_t g = 0; /* i * G mod 2^64 */
    const uint64_t G = CQ_H_G;
    for (; i + 4 <= nw; i += 4) {
        const uint8_t *q = p + 8 * i;
        a0 ^= cq_h_fmix(cq_h_load_le(q)) ^ g;
        a1 ^= cq_h_fmix(cq_h_load_le(q + 8)) ^ (g + G);
        a2 ^= cq_h_fmix(cq_h_load_le(q + 16)) ^ (g + 2 * G);
        a3 ^= cq_h_fmix(cq_h_load_le(q + 24)) ^ (g + 3 * G);
        g += 4 * G;
    }
    return cq_h_finish(p, n, i, a0 ^ a1 ^ a2 ^ a3);
}

const cq_hash_ops cq_hash_ref = {hash64_ref};
