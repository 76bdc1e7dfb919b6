/* pool.c -- the process-wide kernel thread pool (pool.h).
 *
 * One job at a time holds the workers. The job is published as a 64-bit ticket,
 * generation << 32 | slots << 16 | next slot, and every thread that takes part (the
 * caller and each worker) claims slots by compare-and-swap on it. Because the ticket
 * carries its own generation and slot count, a worker that wakes late can never claim
 * a slot of another job. The caller waits until `done` counts every slot, so the job's
 * function and context stay valid for as long as any slot of it runs.
 *
 * Waiting: an idle worker spins on the ticket for spin_us microseconds (kernel calls of
 * one decode step follow each other closely: a sleeping worker would pay a wake-up per
 * call), then sleeps on a condition variable. The same holds for a caller waiting for
 * the last slots of its job. Sleepers are counted, so a caller wakes them only when
 * there are some: a Dekker pair of sequentially consistent operations (the waker
 * publishes, then reads the count; the sleeper counts itself, then re-reads) makes a
 * lost wake-up impossible. */
#include "pool.h"
#include <stdint.h>
#include <stdlib.h>

#if defined(_WIN32)
#define WIN32_LEAN_AND_MEAN
#include <windows.h>
#include <process.h>
#include <intrin.h>
typedef SRWLOCK cq_mutex;
typedef CONDITION_VARIABLE cq_cond;
typedef HANDLE cq_thread;
#define CQ_MUTEX_INIT SRWLOCK_INIT
#define CQ_COND_INIT CONDITION_VARIABLE_INIT
static void mutex_lock(cq_mutex *m) { AcquireSRWLockExclusive(m); }
static void mutex_unlock(cq_mutex *m) { ReleaseSRWLockExclusive(m); }
static void cond_wait(cq_cond *c, cq_mutex *m) { SleepConditionVariableSRW(c, m, INFINITE, 0); }
static void cond_broadcast(cq_cond *c) { WakeAllConditionVariable(c); }
static void cond_signal(cq_cond *c) { WakeConditionVariable(c); }
static uint64_t now_ns(void) {
    static LARGE_INTEGER freq;
    LARGE_INTEGER t;
    if (!freq.QuadPart) QueryPerformanceFrequency(&freq);
    QueryPerformanceCounter(&t);
    return (uint64_t)((double)t.QuadPart * 1e9 / (double)freq.QuadPart);
}
#define cpu_relax() YieldProcessor()
#else
#include <pthread.h>
#include <time.h>
typedef pthread_mutex_t cq_mutex;
typedef pthread_cond_t cq_cond;
typedef pthread_t cq_thread;
#define CQ_MUTEX_INIT PTHREAD_MUTEX_INITIALIZER
#define CQ_COND_INIT PTHREAD_COND_INITIALIZER
static void mutex_lock(cq_mutex *m) { pthread_mutex_lock(m); }
static void mutex_unlock(cq_mutex *m) { pthread_mutex_unlock(m); }
static void cond_wait(cq_cond *c, cq_mutex *m) { pthread_cond_wait(c, m); }
static void cond_broadcast(cq_cond *c) { pthread_cond_broadcast(c); }
static void cond_signal(cq_cond *c) { pthread_cond_signal(c); }
static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__) || defined(__arm__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif
#endif

#if defined(_MSC_VER)
#define CQ_TLS __declspec(thread)
#else
#define CQ_TLS __thread
#endif

/* ---- atomics: GCC/Clang builtins, or MSVC's interlocked functions ---------- */
#if defined(_MSC_VER)
static uint64_t ld64(volatile uint64_t *p) { return (uint64_t)_InterlockedCompareExchange64((volatile __int64 *)p, 0, 0); }
static void st64(volatile uint64_t *p, uint64_t v) { _InterlockedExchange64((volatile __int64 *)p, (__int64)v); }
static int cas64(volatile uint64_t *p, uint64_t want, uint64_t v) {
    return (uint64_t)_InterlockedCompareExchange64((volatile __int64 *)p, (__int64)v, (__int64)want) == want;
}
static long ld_l(volatile long *p) { return _InterlockedCompareExchange(p, 0, 0); }
static void st_l(volatile long *p, long v) { _InterlockedExchange(p, v); }
static long add_l(volatile long *p, long v) { return _InterlockedExchangeAdd(p, v); }
static int cas_l(volatile long *p, long want, long v) { return _InterlockedCompareExchange(p, v, want) == want; }
#ifdef _WIN64
static size_t addsz(size_t *p, size_t v) { return (size_t)_InterlockedExchangeAdd64((volatile __int64 *)p, (__int64)v); }
#else
static size_t addsz(size_t *p, size_t v) { return (size_t)_InterlockedExchangeAdd((volatile long *)p, (long)v); }
#endif
#else
static uint64_t ld64(volatile uint64_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static void st64(volatile uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
static int cas64(volatile uint64_t *p, uint64_t want, uint64_t v) {
    return __atomic_compare_exchange_n(p, &want, v, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
static long ld_l(volatile long *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static void st_l(volatile long *p, long v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
static long add_l(volatile long *p, long v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static int cas_l(volatile long *p, long want, long v) {
    return __atomic_compare_exchange_n(p, &want, v, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
static size_t addsz(size_t *p, size_t v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
#endif

size_t cq_pool_claim(size_t *cursor, size_t n) { return addsz(cursor, n); }
void cq_pool_flag(int *flag) {
#if defined(_MSC_VER)
    _InterlockedExchange((volatile long *)flag, 1);
#else
    __atomic_store_n(flag, 1, __ATOMIC_RELAXED);
#endif
}

/* ---- the pool ------------------------------------------------------------ */
#define T_GEN(t) ((uint32_t)((t) >> 32))
#define T_N(t) ((size_t)(((t) >> 16) & 0xFFFFu))
#define T_NEXT(t) ((size_t)((t) & 0xFFFFu))
#define T_PACK(g, n, s) (((uint64_t)(uint32_t)(g) << 32) | ((uint64_t)(n) << 16) | (uint64_t)(s))

/* Workers run kernels that keep row buffers on the stack: give them what a main
 * thread has on Linux, not macOS's 512 KiB default for secondary threads. */
#define CQ_WORKER_STACK ((size_t)8 << 20)
#define CQ_SPIN_US_DEFAULT 200

/* A caller that, after finishing its own part of a job, waits for the other threads
 * longer than STALL_NS and longer than its own part took has met a worker the OS
 * descheduled: with work claimed in small pieces, the others finish at most one piece
 * after the caller. A virtual machine's vCPUs are descheduled now and then even on an
 * idle host; cores shared with other busy threads stall most calls. So only a burst
 * (STALL_BURST stalls within STALL_WINDOW_NS) sends the pool solo: calls then run on
 * their caller alone for a while, twice as long after each new burst (SOLO_MIN_NS ..
 * SOLO_MAX_NS), and the back-off is forgotten after SOLO_FORGET_NS without a burst.
 * (On a crowded machine the scheduler's slices are below a millisecond, so the
 * threshold is well below a slice.) */
#define STALL_NS 200000u
#define SOLO_MIN_NS 20000000u
#define SOLO_MAX_NS 1280000000u
#define SOLO_FORGET_NS 2000000000u
#define STALL_BURST 4
#define STALL_WINDOW_NS 50000000u

typedef struct {
    cq_thread th;
    volatile long stop;
    uint32_t seen; /* the generation this worker has already served */
} worker;

static struct {
    volatile uint64_t ticket;
    cq_slot_fn fn; /* the job: written by its caller before the ticket is published */
    void *ctx;
    volatile long done;          /* slots of the current job that have finished */
    volatile long busy;          /* a caller holds the workers */
    volatile long sleepers;      /* workers asleep on `wake` */
    volatile long caller_asleep; /* the caller asleep on `idle` */
    volatile long spin_us;
    cq_mutex lock;
    cq_cond wake, idle;
    /* touched only by the caller holding `busy`: */
    int nworkers;
    uint64_t solo_until, solo_ns, last_burst; /* the stall back-off (STALL_NS) */
    uint64_t window;                          /* start of the current burst window */
    unsigned long stalls, in_window;
    worker *w[CQ_POOL_MAX_SLOTS];
} P = {0, NULL, NULL, 0, 0, 0, 0, CQ_SPIN_US_DEFAULT, CQ_MUTEX_INIT, CQ_COND_INIT, CQ_COND_INIT, 0, 0, 0, 0, 0, 0, 0, {0}};

/* This thread runs inside a job (a worker, or a caller while its job runs): a kernel
 * call from here runs serially. */
static CQ_TLS int in_pool;

/* The process-wide thread count, read by every parallel call (run resizes to it). */
static volatile int NTHREADS = 1;

void cq_set_num_threads(int n) {
    if (n <= 0) return;
    NTHREADS = n > CQ_POOL_MAX_SLOTS ? CQ_POOL_MAX_SLOTS : n;
    cq_pool_trim(); /* fewer threads: the extra workers stop now rather than idle */
}

int cq_get_num_threads(void) { return NTHREADS; }

int cq_pool_workers(void) { return P.nworkers; }
unsigned long cq_pool_stalls(void) { return P.stalls; }
int cq_pool_spin_us(void) { return (int)ld_l(&P.spin_us); }
void cq_pool_set_spin_us(int us) { st_l(&P.spin_us, us < 0 ? 0 : us); }

/* Claim and run slots of generation g until none are left. */
static void run_slots(uint32_t g) {
    for (;;) {
        const uint64_t t = ld64(&P.ticket);
        if (T_GEN(t) != g || T_NEXT(t) >= T_N(t)) return;
        if (!cas64(&P.ticket, t, t + 1)) continue;
        const long n = (long)T_N(t);
        P.fn(P.ctx, T_NEXT(t), (size_t)n);
        if (add_l(&P.done, 1) + 1 == n && ld_l(&P.caller_asleep)) {
            mutex_lock(&P.lock);
            cond_signal(&P.idle);
            mutex_unlock(&P.lock);
        }
    }
}

/* Spin until pred(arg) holds or the spin budget is spent; 1 when it holds. */
static int spin_until(int (*pred)(void *), void *arg) {
    const uint64_t budget = (uint64_t)ld_l(&P.spin_us) * 1000u;
    if (pred(arg)) return 1;
    if (!budget) return 0;
    const uint64_t t0 = now_ns();
    for (unsigned i = 1;; i++) {
        cpu_relax();
        if (pred(arg)) return 1;
        if ((i & 63) == 0 && now_ns() - t0 > budget) return 0;
    }
}

static int worker_has_news(void *arg) {
    worker *me = (worker *)arg;
    return T_GEN(ld64(&P.ticket)) != me->seen || ld_l(&me->stop);
}

#if defined(_WIN32)
static unsigned __stdcall worker_main(void *arg)
#else
static void *worker_main(void *arg)
#endif
{
    worker *me = (worker *)arg;
    in_pool = 1;
    for (;;) {
        if (!spin_until(worker_has_news, me)) {
            mutex_lock(&P.lock);
            add_l(&P.sleepers, 1);
            while (T_GEN(ld64(&P.ticket)) == me->seen && !ld_l(&me->stop)) cond_wait(&P.wake, &P.lock);
            add_l(&P.sleepers, -1);
            mutex_unlock(&P.lock);
        }
        if (ld_l(&me->stop)) break;
        me->seen = T_GEN(ld64(&P.ticket));
        run_slots(me->seen);
    }
    return 0;
}

static int all_done(void *arg) { return ld_l(&P.done) == *(long *)arg; }

static void wait_done(long n) {
    if (spin_until(all_done, &n)) return;
    mutex_lock(&P.lock);
    st_l(&P.caller_asleep, 1);
    while (ld_l(&P.done) != n) cond_wait(&P.idle, &P.lock);
    st_l(&P.caller_asleep, 0);
    mutex_unlock(&P.lock);
}

static void wake_workers(void) {
    if (!ld_l(&P.sleepers)) return;
    mutex_lock(&P.lock);
    cond_broadcast(&P.wake);
    mutex_unlock(&P.lock);
}

#if !defined(_WIN32)
/* In a forked child only the forking thread exists: forget the parent's workers
 * (their memory is the child's to leak, not to free) and start from an idle pool;
 * the next parallel call starts new workers. */
static void pool_after_fork(void) {
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    P.lock = m;
    P.wake = c;
    P.idle = c;
    P.nworkers = 0;
    P.sleepers = 0;
    P.caller_asleep = 0;
    P.busy = 0;
    P.ticket = T_PACK(T_GEN(P.ticket) + 1, 0, 0);
    in_pool = 0;
}
#endif

static int start_worker(worker *w) {
#if defined(_WIN32)
    w->th = (HANDLE)_beginthreadex(NULL, (unsigned)CQ_WORKER_STACK, worker_main, w, 0, NULL);
    return w->th != 0;
#else
    pthread_attr_t attr;
    if (pthread_attr_init(&attr)) return 0;
    pthread_attr_setstacksize(&attr, CQ_WORKER_STACK);
    int ok = pthread_create(&w->th, &attr, worker_main, w) == 0;
    pthread_attr_destroy(&attr);
    return ok;
#endif
}

static void join_worker(worker *w) {
#if defined(_WIN32)
    WaitForSingleObject(w->th, INFINITE);
    CloseHandle(w->th);
#else
    pthread_join(w->th, NULL);
#endif
}

/* With `busy` held: exactly `want` workers (fewer if the OS refuses threads). */
static void resize(int want) {
    if (want > CQ_POOL_MAX_SLOTS - 1) want = CQ_POOL_MAX_SLOTS - 1;
    while (P.nworkers > want) {
        worker *w = P.w[--P.nworkers];
        st_l(&w->stop, 1);
        mutex_lock(&P.lock);
        cond_broadcast(&P.wake);
        mutex_unlock(&P.lock);
        join_worker(w);
        free(w);
    }
#if !defined(_WIN32)
    static int atfork_done;
    if (P.nworkers < want && !atfork_done) atfork_done = pthread_atfork(NULL, NULL, pool_after_fork) == 0;
#endif
    while (P.nworkers < want) {
        worker *w = (worker *)calloc(1, sizeof(worker));
        if (!w) break;
        w->seen = T_GEN(ld64(&P.ticket));
        if (!start_worker(w)) {
            free(w);
            break;
        }
        P.w[P.nworkers++] = w;
    }
}

void cq_pool_trim(void) {
    if (in_pool || !cas_l(&P.busy, 0, 1)) return; /* a running call trims at its start */
    if (P.nworkers > cq_get_num_threads() - 1) resize(cq_get_num_threads() - 1);
    st_l(&P.busy, 0);
}

static void run_inline(size_t nslots, cq_slot_fn fn, void *ctx) {
    const int was = in_pool;
    in_pool = 1;
    for (size_t s = 0; s < nslots; s++) fn(ctx, s, nslots);
    in_pool = was;
}

/* With `busy` held, after a job: the caller worked `own` ns, then waited `wait` ns for
 * the other threads. */
static void note_wait(uint64_t end, uint64_t own, uint64_t wait) {
    if (wait > STALL_NS && wait > own) {
        P.stalls++;
        if (end - P.window > STALL_WINDOW_NS) {
            P.window = end;
            P.in_window = 0;
        }
        if (++P.in_window >= STALL_BURST) { /* a burst: the cores are shared */
            P.in_window = 0;
            P.solo_ns = P.solo_ns ? (P.solo_ns * 2 < SOLO_MAX_NS ? P.solo_ns * 2 : SOLO_MAX_NS) : SOLO_MIN_NS;
            P.solo_until = end + P.solo_ns;
            P.last_burst = end;
        }
    } else if (P.solo_ns && end - P.last_burst > SOLO_FORGET_NS + P.solo_ns) {
        P.solo_ns = 0;
    }
}

void cq_pool_run(size_t nslots, cq_slot_fn fn, void *ctx) {
    if (nslots == 0) return;
    if (nslots > CQ_POOL_MAX_SLOTS) nslots = CQ_POOL_MAX_SLOTS;
    if (nslots == 1 || in_pool || !cas_l(&P.busy, 0, 1)) {
        run_inline(nslots, fn, ctx);
        return;
    }
    resize(cq_get_num_threads() - 1);
    if (P.nworkers == 0 || (P.solo_until && now_ns() < P.solo_until)) {
        st_l(&P.busy, 0);
        run_inline(nslots, fn, ctx);
        return;
    }
    in_pool = 1;
    P.fn = fn;
    P.ctx = ctx;
    st_l(&P.done, 0);
    const uint32_t g = T_GEN(ld64(&P.ticket)) + 1;
    const uint64_t start = now_ns();
    st64(&P.ticket, T_PACK(g, nslots, 0));
    wake_workers();
    run_slots(g);
    const uint64_t own = now_ns();
    wait_done((long)nslots);
    const uint64_t end = now_ns();
    note_wait(end, own - start, end - own);
    in_pool = 0;
    st_l(&P.busy, 0);
}

typedef struct {
    cq_range_fn fn;
    void *ctx;
    size_t n, grain, next;
} pool_for_job;

static void pool_for_slot(void *arg, size_t slot, size_t nslots) {
    pool_for_job *j = (pool_for_job *)arg;
    (void)slot;
    (void)nslots;
    for (;;) {
        const size_t i0 = cq_pool_claim(&j->next, j->grain);
        if (i0 >= j->n) return;
        j->fn(j->ctx, i0, j->n - i0 < j->grain ? j->n : i0 + j->grain);
    }
}

void cq_pool_for(size_t n, size_t grain, int par, cq_range_fn fn, void *ctx) {
    if (n == 0) return;
    if (grain == 0) grain = 1;
    const size_t pieces = (n + grain - 1) / grain, threads = (size_t)cq_get_num_threads();
    if (!par || threads <= 1 || pieces <= 1) {
        fn(ctx, 0, n);
        return;
    }
    pool_for_job j = {fn, ctx, n, grain, 0};
    cq_pool_run(pieces < threads ? pieces : threads, pool_for_slot, &j);
}
