/* A unit against several activation rows without spilling registers: with AVX2 and AVX-VNNI one weight row chunk
 * by chunk (`unit_group_by_chunk`), with AVX-512 two weight rows at once (`unit_pair`, `unit_pair_by_chunk`). Each output
 * keeps its order of terms, so its bits are `unit`'s. Part of q8dot.c's translation unit, after q8weights.h. */
#ifndef SPECDEC_Q8GROUPED_H
#define SPECDEC_Q8GROUPED_H

#if !defined(PAIRS) && defined(NATIVE)
/* With VNNI, the terms of a unit against activation row x from the int32 sums a chunk-by-chunk loop kept: `dot`, and
 * for Q6_K and Q3_K `first`, their first halves (`dot` then holds the second ones); each block sum I as unit_terms
 * finishes it. */
static inline __attribute__((always_inline)) vl by_chunk_terms(const int type, const unit_weights *u, const nv *first,
                                                               const nv *dot, const act_unit *x) {
    vli sum;
    memcpy(&sum, dot, CHUNK);
    if (!half_scaled(type)) return float_steps(type, u, __builtin_convertvector(centred(type, sum, x), vl), x);
    vli first_half;
    memcpy(&first_half, first, CHUNK);
    return float_steps(type, u, scaled_halves_sum(u, first_half, sum), x);
}

/* Row x's half sums' start (`half_start_of`) in a register. */
static inline nv half_start_nv(const int type, const act_unit *x, int h) {
    const vli start = half_start_of(type, x, h);
    nv out;
    memcpy(&out, &start, CHUNK);
    return out;
}
#endif

#if defined(PAIRS) && CHUNK == 32 && NATIVE == 32
/* AVX2, passes of 2-8 rows (2-5 for Q5_0 and Q6_K): one full unit of one weight row against the G activation rows,
 * two chunks at a time: each weight chunk unpacked into one register and dotted with every row's chunk, so that what
 * stays in registers is a row's int16 sums, and its int32 sums where they widen within the unit (Q5_0, Q6_K).
 * Unpacked whole as `unit` does, a unit's 8 registers of weights left 8 of AVX2's 16 for the rows, and from 2 rows
 * their sums and accumulators spilled (12-38 spilled vectors a unit at 2-5 rows; 2 a row now, the accumulators).
 * The integer sums are the same, exact in any order, and the float steps unit_terms', so the bits are too. On the
 * Zen 4 capped at AVX2 (`specdec bench --kernel-ab`, both threads): q/k/v, out and gate/up at 2-8 rows 0.81-0.93x
 * the time, the output layer (Q6_K) at 2-5 rows 0.88-0.93x, whole passes of 2-8 tokens 0.83-0.92x; one row is
 * unchanged. Not in groups, each unpacking the unit again: Q6_K's 5 and 8 rows as 2 + 3 and 4 + 4, the output layer
 * 1.3-1.5x (its unpacking outweighed its dot products); Q4_K's 9-16 rows in groups of up to 8, 1.07-1.29x. */
#define UNIT_BY_CHUNK 1
enum { BY_CHUNK_ROWS = 8, BY_CHUNK_ROWS_WIDENED = 5 };

/* Signed codes (Q8_0's, IQ4's values: |q| the unsigned operand, q's sign moved onto the activations) the same way,
 * one chunk at a time: |q| and q in two registers, each row's int16 pair sums widened at every chunk (|q|·|u| pairs
 * reach 2 · 128 · 127) into its int32 sum, so 4 registers beside G sums. Whole, a unit's 8 registers of |q| and 8
 * of signs took all 16, and every row's sums spilled. On the Zen 4 capped at AVX2 (`specdec bench --kernel-ab`, both
 * threads, against whole units): the 1.5B target as IQ4_XS, passes of 5 / 8 tokens 0.95 / 0.99x the time (2-4 rows
 * went in pairs there, unchanged); as Q8_0 (single rows), 5 / 6 / 8 tokens 0.94 / 0.93 / 0.97x. */
static inline __attribute__((always_inline)) void unit_group_signed_by_chunk(const int type, const uint8_t *o,
                                                                       const act_unit *a, int64_t lda, vacc *acc,
                                                                       int G, int part) {
    unit_weights u;
    unpack_scales(type, o, &u, 0);
    const nv one = SPLAT16(1);
    nv dot[MAX_ROWS];
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        const vw b = weight_chunk(type, o, c, SB_PER_UNIT, CHUNK);
        nv q;
        memcpy(&q, &b, CHUNK);
        const nv w = NV_ABS(q);
#pragma GCC unroll 8
        for (int g = 0; g < G; g++) {
            const nv wide = MADD16(PAIRS(w, NV_SIGN(NV_LOAD(a[g * lda].u + c * CHUNK), q)), one);
            dot[g] = c ? ADD32(dot[g], wide) : wide;
        }
    }
    for (int g = 0; g < G; g++) {
        vli sum;
        memcpy(&sum, &dot[g], CHUNK);
        acc[g] = acc_add_unit(acc[g], dot_terms(type, &u, sum, a + g * lda), part);
    }
}

static inline __attribute__((always_inline)) void unit_group_by_chunk(const int type, const uint8_t *o, const act_unit *a,
                                                                int64_t lda, vacc *acc, int G, int part) {
    if (sign_on_activations(type)) {
        unit_group_signed_by_chunk(type, o, a, lda, acc, G, part);
        return;
    }
    unit_weights u;
    unpack_scales(type, o, &u, 0);
    const int sums16 = sums16_of(type);
    nv mult[2], pairs[MAX_ROWS], dot[MAX_ROWS];
    if (half_scaled(type)) memcpy(mult, u.scale, sizeof mult);
    else mult[0] = mult[1] = SPLAT16(1);
#pragma GCC unroll 4
    for (int c = 0; c < 8; c += 2) { /* two chunks at a time: Q6_K widens every two */
        nv w[2];
        for (int k = 0; k < 2; k++) {
            const vw q = weight_chunk(type, o, c + k, SB_PER_UNIT, CHUNK);
            memcpy(&w[k], &q, CHUNK);
        }
#pragma GCC unroll 8
        for (int g = 0; g < G; g++) {
            const int8_t *x = a[g * lda].u + c * CHUNK;
            nv p = ADD16(PAIRS(w[0], NV_LOAD(x)), PAIRS(w[1], NV_LOAD(x + CHUNK)));
            if (sums16 > 2) {
                if (c % sums16) p = ADD16(pairs[g], p);
                /* summed as it goes: GCC would hold every chunk's products for a tree of adds, and spill them */
                __asm__("" : "+x"(p));
                pairs[g] = p;
            }
            if ((c + 2) % sums16 == 0) {
                const nv wide = MADD16(p, mult[c >= 4]);
                dot[g] = c + 2 == sums16 ? wide : ADD32(dot[g], wide);
            }
        }
    }
    for (int g = 0; g < G; g++) {
        vli sum;
        memcpy(&sum, &dot[g], CHUNK);
        acc[g] = acc_add_unit(acc[g], dot_terms(type, &u, sum, a + g * lda), part);
    }
}

/* Whether a unit of this format goes chunk by chunk against G rows (above). */
static inline int unit_goes_by_chunk(const int type, const int G) {
    return G >= 2 && G <= (sums16_of(type) == 8 || sign_on_activations(type) ? BY_CHUNK_ROWS : BY_CHUNK_ROWS_WIDENED);
}

/* Passes over two weight rows at once, where the process measures one-row passes faster so
 * (`q8_set_one_row_pairs`: two weight streams a thread): one unit of the rows at o and o + other against G
 * activation rows, as unit_group_by_chunk goes (two chunks at a time, a row's int16 sums, its int32 sums where they
 * widen), each activation chunk loaded once for both weight rows; whole units of two rows would take all 16
 * registers. acc0[g] and acc1[g] += their terms (into `part`). Up to 4 rows of Q4_K and Q4_0, whose sums stay int16
 * through the unit (2·G registers of sums, 4 of weights, 2 of activations), and 2 of Q5_0 and Q6_K, which widen
 * (their int32 sums, or Q6_K's 4 scale registers, beside them); from 2 rows the accumulators stay in memory between
 * units. On a Granite Rapids capped at AVX2 (`specdec bench --kernel-ab`, both threads), against single weight rows:
 * at 2 rows the down projections and the output layer (Q6_K) 0.885x the time, gate/up 0.86x, whole passes of 2
 * tokens 0.89x; Q4_K at 3 and 4 rows too: passes of 3 and 4 tokens 0.93x and 0.94x; at 5 rows level (spilled),
 * so not taken then. Q4_K's, Q4_0's and Q4_1's passes of 5-16 rows pair too, in groups of up to 5 (each unpacking
 * the unit again), where their activations outgrow the L1 (more than PAIR_GROUPS_FROM_BYTES, half again a 32 KiB
 * L1): a unit, unpacked once, meets each activation chunk for two weight rows, so the activations come from the L2
 * half as often. Out of line (each loop its own function, q8dot.c), 5 rows keep all but one sum and the ones in
 * registers. On the Zen 3 (AVX2, the packaged target's 14 Q4_K down projections, 8,960 wide, from memory,
 * alternating against single rows): 0.86-1.0x the time at 5 rows, 0.87-0.98x at 6-9, 0.67-0.90x at 12-16. Gate/up
 * (1,536 wide, their activations in the L1) took 1.09-1.22x at 5-12 in groups and 0.98-1.34x at 16 (36 KiB), so
 * they stay single. */
enum { PAIR_ROWS = 5, PAIR_ONE_GROUP_ROWS = 4, PAIR_WIDENED_ROWS = 2, PAIR_GROUPS_FROM_BYTES = 49152 };
static inline int pair_group_rows(const int type) {
    return sums16_of(type) == 8 ? PAIR_ROWS : sign_on_activations(type) ? PAIR_ONE_GROUP_ROWS : PAIR_WIDENED_ROWS;
}

/* A pair's int32 block sums against G rows, dot[r][g] of weight row r, into acc0[g] and acc1[g] (`part`) as dot_terms
 * finishes them. */
static inline __attribute__((always_inline)) void pair_sums_into(const int type, const unit_weights *u,
                                                                 nv (*dot)[PAIR_ROWS], const act_unit *a, int64_t lda,
                                                                 vacc *acc0, vacc *acc1, int G, int part) {
    for (int g = 0; g < G; g++) {
        vli sum[2];
        memcpy(sum, &dot[0][g], CHUNK);
        memcpy(sum + 1, &dot[1][g], CHUNK);
        acc0[g] = acc_add_unit(acc0[g], dot_terms(type, &u[0], sum[0], a + g * lda), part);
        acc1[g] = acc_add_unit(acc1[g], dot_terms(type, &u[1], sum[1], a + g * lda), part);
    }
}

/* Signed codes in pairs (Q8_0's, IQ4's values; without VNNI |q| the unsigned operand, q's sign moved onto the
 * activations):
 * as below, but one chunk at a time, its int16 pair sums widened at every chunk (|q|·|u| pairs reach 2 · 128 · 127),
 * so 2 registers of |q|, 2 of q, 1 of activations and 1 of ones beside 2·G int32 sums: up to 4 rows in the 16.
 * Before (2026-12-05), Q8_0 never paired here: a unit went whole, 8 registers of |q| and 8 of signs, and a one-token
 * pass of the 1.5B target in Q8_0 ran at 1.3x its bandwidth floor. On the Granite Rapids capped at AVX2
 * (`specdec bench --kernel-ab`, both threads), against that build: passes of 1 / 2 / 3 / 4 tokens 0.65 / 0.66 /
 * 0.72 / 0.80x the time, 5 the same (single rows). 5-16 rows in groups of up to 4 (each group reading the two rows
 * again) 0.96 / 0.99x at 5 / 6 rows and 1.04-1.14x at 8-16, so not taken: a Q8_0 row's sign and widening make
 * each of its products twice Q4_K's work. */
static inline __attribute__((always_inline)) void unit_pair_signed_by_chunk(const int type, const uint8_t *o,
                                                                            int64_t other, const act_unit *a,
                                                                            int64_t lda, vacc *acc0, vacc *acc1,
                                                                            int G, int part) {
    unit_weights u[2];
    unpack_scales(type, o, &u[0], 0);
    unpack_scales(type, o + other, &u[1], 0);
    const nv one = SPLAT16(1);
    nv dot[2][PAIR_ROWS];
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        nv q[2], w[2];
        for (int r = 0; r < 2; r++) {
            const vw b = weight_chunk(type, o + r * other, c, SB_PER_UNIT, CHUNK);
            memcpy(&q[r], &b, CHUNK);
            w[r] = NV_ABS(q[r]);
        }
        for (int g = 0; g < G; g++) {
            const nv x = NV_LOAD(a[g * lda].u + c * CHUNK);
            for (int r = 0; r < 2; r++) {
                const nv wide = MADD16(PAIRS(w[r], NV_SIGN(x, q[r])), one);
                dot[r][g] = c ? ADD32(dot[r][g], wide) : wide;
            }
        }
    }
    pair_sums_into(type, u, dot, a, lda, acc0, acc1, G, part);
}

static inline __attribute__((always_inline)) void unit_pair_by_chunk(const int type, const uint8_t *o, int64_t other,
                                                                     const act_unit *a, int64_t lda, vacc *acc0,
                                                                     vacc *acc1, int G, int part) {
    if (sign_on_activations(type)) {
        unit_pair_signed_by_chunk(type, o, other, a, lda, acc0, acc1, G, part);
        return;
    }
    unit_weights u[2];
    const int sums16 = sums16_of(type);
    nv mult[2][2], sums[2][PAIR_ROWS], dot[2][PAIR_ROWS];
    for (int r = 0; r < 2; r++) {
        unpack_scales(type, o + r * other, &u[r], 0);
        if (half_scaled(type)) memcpy(mult[r], u[r].scale, sizeof mult[r]);
        else mult[r][0] = mult[r][1] = SPLAT16(1);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 8; c += 2) { /* two chunks at a time: Q6_K widens every two */
        nv w[2][2];
        for (int r = 0; r < 2; r++)
            for (int k = 0; k < 2; k++) {
                const vw q = weight_chunk(type, o + r * other, c + k, SB_PER_UNIT, CHUNK);
                memcpy(&w[r][k], &q, CHUNK);
            }
        for (int g = 0; g < G; g++) {
            const nv x0 = NV_LOAD(a[g * lda].u + c * CHUNK), x1 = NV_LOAD(a[g * lda].u + (c + 1) * CHUNK);
            for (int r = 0; r < 2; r++) {
                nv p = ADD16(PAIRS(w[r][0], x0), PAIRS(w[r][1], x1));
                if (sums16 > 2) {
                    if (c % sums16) p = ADD16(sums[r][g], p);
                    __asm__("" : "+x"(p));
                    sums[r][g] = p;
                }
                if ((c + 2) % sums16 == 0) {
                    const nv wide = MADD16(p, mult[r][c >= 4]);
                    dot[r][g] = c + 2 == sums16 ? wide : ADD32(dot[r][g], wide);
                }
            }
        }
    }
    pair_sums_into(type, u, dot, a, lda, acc0, acc1, G, part);
}
#elif !defined(PAIRS) && CHUNK == 32 && NATIVE == 32
/* AVX-VNNI (`vpdpbusd` on 256 bits, AVX2's 16 registers), passes of 2-8 rows, and Q6_K's of 9-16 in two groups:
 * as AVX2's above, one full unit of one weight row against the G activation rows, each weight chunk unpacked into
 * one register and dotted with every row's chunk, so that what stays in registers is a row's int32 sum (Q6_K's two
 * halves from its fifth chunk on). Unpacked whole (`unit`), passes of 5 and 9 tokens had cost 2.6 and 4.2
 * one-token passes on a Granite Rapids capped at this level (the AVX2 build beside it: 1.3 and 2.0), the output
 * layer (Q6_K) at 2 rows twice its time at one. There (`specdec bench --kernel-ab`, both threads, three
 * A/Bs chained): the output layer at 2-16 rows 0.24-0.45x the time, the down projections 0.43-0.73x, q/k/v at 2-16
 * 0.82-0.88x (their Q6_K parts), out and gate/up level (Q4_K's whole units were as fast: bound by their dot
 * products); whole passes of 2 / 3 / 5 / 8 / 9 / 12 / 16 tokens 0.76 / 0.65 / 0.58 / 0.53 / 0.52 / 0.49 / 0.50x,
 * one token the same code. Q4_K and Q5_0 in two groups from 9 rows as well: passes of 9 / 12 / 16 tokens 1.04 /
 * 0.99 / 1.03x, gate/up 1.01-1.12x (not taken). The integer sums are the same, exact in any order, and the float
 * steps unit_terms', so the bits are too. */
#define UNIT_BY_CHUNK 1
enum { BY_CHUNK_ROWS = 8 };

static inline __attribute__((always_inline)) void unit_rows_by_chunk(const int type, const uint8_t *o, const act_unit *a,
                                                                     int64_t lda, vacc *acc, int G, int part) {
    unit_weights u;
    unpack_scales(type, o, &u, 0);
    nv dot[MAX_ROWS], first[MAX_ROWS]; /* first: the first halves of Q6_K and Q3_K */
    for (int g = 0; g < G; g++) dot[g] = half_scaled(type) ? half_start_nv(type, a + g * lda, 0) : NV_ZERO();
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        if (half_scaled(type) && c == 4) /* the first halves done, the second ones start */
            for (int g = 0; g < G; g++) {
                first[g] = dot[g];
                dot[g] = half_start_nv(type, a + g * lda, 1);
            }
        const vw q = weight_chunk(type, o, c, SB_PER_UNIT, CHUNK);
        nv w;
        memcpy(&w, &q, CHUNK);
#pragma GCC unroll 8
        for (int g = 0; g < G; g++) dot[g] = DP(dot[g], w, NV_LOAD(a[g * lda].u + c * CHUNK));
    }
    for (int g = 0; g < G; g++)
        acc[g] = acc_add_unit(acc[g], by_chunk_terms(type, &u, &first[g], &dot[g], a + g * lda), part);
}

/* The same against G ≤ MAX_ROWS rows, from BY_CHUNK_ROWS + 1 in two groups, each unpacking the unit again (their
 * sizes constants of each pass's G, so that each group's sums stay in registers). */
static inline __attribute__((always_inline)) void unit_group_by_chunk(const int type, const uint8_t *o, const act_unit *a,
                                                                int64_t lda, vacc *acc, int G, int part) {
    if (G <= BY_CHUNK_ROWS) {
        unit_rows_by_chunk(type, o, a, lda, acc, G, part);
        return;
    }
    const int first = G / 2;
    unit_rows_by_chunk(type, o, a, lda, acc, first, part);
    unit_rows_by_chunk(type, o, a + first * lda, lda, acc + first, G - first, part);
}

/* Whether a unit of this format goes chunk by chunk against G rows (above). */
static inline int unit_goes_by_chunk(const int type, const int G) {
    return G >= 2 && (G <= BY_CHUNK_ROWS || half_scaled(type));
}
#else
#define UNIT_BY_CHUNK 0
#endif

#if CHUNK == 64
/* Passes of 2-14 activation rows (2-10 before 2026-12-03's groups of 7) go over two weight rows at once (o, and
 * o + other: the first and second halves of a worker's columns, two linear streams), so that each activation
 * chunk loaded serves both: half the activation reads a weight byte. So do larger passes whose activations would
 * otherwise go in chunks (below). Passes of more than PAIR_ROWS rows go in groups of 4-7 rows on the same two
 * weight rows, each group unpacking the units again (the second group's weights come from the L1). At 2 rows
 * of the 1.5B target's down projections, 30 KiB of activations against a Zen 4's 32 KiB L1, single rows ran at
 * 1.5x the time of one row. On a Zen 4, from memory, against single rows: at 2-4
 * rows, the down projections 0.70-0.91x, q/k/v, out and gate/up 0.86-0.97x, the output layer 0.91-0.98x, the
 * draft's Q5_0 shapes 0.89-1.08x; at 5 rows the down projections (whole rows now, not chunks) 0.65-0.68x and the
 * other shapes 0.83-0.96x; the down projections at 6-9 rows 0.84-0.90x. Whole passes of the 1.5B target: 2 / 3 /
 * 4 tokens 0.96 / 0.92 / 0.85x, 5 tokens 0.83-0.85x (medians of 16-20, both builds in one process,
 * `specdec bench --kernel-ab`). With VNNI, a unit goes chunk by chunk (`unit_pair_by_chunk`, each activation
 * chunk in one register for both weight rows) at 5 rows, and at 3-4 where the activations fit the L1
 * (PAIR_BY_CHUNK_L1); whole units otherwise: chunk by chunk, with the activations from the L2 (the down
 * projections at 3-4 rows) 1.08-1.11x the time, and at 2 rows 1.04-1.10x (the Zen 4, both threads, from memory).
 * Against the build before (2026-12-03: whole units at 3-4 rows, and at 5 chunk by chunk with each activation
 * load folded into both dot products): q/k/v, out, gate/up and the output layer at 3-5 rows 0.81-0.92x, whole
 * passes of 3 / 4 / 5 tokens 0.96 / 0.93 / 0.94x; and pairs in two groups against single rows at 6-10 rows,
 * passes 0.89-0.96x (11-16 rows level, so not taken). At one row only where the process measures it faster
 * (`q8_set_one_row_pairs`, whole units: on the Zen 4 1.0-1.08x, on a Granite Rapids 0.77x; chunk by chunk with
 * shared loads 1.27-1.37x slower on gate/up and the output layer at both threads on the Zen 4). Q8_0 since its
 * codes go in as q + 128 (SIGNED_OFFSET; with |q| and its sign, twice the registers, it had been 1.0-1.23x): on the
 * Granite Rapids the 0.5B draft's output layer (Q8_0, a third of its pass) at 1 / 2 / 3 / 5 rows 0.81 / 0.76 /
 * 0.64 / 0.60x the time, the draft's whole passes of 1-5 tokens 0.83-0.87x (at AVX-VNNI 0.87-0.89x; with single
 * rows 0.84-0.91x). AVX-512 only: with AVX2's 16 registers the spills made it 1.3-3x slower.
 * Without VNNI (the avx512 build) whole units only, in groups of up to 4 rows and for at most 4 rows unless
 * chunked: on a Zen 5 capped at that level, whole passes of 2 / 3 / 4 tokens took 1.06 / 1.08 / 1.25x the time
 * without pairs, 5 and 9 tokens the same (`specdec bench --kernel-ab`). The order of every output's terms is
 * unchanged.
 * Groups of up to 7 rows with VNNI, where they were of up to 5 (2026-12-03, the Zen 4, both threads, from memory,
 * `kernel_ab_groups_of_7*.json`): a group's 2 · 7 dot products and 2 · 7 accumulators, one weight chunk a row
 * and one activation chunk take 31 of the 32 registers (0-12 vectors a unit through the stack; groups of 8
 * spilled 37-44 and were level at 8 rows), so 6 and 7 rows go in one group where they went in two, and 11-14
 * rows in two where they went over single weight rows: whole passes of 6 / 7 / 12 / 14 tokens 0.90 / 0.95 /
 * 0.92 / 0.91x the time, 1, 2, 5 and 9 tokens the same code (cc2313a, Q6_K still in groups of up to 5). Q6_K's
 * first halves take a third set of registers, so from 6 rows its accumulators stay in memory between units (an
 * empty `asm` with memory operands; 33 and 45 vectors a unit through the stack at 6 and 7 rows, 24 and 28 of them
 * the accumulators): against groups of up to 5, the output layer and the down projections at 6-7 rows 0.87-0.94x,
 * passes of 6 / 7 / 12 / 14 tokens 0.96 / 0.95 / 0.94-0.99 / 0.97-0.99x in two runs
 * (`kernel_ab_q6_k_groups_of_7*.json`). */
enum { UNIT_PAIR_ROWS = 4, PAIR_BY_CHUNK_FROM = 3, PAIR_BY_CHUNK_L1 = 32768 };
#ifdef PAIRS /* without VNNI whole units only, no chunk-by-chunk pairs: groups of up to 4 rows */
enum { PAIR_ROWS = 4, PAIR_MAX_ROWS = 4 };
#else /* PAIR_ROWS a group, PAIR_MAX_ROWS a pass unless its activations go in chunks; beyond
       * PAIR_Q6_K_IN_REGISTERS rows a Q6_K pair's accumulators stay in memory between units */
enum { PAIR_ROWS = 7, PAIR_MAX_ROWS = 14, PAIR_Q6_K_IN_REGISTERS = 5 };
#endif
static inline int pair_group_rows(const int type) { (void)type; return PAIR_ROWS; }
static inline int pair_acc_in_registers(const int type, const int G) {
#ifdef PAIRS
    (void)type, (void)G;
    return 1;
#else
    return !half_scaled(type) || G <= PAIR_Q6_K_IN_REGISTERS;
#endif
}

/* One full unit of two weight rows (at o and o + other) against G ≤ PAIR_ROWS activation rows, both units
 * unpacked whole into registers: acc0[g] and acc1[g] += their terms. */
static inline __attribute__((always_inline)) void unit_pair(const int type, const uint8_t *o, int64_t other,
                                                            const act_unit *a, int64_t lda, vacc *acc0, vacc *acc1,
                                                            int G) {
    unit_weights u0, u1;
    unpack_unit(type, o, &u0, 0);
    unpack_unit(type, o + other, &u1, 0);
    for (int g = 0; g < G; g++) {
        const act_unit *x = a + g * lda;
        acc0[g] = acc_add_unit(acc0[g], unit_terms(type, &u0, x), 0);
        acc1[g] = acc_add_unit(acc1[g], unit_terms(type, &u1, x), 0);
    }
}

#elif !defined(PAIRS) && NATIVE == 32
/* AVX-VNNI: passes over two weight rows at once, chunk by chunk (`unit_pair_by_chunk`; whole units of two rows
 * would take all 16 registers), where the process measures one-row passes faster so (`q8_set_one_row_pairs`).
 * Capped at this level on a Granite Rapids, a one-token pass took longer than a two-token one (49.9 against 46.0
 * ms): bound by one weight stream a thread (20 GB/s), where AVX-512's pairs read two (28.5). So were passes of a
 * few rows: there (`specdec bench --kernel-ab`, both threads), against single weight rows
 * (`unit_rows_by_chunk`), passes of 2 / 3 / 4 / 5 tokens took 0.84 / 0.88 / 0.92 / 0.96x the time, gate/up at
 * 2-5 rows 0.83-0.90x, the output layer (Q6_K) at 2-3 0.80-0.86x. Up to 5 rows (2·G int32 sums, 2 weight
 * registers, 1 of activations), Q6_K's to 3 (its first halves take 2·G more); 6 rows level or slower, and groups of
 * them (6-10 rows as 3-5 + 3-5, each unpacking the units again) 1.03-1.10x at 6 and 9 tokens, so not taken. */
enum { PAIR_ROWS = 5, PAIR_MAX_ROWS = 5, PAIR_Q6_K_ROWS = 3 };
static inline int pair_group_rows(const int type) { return half_scaled(type) ? PAIR_Q6_K_ROWS : PAIR_ROWS; }
#endif

#if !defined(PAIRS) && (NATIVE == 64 || NATIVE == 32)
/* One unit of two weight rows (at o and o + other) against G ≤ PAIR_ROWS activation rows, chunk by chunk: each
 * weight chunk unpacked into one register per weight row and each activation chunk loaded into one register for
 * both, so that 2·G integer sums and 2·G accumulators fit in the 32 registers at up to 7 rows (Q6_K's first
 * halves take 2·G more: from 6 rows their accumulators stay in memory; whole units, 16 registers of weights,
 * spill there). acc0[g] and acc1[g] += their terms (into `part`: `acc_add_unit`). */
static inline __attribute__((always_inline)) void unit_pair_by_chunk(const int type, const uint8_t *o, int64_t other,
                                                                     const act_unit *a, int64_t lda, vacc *acc0,
                                                                     vacc *acc1, int G, int part) {
    unit_weights u[2];
    unpack_scales(type, o, &u[0], 0);
    unpack_scales(type, o + other, &u[1], 0);
    nv dot[2][PAIR_ROWS], first[2][PAIR_ROWS]; /* first: the first halves of Q6_K and Q3_K */
    for (int g = 0; g < G; g++)
        for (int r = 0; r < 2; r++) dot[r][g] = half_scaled(type) ? half_start_nv(type, a + g * lda, 0) : NV_ZERO();
#pragma GCC unroll 8 /* as GCC unrolls it without the barrier below */
    for (int c = 0; c < 8; c++) {
        if (half_scaled(type) && c == 4) /* the first halves done, the second ones start */
            for (int g = 0; g < G; g++)
                for (int r = 0; r < 2; r++) {
                    first[r][g] = dot[r][g];
                    dot[r][g] = half_start_nv(type, a + g * lda, 1);
                }
        nv w[2];
        for (int r = 0; r < 2; r++) {
            const vw q = weight_chunk(type, o + r * other, c, SB_PER_UNIT, CHUNK);
            memcpy(&w[r], &q, CHUNK);
        }
        for (int g = 0; g < G; g++) {
            nv x = NV_LOAD(a[g * lda].u + c * CHUNK);
            /* x in a register: GCC would fold the load into both vpdpbusd, two loads of the same 64 bytes, and
             * a Zen 4 loads one such vector a cycle (there, one thread, Q4_K at 5 rows 0.86x the time) */
            __asm__("" : "+v"(x));
            for (int r = 0; r < 2; r++) dot[r][g] = DP(dot[r][g], w[r], x);
        }
    }
    for (int g = 0; g < G; g++) {
        acc0[g] = acc_add_unit(acc0[g], by_chunk_terms(type, &u[0], &first[0][g], &dot[0][g], a + g * lda), part);
        acc1[g] = acc_add_unit(acc1[g], by_chunk_terms(type, &u[1], &first[1][g], &dot[1][g], a + g * lda), part);
    }
}
#endif

/* Whether this build takes two weight rows at once: AVX-512's at 1 (where measured faster) to PAIR_MAX_ROWS rows,
 * AVX-VNNI's and AVX2's at 1 to pair_max_rows(type) where the one-row setting is on. */
#if CHUNK == 64 || NATIVE == 32
#define ROW_PAIRS 1
#else
#define ROW_PAIRS 0
#endif

/* Whether signed codes (Q8_0, IQ4) pair: in every build that pairs but AVX-512 without VNNI (with VNNI as q + 128,
 * SIGNED_OFFSET; at AVX2 as |q| with its sign, `unit_pair_signed_by_chunk`). */
#if ROW_PAIRS && !(defined(PAIRS) && CHUNK == 64)
#define SIGNED_PAIRS 1
#else
#define SIGNED_PAIRS 0
#endif

#if ROW_PAIRS && CHUNK == 32
/* AVX-VNNI's and AVX2's pairs: a pass of up to one group of rows, and at AVX2 Q4_K's, Q4_0's and Q4_1's in groups
 * where a pass's activations (act_bytes) outgrow the L1 (above); the accumulators stay in registers between units
 * at one row only (16 registers), from 2 rows in memory. */
static inline int pair_max_rows(const int type, const int64_t act_bytes) {
#ifdef PAIRS
    if (sums16_of(type) == 8) return act_bytes > PAIR_GROUPS_FROM_BYTES ? MAX_ROWS : PAIR_ONE_GROUP_ROWS;
#endif
    (void)act_bytes;
    return pair_group_rows(type);
}
static inline int pair_acc_in_registers(const int type, const int G) {
    (void)type;
    return G == 1;
}
#endif

#endif
