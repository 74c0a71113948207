/* y[S, N] = x[S, K] · W[N, K]ᵀ with W in a GGML block format and x quantized to 8 bits per row: the
 * "gguf-q8" compute path. Integer dot products, like llama.cpp's, with a definition of our own.
 *
 * Definition (specdec/engine/cpu/q8dot.py states it in one sentence; tests/test_q8dot.py transcribes it):
 * - Activations: each row in blocks of 32 values; dx = amax / 127, u = round-half-even(x · (127 / amax))
 *   clamped to ±127 (all zero where amax is 0).
 * - Weights: integers q. Per block j of 32 weights the integer sum I is exact: Σ q·u for Q4_K, Q5_K, Q4_1, Q5_1
 *   and Q8_0, and for IQ4_NL and IQ4_XS with q the table value of each index, Σ (q − 16)·u for Q5_0,
 *   Σ (q − 8)·u for Q4_0, and for Q6_K sc₁·Σ₁ (q − 32)·u + sc₂·Σ₂ (q − 32)·u over its two 16-weight halves with
 *   their int8 scales (Q3_K the same with q − 4, its scales less 32; Q2_K with q and its 4-bit scales), and for
 *   Q2_K also M = m₁·Σ₁u + m₂·Σ₂u with its halves' 4-bit mins. The block's float scale s is d·sc for Q4_K and
 *   Q5_K, d·(ls − 32) for IQ4_XS, d for the others (exact in float32), and Q4_K's and Q5_K's min m = dmin·min,
 *   Q4_1's and Q5_1's m, Q2_K's dmin.
 * - Float steps, each rounded to float32, no fused multiply-add: t = (s·dx)·I, minus m·(dx·Σu) for Q4_K and Q5_K,
 *   plus m·(dx·Σu) for Q4_1 and Q5_1, minus m·(dx·M) for Q2_K;
 *   block j feeds accumulator j mod 16 in order (acc += t); y = the 16 accumulators summed by halves
 *   ((a[i] + a[i + 8]), then + 4, + 2, + 1).
 * Every output is that fixed sequence whatever the rows beside it: the path is row-invariant.
 *
 * Layout: q8unit.h. The parts: q8level.h (per level), q8weights.h (unpacking, float steps), q8grouped.h (a unit
 * against several rows), then here the passes over a matrix. Each weight unit is unpacked once per pass and
 * dotted with every row in it; a unit's BLOCKS terms are one vector of float steps a row.
 *
 * Built per level by specdec/engine/cpu/native.py: VNNI (vpdpbusd on 512 or 256 bits), AVX-512BW without
 * VNNI, AVX2 and SSE4.1 (vpmaddubsw on 512, 256 or 128 bits: u8·s8 pairs summed in int16, which never
 * saturates here: |q|·|u| ≤ 128·127, and the pair sums of up to 8 chunks added in int16 before widening, as
 * the largest code of each format allows), portable C. Integer sums are exact, so every build gives the same bits.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_blocks.h"
#include "kernels.h"
#include "q8unit.h"
#include "vectors.h"
#include "workers.h"

/* the kernel's parts, in this order: its level's vectors, its weight units, units against groups of rows */
#include "q8level.h"
#include "q8weights.h"
#include "q8grouped.h"

const char *q8_level(void) { return LEVEL_NAME; }
int64_t q8_unit_weights(void) { return UNIT; }

/* ---- the build's integer dot product at its best: the compute floor's peak ---- */
enum { PEAK_ROWS = 8 };

typedef struct {
    int64_t rounds;
    int32_t sink[64]; /* each part's total, so that nothing is optimised away */
} peak_job;

static void peak_part(void *ctx, int64_t begin, int64_t end) {
    peak_job *j = ctx;
    uint8_t bytes[UNIT] __attribute__((aligned(64)));
    int8_t u[PEAK_ROWS][UNIT] __attribute__((aligned(64)));
    memset(bytes, 1, sizeof bytes);
    memset(u, 1, sizeof u);
    nv w[NVS];
    load_weights(w, bytes);
    for (int64_t part = begin; part < end; part++) {
        vli total = {0};
        for (int64_t r = 0; r < j->rounds; r++) {
            __asm__ volatile("" : : "r"(u) : "memory"); /* the activations are read again each round, as in a pass */
            for (int g = 0; g < PEAK_ROWS; g++) total += unit_dot(w, 0, u[g], 8, 0);
        }
        int32_t sum = 0;
        for (int l = 0; l < BLOCKS; l++) sum += total[l];
        j->sink[part % 64] = sum;
    }
}

/* Multiply-adds done by `threads` threads at once, each dotting PEAK_ROWS cached activation rows with one
 * register-resident Q4_K-like weight unit `rounds` times: the kernel's integer step with nothing else (no
 * weight reads, no float steps). The caller times the call. */
int64_t q8_dot_peak(int threads, int64_t rounds) {
    peak_job j = {rounds, {0}};
    parallel_for(threads, threads, peak_part, &j);
    return (int64_t)threads * rounds * PEAK_ROWS * UNIT;
}

/* ---- the matmul ---- */

/* Activations beyond CHUNK_FROM_BYTES go in chunks of CHUNK_BYTES, which stay in the L1 cache while a block of
 * columns (COLUMN_BLOCK) passes over them, the weights streaming through the rest of it (measured on a Zen 5:
 * the down projection's 35 super-blocks, 5 rows, 1.9x faster on cached weights). A chunk reads a short stretch
 * of each weight row, which the hardware prefetcher finds late: row_pass prefetches the next row's stretch
 * (from memory, Q6_K down projections of 4-9 rows 1.3-1.7x faster). So a pass chunks only from 64 KiB of
 * activations (4 rows of the 1.5B target's down projection; they stay in L2): with every prefetch into every
 * cache level, whole rows beat chunks there, from memory, the target's down projections at 3-4 rows 0.78-0.96x
 * the time on a Zen 4 (0.56-0.69x at AVX2) and 0.68-0.83x on an Emerald Rapids; from 5 rows the two are level
 * and Q4_K's chunks the faster (32 KiB was tuned on a Zen 5 with prefetches into no cache level, where it made
 * 3 rows 1.5x faster than 48). A chunk is a whole number of accumulator groups (UNITS_PER_ACC units). With
 * AVX-512 the passes that would go in chunks go over two weight rows at once, on whole rows (`paired`; on a
 * Zen 4 the down projections at 5 rows 0.65-0.68x the time of chunks), but Q8_0's without VNNI, and with VNNI
 * its passes of more than PAIR_ROWS rows.
 * With AVX2 and AVX-VNNI, whose units go chunk by chunk (UNIT_BY_CHUNK), only from 128 KiB: on the Zen 4 capped
 * at AVX2, the down projections at 5-9 rows then took 0.75-0.84x the time of chunks, passes of 5-9 tokens
 * 0.87-0.95x; from 256 KiB, level at 5-9 and 0.89-0.93x at 12-16 rows, but past the L2 of some AVX2 CPUs (256
 * KiB). On a Granite Rapids capped at AVX-VNNI, chunks from 64 KiB took the down projections at 5-6 rows 1.08-1.11x
 * the time. */
enum { CHUNK_FROM_BYTES = UNIT_BY_CHUNK ? 131072 : 65536, CHUNK_BYTES = 24576 };

/* A pass over whole weight rows (not in chunks) prefetches the weights 16 super-blocks ahead, on into the next
 * rows, which follow in memory: the hardware prefetcher falls behind (measured on a Zen 4 with the rows' work
 * between two units: the 1.5B target's S = 2 about 49 -> 42 ms, S = 9 118 -> 98 ms, then 8 ahead into no
 * cache level; on an Emerald Rapids at one row too, from memory, both builds, every target and draft shape,
 * 8 ahead: 0.76-0.85x the time of no prefetch, then 16 ahead 0.82-0.91x of 8; 32 and 64 within the noise).
 * Every prefetch here goes into every cache level (`prefetcht0`): into none (`prefetchnta`) the Emerald
 * Rapids was up to 1.5x slower on the draft's Q8_0 output layer at one row, up to 1.2x at 2 rows, and up to
 * 2.3x on the chunked down projections (docs/PERFORMANCE.md). A prefetch never faults, past the array's end
 * included. */
enum { PREFETCH_SUPERBLOCKS = 16 };

/* Accumulators between chunks: this thread's buffer, grown when needed and kept (no allocation a call). */
static vacc *keep_buffer(int64_t count) {
    static __thread vacc *buffer;
    static __thread int64_t capacity;
    if (count > capacity) {
        free(buffer);
        buffer = aligned_alloc(64, count * sizeof(vacc));
        capacity = buffer ? count : 0;
    }
    return buffer;
}

/* A whole-row pass's prefetch at unit i of a row: a unit's bytes, PREFETCH_SUPERBLOCKS super-blocks on. */
static inline __attribute__((always_inline)) void prefetch_ahead(const int type, const uint8_t *row, int64_t i) {
    prefetch_bytes(row + i * unit_bytes(type) + PREFETCH_SUPERBLOCKS * sb_bytes(type), unit_bytes(type));
}

/* Unit i of a row, after prefetching ahead when the pass goes over whole rows. */
static inline __attribute__((always_inline)) void unit_at(const int type, const uint8_t *row, int64_t i, int whole,
                                                          const act_unit *a, int64_t nu, vacc *acc, int G, int part) {
    if (whole) prefetch_ahead(type, row, i);
#if UNIT_BY_CHUNK
    if (unit_goes_by_chunk(type, G)) {
        /* the accumulators in memory between units: 2 registers a row, they left too few for the rows' sums */
        __asm__("" : "+m"(*(vacc(*)[MAX_ROWS])acc));
        unit_group_by_chunk(type, row + i * unit_bytes(type), a + i, nu, acc, G, part);
        return;
    }
#endif
    unit(type, row + i * unit_bytes(type), a + i, nu, acc, G, part, 0);
}

#if CHUNK == 64
/* The half unit at o (a row's last, see q8unit.h) against G rows: out of line, being one a row. */
static __attribute__((noinline)) void half_unit(int type, const uint8_t *o, const act_unit *a, int64_t lda,
                                                 vacc *acc, int G) {
#define HALF_UNIT_CASE(T) case T: unit(T, o, a, lda, acc, G, 0, 1); break;
    switch (type) {
        QUANT_FORMATS(HALF_UNIT_CASE)
    default: break; /* q8_matmul takes no other */
    }
}
#endif

/* The half unit at o, a row's last, into acc: through a copy, so that acc's address never escapes (it stays in
 * registers). */
static inline __attribute__((always_inline)) void last_unit(int type, const uint8_t *o, const act_unit *a,
                                                            int64_t lda, vacc *acc, int G) {
#if CHUNK == 64
    vacc last[MAX_ROWS];
    for (int g = 0; g < G; g++) last[g] = acc[g];
    half_unit(type, o, a, lda, last, G);
    for (int g = 0; g < G; g++) acc[g] = last[g];
#else
    (void)type, (void)o, (void)a, (void)lda, (void)acc, (void)G; /* no half units */
#endif
}

/* y[g * ldy] = row g's 16 accumulators summed (+ *bias). */
static inline __attribute__((always_inline)) void store_rows(const vacc *acc, int G, float *y, int64_t ldy,
                                                             const float *bias) {
    for (int g = 0; g < G; g++) {
        const float sum = acc_lanes_sum(acc[g]);
        y[g * ldy] = bias ? sum + *bias : sum;
    }
}

/* One weight row (row_bytes long, ending in a half unit if `tail`) and its units [i0, i1) against G
 * activation rows (i0 a multiple of UNITS_PER_ACC). The first chunk (i0 = 0) starts the 16 accumulators at
 * zero, a later one from `keep`; the last (i1 = nu) writes y, an earlier one leaves the accumulators in
 * `keep`. Chunking changes no term's order. */
static inline __attribute__((always_inline)) void row_pass(const int type, const uint8_t *row, int64_t row_bytes,
                                                           int tail, int64_t i0, int64_t i1, int64_t nu,
                                                           const act_unit *a, vacc *keep, float *y, int64_t ldy,
                                                           const float *bias, int G) {
    vacc acc[MAX_ROWS];
    for (int g = 0; g < G; g++) acc[g] = i0 == 0 ? acc_of(splat(0.0f)) : keep[g];
    const int whole = i1 - i0 == nu;
    if (!whole) { /* a chunk: the next row's part is a short stream the hardware would find late */
        prefetch_bytes(row + row_bytes + i0 * unit_bytes(type), (i1 - i0) * unit_bytes(type));
    }
    const int64_t end = tail && i1 == nu ? nu - 1 : i1; /* the full units */
    for (int64_t i = i0; i < end; i += UNITS_PER_ACC) { /* block j's terms to accumulator j mod 16 */
        unit_at(type, row, i, whole, a, nu, acc, G, 0);
        if (UNITS_PER_ACC == 2 && i + 1 < end) unit_at(type, row, i + 1, whole, a, nu, acc, G, 1);
    }
    if (end < i1) last_unit(type, row + end * unit_bytes(type), a + end, nu, acc, G);
    if (i1 < nu) {
        for (int g = 0; g < G; g++) keep[g] = acc[g];
        return;
    }
    store_rows(acc, G, y, ldy, bias);
}

#if ROW_PAIRS
/* Unit i of two weight rows (at row and row + other) against G activation rows into acc0 and acc1's `part`,
 * after prefetching both rows ahead; chunk by chunk if `by_chunk`. */
static inline __attribute__((always_inline)) void pair_unit_at(const int type, const uint8_t *row, int64_t other,
                                                               int64_t i, const act_unit *a, int64_t nu, vacc *acc0,
                                                               vacc *acc1, int G, const int by_chunk, int part) {
    const int64_t bytes = unit_bytes(type);
    prefetch_ahead(type, row, i);
    prefetch_ahead(type, row + other, i);
    (void)by_chunk; /* whole units only with AVX-512 without VNNI */
#if !defined(PAIRS) || CHUNK == 32
    if (by_chunk) {
        /* where the registers run out (`pair_acc_in_registers`: AVX-512's Q6_K from 6 rows, 256 bits from 2 rows),
         * the accumulators stay in memory between units */
        if (!pair_acc_in_registers(type, G)) __asm__("" : "+m"(*(vacc(*)[PAIR_ROWS])acc0),
                                                       "+m"(*(vacc(*)[PAIR_ROWS])acc1));
        unit_pair_by_chunk(type, row + i * bytes, other, a + i, nu, acc0, acc1, G, part);
        return;
    }
#endif
#if CHUNK == 64 /* AVX-VNNI's and AVX2's pairs go chunk by chunk only */
    unit_pair(type, row + i * bytes, other, a + i, nu, acc0, acc1, G);
#endif
}

/* Two whole weight rows, at row and row + other (`far` rows on), each ending in a half unit if `tail`,
 * against G activation rows (2 ≤ G ≤ PAIR_ROWS, or 1 where the process takes one-row pairs): y[g * ldy] and
 * y[g * ldy + far], each unit chunk by chunk if `by_chunk` (`pair_by_chunk`). Each row's stream is prefetched as
 * row_pass prefetches a whole row's; unit i's terms go where row_pass puts them (part i mod UNITS_PER_ACC). */
static inline __attribute__((always_inline)) void row_pair_pass(const int type, const uint8_t *row, int64_t other,
                                                                int64_t far, int tail, int64_t nu, const act_unit *a,
                                                                float *y, int64_t ldy, const float *bias, int G,
                                                                const int by_chunk) {
    vacc acc0[PAIR_ROWS], acc1[PAIR_ROWS];
    for (int g = 0; g < G; g++) acc0[g] = acc1[g] = acc_of(splat(0.0f));
    const int64_t end = tail ? nu - 1 : nu;
    for (int64_t i = 0; i < end; i += UNITS_PER_ACC) {
        pair_unit_at(type, row, other, i, a, nu, acc0, acc1, G, by_chunk, 0);
        if (UNITS_PER_ACC == 2 && i + 1 < end) pair_unit_at(type, row, other, i + 1, a, nu, acc0, acc1, G, by_chunk, 1);
    }
    if (tail) {
        const int64_t bytes = unit_bytes(type);
        last_unit(type, row + end * bytes, a + end, nu, acc0, G);
        last_unit(type, row + other + end * bytes, a + end, nu, acc1, G);
    }
    store_rows(acc0, G, y, ldy, bias);
    store_rows(acc1, G, y + far, ldy, bias ? bias + far : 0);
}

/* Whether a pair's units against G rows of nu units go chunk by chunk (above). */
static inline int pair_by_chunk(int G, int64_t nu) {
#if defined(PAIRS) || CHUNK == 32
    (void)G, (void)nu;
    return CHUNK == 32;
#else
    return G > UNIT_PAIR_ROWS || (G >= PAIR_BY_CHUNK_FROM && G * nu * (int64_t)sizeof(act_unit) <= PAIR_BY_CHUNK_L1);
#endif
}

#define PAIR_PASS_AS(T, G, BY_CHUNK) \
    row_pair_pass(T, j->w + n * j->row_bytes, far * j->row_bytes, far, j->tail, j->nu, j->a + g0 * j->nu, \
                  j->out + g0 * j->ldy + n, j->ldy, j->bias ? j->bias + n : 0, G, BY_CHUNK)
/* The row counts of a pair pass in this build (PAIR_ROWS of them), as X(T, G) each. */
#if CHUNK == 32 /* AVX-VNNI and AVX2: PAIR_ROWS 5 */
#define PAIR_COUNTS(X, T) X(T, 1) X(T, 2) X(T, 3) X(T, 4) X(T, 5)
#elif !defined(PAIRS) /* AVX-512 VNNI: PAIR_ROWS 7 */
#define PAIR_COUNTS(X, T) X(T, 1) X(T, 2) X(T, 3) X(T, 4) X(T, 5) X(T, 6) X(T, 7)
#else /* AVX-512 without VNNI: PAIR_ROWS 4 */
#define PAIR_COUNTS(X, T) X(T, 1) X(T, 2) X(T, 3) X(T, 4)
#endif

/* Each format's pair pass of G rows over columns [n0, n1) (and their partners `far` on), activation rows from g0,
 * out of line as `ROW_BLOCK`s are (below). */
#define PAIR_BLOCK(T, G) \
    static __attribute__((noinline)) void pair_block_##T##_##G(const struct job *j, int64_t n0, int64_t n1, \
                                                              int64_t far, int g0) { \
        if (pair_by_chunk(G, j->nu)) \
            for (int64_t n = n0; n < n1; n++) PAIR_PASS_AS(T, G, 1); \
        else \
            for (int64_t n = n0; n < n1; n++) PAIR_PASS_AS(T, G, 0); \
    }
#define PAIR_BLOCKS(T) PAIR_COUNTS(PAIR_BLOCK, T)
#define PAIR_PASS(T, G) case G: pair_block_##T##_##G(j, n0, n1, far, g0); break;
#define PAIR_PASSES(T) switch (g) { PAIR_COUNTS(PAIR_PASS, T) }
#endif

/* Each format's pass of G rows over a block of columns, out of line: one function per (format, G), so that each
 * loop gets the registers to itself. Inlined all into `columns` (12 formats, 16 row counts), GCC allocated
 * registers across the whole switch: AVX2's loops of 8 rows of Q4_K, Q4_0 and Q4_1 kept their nibble mask, their
 * vpmaddwd ones and their row addresses on the stack, 257-279 instructions a unit where Q4_K's alone takes 218 (in
 * all the AVX2 build's hot loops 20% fewer stack references now, the AVX-512 VNNI build's 32%). On the Zen 3
 * (AVX2, `specdec bench --kernel-ab`, both threads, three runs, the pairs below out of line too): passes of 5 / 8
 * tokens 0.88-0.92 / 0.77-0.80x the time, 1-4 and 9 tokens 0.92-1.03x (the same bits); the AVX2 build compiles in
 * one minute where it took four. */
#define ROW_BLOCK(T, G) \
    static __attribute__((noinline)) void row_block_##T##_##G(const struct job *j, int64_t b0, int64_t b1, int64_t i0, \
                                                             int64_t i1, vacc *keep) { \
        for (int64_t n = b0; n < b1; n++) \
            row_pass(T, j->w + n * j->row_bytes, j->row_bytes, j->tail, i0, i1, j->nu, j->a, \
                     keep ? keep + (n - b0) * G : 0, j->out + n, j->ldy, j->bias ? j->bias + n : 0, G); \
    }
/* The row counts of a pass, 1 to MAX_ROWS, as X(T, G) each. */
#define ROW_COUNTS(X, T) \
    X(T, 1) X(T, 2) X(T, 3) X(T, 4) X(T, 5) X(T, 6) X(T, 7) X(T, 8) \
    X(T, 9) X(T, 10) X(T, 11) X(T, 12) X(T, 13) X(T, 14) X(T, 15) X(T, 16)
#define ROW_BLOCKS(T) ROW_COUNTS(ROW_BLOCK, T)
#define PASS(T, G) case G: row_block_##T##_##G(j, b0, b1, i0, i1, keep); break;
#define PASSES(T) switch (G) { ROW_COUNTS(PASS, T) }

/* Whether a one-row pass goes over two weight rows at once too (`q8_set_one_row_pairs`). The same bits either way;
 * the speed is the CPU's: on a Granite Rapids one-token passes of the 1.5B target took 0.77x the time (two memory
 * streams a thread; capped at AVX-VNNI 0.69x, at AVX2 0.82x, chunk by chunk there), on a Zen 4 1.0-1.08x, so the
 * process measures it on its model (specdec/engine/cpu/q8dot.py). In the 256-bit builds the setting pairs passes
 * of a few rows too (q8grouped.h): what makes one row pay there, one weight stream a thread, holds them back. */
static int one_row_pairs;

/* Sets whether one-row passes go in pairs; returns the setting now (always 0 where the build has no pairs). */
int q8_set_one_row_pairs(int on) {
#if ROW_PAIRS
    one_row_pairs = on != 0;
#else
    (void)on;
#endif
    return one_row_pairs;
}

/* Whether a pass of G rows of this format, in chunks of `chunk` of its nu units, goes over two weight rows at
 * once (then over whole rows). With AVX-512, Q8_0's passes that would go in chunks pair only in one group: a
 * Q8_0 unit is cheap to unpack and twice Q4_K's bytes, and read whole against more rows from the L2 (the 1.5B
 * target in Q8_0 on the Granite Rapids: its down projections at 8 / 9 / 12 rows took 0.72 / 0.76 / 0.88x the
 * time in chunks; at 5-7 level, at 16 1.06x). */
static inline int paired(int type, int G, int64_t chunk, int64_t nu) {
#if CHUNK == 64
    if (sign_on_activations(type) || (type == Q8_0 && chunk < nu && G > PAIR_ROWS)) return 0;
    return G >= 2 - one_row_pairs && (G <= PAIR_MAX_ROWS || chunk < nu);
#elif ROW_PAIRS
    (void)chunk;
    return one_row_pairs && G <= pair_max_rows(type, G * nu * (int64_t)sizeof(act_unit)); /* signed too */
#else
    (void)type, (void)G, (void)chunk, (void)nu;
    return 0;
#endif
}

/* G rows against columns of W, the units in chunks of `chunk`: what the workers split by columns. */
typedef struct job {
    int type, G, tail, pairs; /* tail: rows end in a half unit; pairs: two weight rows at once (whole rows) */
    const uint8_t *w;
    int64_t row_bytes, chunk, nu, ldy;
    const act_unit *a;
    float *out;
    const float *bias;
    int out_of_memory; /* set by a worker that found no memory for its accumulators: q8_matmul returns -2 */
} job;

QUANT_FORMATS(ROW_BLOCKS)
#if ROW_PAIRS
UNSIGNED_CODE_FORMATS(PAIR_BLOCKS)
#if SIGNED_PAIRS
SIGNED_CODE_FORMATS(PAIR_BLOCKS)
#endif
#endif

/* Columns a worker takes through every chunk before the next ones: their accumulators between chunks stay
 * in this thread's cache (COLUMN_BLOCK · G vectors), where one pass per chunk over all N columns kept N · G
 * of them in memory (at 13-16 rows a 1536-wide Q4_K matrix of 107,520 columns ran 2x slower than unchunked). */
enum { COLUMN_BLOCK = 16 };

#if ROW_PAIRS
/* Columns n and n + far for n in [begin, begin + far), two at once (`paired`), in groups of at most PAIR_ROWS
 * activation rows. Out of line: inlined in `columns`, the same code ran the 1.5B target's passes of 2-4
 * tokens 1.02-1.07x slower (three runs of `specdec bench --kernel-ab`; out of line 1.00-1.01x, as before groups). */
#define PAIR_CASE(T) case T: PAIR_PASSES(T); break;
enum { PAIR_BLOCK_BYTES = 16384 };
static __attribute__((noinline)) void pair_columns(const job *j, int64_t begin, int64_t far) {
    const int G = j->G, groups = (G + pair_group_rows(j->type) - 1) / pair_group_rows(j->type);
    /* one group: all the columns in one call; more: each block of columns' groups in turn, a block's weights at
     * most PAIR_BLOCK_BYTES, so that the later groups' come from the L1 */
    const int64_t block = 2 * j->row_bytes < PAIR_BLOCK_BYTES ? PAIR_BLOCK_BYTES / (2 * j->row_bytes) : 1;
    const int64_t step = groups == 1 ? far : block;
    for (int64_t n0 = begin; n0 < begin + far; n0 += step) {
        const int64_t n1 = n0 + step < begin + far ? n0 + step : begin + far;
        for (int k = 0, g0 = 0; k < groups; k++) {
            const int g = (G - g0) / (groups - k);
            switch (j->type) {
                UNSIGNED_CODE_FORMATS(PAIR_CASE)
#if SIGNED_PAIRS /* with AVX-512 without VNNI signed codes never pair (`paired`) */
                SIGNED_CODE_FORMATS(PAIR_CASE)
#endif
            default: break; /* `paired` pairs no other */
            }
            g0 += g;
        }
    }
}
#endif

#define PASSES_CASE(T) case T: PASSES(T); break;
static void columns(void *ctx, int64_t begin, int64_t end) {
    job *j = ctx;
    const int G = j->G;
#if ROW_PAIRS
    /* rows n and n + far together, an odd last row alone (below) */
    if (j->pairs) {
        const int64_t far = (end - begin) / 2;
        pair_columns(j, begin, far);
        begin += 2 * far;
    }
#endif
    vacc *keep = 0;
    if (j->chunk < j->nu && !(keep = keep_buffer(COLUMN_BLOCK * G))) {
        __atomic_store_n(&j->out_of_memory, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t b0 = begin; b0 < end; b0 += COLUMN_BLOCK) {
        const int64_t b1 = b0 + COLUMN_BLOCK < end ? b0 + COLUMN_BLOCK : end;
        for (int64_t i0 = 0; i0 < j->nu; i0 += j->chunk) {
            const int64_t i1 = i0 + j->chunk < j->nu ? i0 + j->chunk : j->nu;
            switch (j->type) { /* each (type, G) pair compiles to its own loop, its accumulators in registers */
                QUANT_FORMATS(PASSES_CASE)
            default: break; /* q8_matmul takes no other */
            }
        }
    }
}

/* The units of a chunk when a pass of G rows (at most MAX_ROWS) goes over rows of K weights: all of them
 * (units(K)) unless the activations exceed CHUNK_FROM_BYTES. */
int64_t q8_chunk_units(int64_t K, int64_t G) {
    const int64_t nu = units(K);
    if (G * nu * (int64_t)sizeof(act_unit) <= CHUNK_FROM_BYTES) return nu;
    const int64_t chunk = CHUNK_BYTES / (G * (int64_t)sizeof(act_unit)) / UNITS_PER_ACC * UNITS_PER_ACC;
    return chunk < UNITS_PER_ACC ? UNITS_PER_ACC : chunk;
}

/* y[s * ldy + n] = the definition's x[s] · W[n] (+ bias[n], one float32 addition, if bias is not NULL)
 * for s < S, n < N, with `act` from q8_quantize(x) and W repacked by q8_repack. `threads` split n.
 * Returns 0, -1 for a type this path does not take, -2 if out of memory. */
int q8_matmul(int type, const uint8_t *w, int64_t N, int64_t K, const act_unit *act, int64_t S, float *y,
              int64_t ldy, const float *bias, int threads) {
    if (!sb_bytes(type)) return -1;
    const int64_t nu = units(K), row_bytes = repacked_row_bytes(type, K);
    for (int64_t s0 = 0; s0 < S; s0 += MAX_ROWS) {
        const int G = S - s0 < MAX_ROWS ? (int)(S - s0) : MAX_ROWS;
        const int64_t chunk = q8_chunk_units(K, G);
        const int pairs = paired(type, G, chunk, nu);
        job j = {type, G, half_tail(K), pairs, w, row_bytes, pairs ? nu : chunk, nu, ldy, act + s0 * nu, y + s0 * ldy,
                 bias, 0};
        parallel_for(threads, N, columns, &j);
        if (j.out_of_memory) return -2;
    }
    return 0;
}
