/* Splitting a loop's range over threads, from whichever thread calls.
 *
 * libgomp wakes its team fast only for the process's initial thread. Called from any other thread, as
 * a service's step batcher calls the kernels, each OpenMP region cost about 40 µs more (measured on a
 * Zen 5: a 1.5B target step 41 ms instead of 32). So the initial thread uses OpenMP, which torch's own
 * ops share, and any other thread this small pool: its workers spin (yielding) for a while after a job,
 * so the next kernel call of a forward pass, tens of µs later, finds them awake; then they sleep. (The
 * pool on the initial thread instead was 7x slower: its workers and libgomp's spinning ones fought over
 * two cores.) Either way each part is a contiguous range, and the results do not depend on the split.
 *
 * One pool job at a time: a caller that finds the pool busy (another thread's kernel) runs alone.
 */
#ifndef SPECDEC_WORKERS_H
#define SPECDEC_WORKERS_H

#include <stdint.h>

typedef void (*range_fn)(void *ctx, int64_t begin, int64_t end);

/* fn(ctx, begin, end) over [0, n) in `threads` contiguous parts; the calling thread takes parts too. One
 * pool per library: every translation unit of it shares this one. */
__attribute__((visibility("hidden"))) void parallel_for(int threads, int64_t n, range_fn fn, void *ctx);

#endif
