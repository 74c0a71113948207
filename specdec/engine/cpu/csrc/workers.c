/* The worker pool behind parallel_for (workers.h says why it exists). */
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <omp.h>
#include <unistd.h>
#include <stdatomic.h>
#include <time.h>

#include "workers.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

enum { MAX_WORKERS = 63 };
#define SPIN_S 0.0001 /* a worker idle this long sleeps until the next job */

static inline double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static struct {
    pthread_mutex_t busy, lock;
    pthread_cond_t wake;
    pthread_t threads[MAX_WORKERS];
    int started;                 /* workers running */
    unsigned born;               /* the generation when the workers were started */
    atomic_uint generation;      /* bumped once per job, to wake the workers */
    atomic_int sleeping;         /* workers waiting on `wake` */
    /* Parts are claimed, by the caller and by whichever workers are awake: job (24 bits) | parts (8) |
     * next part (32). A claim carries its own part count, so a late worker's claim on a finished job is
     * seen to be past its end, and the caller never waits for a worker that is not running. */
    _Atomic uint64_t claim;
    atomic_int unfinished;       /* parts of the job not finished */
    range_fn fn;
    void *ctx;
    int64_t n;
} pool = {.busy = PTHREAD_MUTEX_INITIALIZER, .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

/* Run parts of the current job until none is left to claim. */
static void claim_parts(void) {
    for (;;) {
        const uint64_t claim = atomic_fetch_add_explicit(&pool.claim, 1, memory_order_acq_rel);
        const int64_t parts = (claim >> 32) & 0xff, part = (uint32_t)claim;
        if (part >= parts) return;
        const int64_t begin = pool.n * part / parts, end = pool.n * (part + 1) / parts;
        if (begin < end) pool.fn(pool.ctx, begin, end);
        atomic_fetch_sub_explicit(&pool.unfinished, 1, memory_order_release);
    }
}

/* A child forked after workers started has none of them: it starts its own. */
static void forget_workers(void) {
    pthread_mutex_init(&pool.busy, 0);
    pthread_mutex_init(&pool.lock, 0);
    pthread_cond_init(&pool.wake, 0);
    pool.started = 0;
    atomic_store(&pool.sleeping, 0);
}

static void *worker_main(void *arg) {
    (void)arg;
    unsigned seen = pool.born; /* the generation before its first job, whenever it gets to run */
    for (;;) {
        const double idle_since = now_s();
        for (int spins = 1; atomic_load_explicit(&pool.generation, memory_order_acquire) == seen; spins++) {
            if (spins % 256 || now_s() - idle_since < SPIN_S) { /* a runnable thread of ours gets the core */
                sched_yield();
                continue;
            }
            pthread_mutex_lock(&pool.lock);
            atomic_fetch_add(&pool.sleeping, 1);
            while (atomic_load(&pool.generation) == seen) pthread_cond_wait(&pool.wake, &pool.lock);
            atomic_fetch_sub(&pool.sleeping, 1);
            pthread_mutex_unlock(&pool.lock);
        }
        seen = atomic_load(&pool.generation);
        claim_parts();
    }
    return 0;
}

static void register_fork_handler(void) { pthread_atfork(0, 0, forget_workers); }

void parallel_for(int threads, int64_t n, range_fn fn, void *ctx) {
    threads = threads < 1 ? 1 : threads > MAX_WORKERS + 1 ? MAX_WORKERS + 1 : threads;
    if (threads > 1 && syscall(SYS_gettid) == getpid()) { /* the initial thread: libgomp's team */
#pragma omp parallel num_threads(threads)
        {
            const int64_t parts = omp_get_num_threads(), part = omp_get_thread_num();
            if (n * part / parts < n * (part + 1) / parts) fn(ctx, n * part / parts, n * (part + 1) / parts);
        }
        return;
    }
    if (threads == 1 || n < 2 || pthread_mutex_trylock(&pool.busy) != 0) {
        fn(ctx, 0, n);
        return;
    }
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    static uint64_t job;
    pthread_once(&once, register_fork_handler);
    pool.born = atomic_load(&pool.generation); /* no job runs while workers are started */
    while (pool.started < threads - 1) {
        if (pthread_create(&pool.threads[pool.started], 0, worker_main, 0) != 0) break;
        pool.started++;
    }
    const uint64_t parts = pool.started + 1 < threads ? pool.started + 1 : threads;
    pool.fn = fn, pool.ctx = ctx, pool.n = n;
    atomic_store(&pool.unfinished, (int)parts);
    job = (job + 1) & 0xffffff;
    atomic_store_explicit(&pool.claim, job << 40 | parts << 32, memory_order_release);
    pthread_mutex_lock(&pool.lock);
    atomic_fetch_add_explicit(&pool.generation, 1, memory_order_release);
    if (atomic_load(&pool.sleeping)) pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    claim_parts();
    for (int spins = 1; atomic_load_explicit(&pool.unfinished, memory_order_acquire) > 0; spins++)
        if (spins % 64 == 0) sched_yield(); else CPU_RELAX(); /* a worker is running a part it claimed */
    pthread_mutex_unlock(&pool.busy);
}

