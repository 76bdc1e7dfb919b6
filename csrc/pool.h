/* pool.h -- the process-wide pool of kernel worker threads (pool.c).
 *
 * Every parallel kernel runs through cq_pool_run / cq_pool_for, whatever Python
 * thread calls it: one set of workers for the whole process, so a kernel runs as
 * fast from a worker thread as from the main thread, and idle workers sleep instead
 * of spinning against the callers' cores.
 *
 * Work is split into slots, and slots are claimed at run time: the calling thread
 * always takes part, and a worker that is late (asleep, or descheduled by the OS)
 * finds its slot already taken. A slot's result must therefore depend on the slot
 * number only, never on the thread that runs it; kernels split by slot and claim
 * finer pieces with atomics, so their results are bit-identical for any thread count
 * and any calling thread.
 *
 * A call made from inside a slot, from a pool worker, or while another thread's call
 * holds the workers runs all its slots on the calling thread, in slot order: several
 * Python threads may call kernels at once and never wait for each other. */
#ifndef CQ_POOL_H
#define CQ_POOL_H
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Slot `slot` of `nslots` of one parallel call. */
typedef void (*cq_slot_fn)(void *ctx, size_t slot, size_t nslots);
/* Items [i0, i1) of a parallel loop. */
typedef void (*cq_range_fn)(void *ctx, size_t i0, size_t i1);

/* Largest slot count of one call (a thread count above it is clamped). */
#define CQ_POOL_MAX_SLOTS 1024

/* Threads every parallel kernel uses: the caller plus n - 1 workers, started or
 * stopped at the next parallel call (fewer: the extra workers stop at once when the
 * pool is idle). n is clamped to 1..CQ_POOL_MAX_SLOTS; n < 1 is ignored. */
void cq_set_num_threads(int n);
int cq_get_num_threads(void);

/* fn(ctx, s, nslots) once for every s < nslots; returns when all have finished. */
void cq_pool_run(size_t nslots, cq_slot_fn fn, void *ctx);

/* fn over [0, n) in pieces of `grain` items (the last may be shorter), claimed one
 * at a time by up to cq_get_num_threads() threads; with par == 0, or one thread, or
 * a single piece, one fn(ctx, 0, n) call on the calling thread. */
void cq_pool_for(size_t n, size_t grain, int par, cq_range_fn fn, void *ctx);

/* The next `n` items of a shared cursor (an atomic fetch-and-add): pieces of work
 * inside a slot. */
size_t cq_pool_claim(size_t *cursor, size_t n);

/* Set a shared flag from any slot (an atomic store of 1). */
void cq_pool_flag(int *flag);

/* Stop the workers beyond cq_get_num_threads() - 1 now, unless a call holds them
 * (that call's successor does it). New workers start at the next parallel call. */
void cq_pool_trim(void);

/* The pool's state, for show_config: workers started so far, and how long an idle
 * worker spins before it sleeps. */
int cq_pool_workers(void);
/* Calls that found a worker descheduled, so far (the pool then runs calls on their
 * caller alone for a while: pool.c, STALL_NS). */
unsigned long cq_pool_stalls(void);
int cq_pool_spin_us(void);
/* How long idle workers (and a caller waiting for a late slot) spin before they
 * sleep, in microseconds; 0 = sleep at once. Takes effect from the next wait. */
void cq_pool_set_spin_us(int us);

#ifdef __cplusplus
}
#endif
#endif
