/* The exact kernel's float formats, F32, F16 and BF16 (16 values a "block"): their values widened exactly, and passes
 * of several weight rows against several activation rows. Part of blockquant.c's translation unit, after its vector
 * helpers and lanes_sum. */
#ifndef SPECDEC_FLOAT_ROWS_H
#define SPECDEC_FLOAT_ROWS_H

/* V float16 values at p as float32 lanes: exact (vcvtph2ps; the SSE4.1 level, without F16C, one at a time). */
static inline vf load_f16(const uint8_t *p) {
#if V == 16
    return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif V == 8
    return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    vf v;
    for (int i = 0; i < V; i++) v[i] = half_to_float(p + 2 * i);
    return v;
#endif
}

/* V bfloat16 values at p as float32 lanes: each one's 16 bits the float32's high half, as gguf-py widens them. */
static inline vf load_bf16(const uint8_t *p) {
#if V == 16
    return (vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16);
#elif V == 8
    return (vf)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16);
#else
    return (vf)_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)p)), 16);
#endif
}

/* Bytes a value of a float format (F32, F16 or BF16) takes. */
static inline int64_t value_bytes(const int type) { return block_bytes(type) / block_weights(type); }

/* V values of a float format (F32, F16 or BF16) at p as float32 lanes, exactly. */
static inline vf load_values(const int type, const uint8_t *p) {
    return type == F16 ? load_f16(p) : type == BF16 ? load_bf16(p) : load_f32((const float *)p);
}

/* y[g·ldy + c·step] = x[g, :] · row c for C weight rows of a float format (at w, step rows apart) and G activation
 * rows: each activation vector loaded once for the C rows, each weight vector once for the G rows (C·G
 * accumulators; one row at a time, as the block formats go, a pass of 5 rows read each activation vector from the L1
 * or L2 for every product, and an F16 [8960, 1536] at 5 rows took 2.5 times its time at one). Each output's terms
 * are summed in the order the block formats' are (V lanes over the row in storage order, then lanes_sum): the same
 * bits as one row at a time. Without AVX-512, 4 weight rows against 2 activation rows: 2 against 5 took the F16
 * target's passes of 1 / 2 / 5 / 9 tokens 1.13 / 1.11 / 1.04 / 1.09 times as long (its one-token pass bound by the
 * latency of 2 chains of multiply-adds a thread), 3 against 3 1.01 / 1.07 / 1.09 / 1.00 times (the Zen 4, the AVX2
 * build swapped in, two A/Bs: docs/bench/zen4_f16/ab.log). */
static inline __attribute__((always_inline)) void float_pass(const int type, const uint8_t *w, int64_t row_bytes,
                                                             int64_t K, const float *x, int64_t ldx, float *y,
                                                             int64_t ldy, int64_t step, const int C, const int G) {
    vf acc[FLOAT_COLS][FLOAT_ROWS];
    for (int c = 0; c < C; c++)
        for (int g = 0; g < G; g++) acc[c][g] = splat(0.0f);
    for (int64_t k = 0; k < K; k += V) {
        vf wv[FLOAT_COLS];
        for (int c = 0; c < C; c++) wv[c] = load_values(type, w + c * step * row_bytes + k * value_bytes(type));
        for (int g = 0; g < G; g++) {
            const vf xv = load_f32(x + g * ldx + k);
            for (int c = 0; c < C; c++) acc[c][g] += xv * wv[c];
        }
    }
    for (int c = 0; c < C; c++)
        for (int g = 0; g < G; g++) y[g * ldy + c * step] = lanes_sum(acc[c][g]);
}

#define FLOAT_PASS(T, C, G)                                                          \
    case G:                                                                          \
        float_pass(T, row, row_bytes, K, xs, K, ys, ldy, step, C, G);                \
        break;
#if FLOAT_ROWS == 6
#define FLOAT_PASSES_ABOVE_2(T, C) FLOAT_PASS(T, C, 3) FLOAT_PASS(T, C, 4) FLOAT_PASS(T, C, 5) FLOAT_PASS(T, C, 6)
#else
#define FLOAT_PASSES_ABOVE_2(T, C)
#endif
#define FLOAT_PASSES(T, C)                                                                                     \
    switch (G) {                                                                                               \
        FLOAT_PASS(T, C, 1) FLOAT_PASS(T, C, 2) FLOAT_PASSES_ABOVE_2(T, C)                                     \
    }

/* Whether a format goes by float_pass. */
static inline int float_format(const int type) { return type == F32 || type == F16 || type == BF16; }

/* Weight rows n, n + step, ... (C of them) against the S activation rows, FLOAT_ROWS a pass. */
static inline __attribute__((always_inline)) void float_rows(const int type, const uint8_t *w, int64_t K,
                                                             int64_t row_bytes, const float *x, int64_t S, float *y,
                                                             int64_t ldy, int64_t n, int64_t step, const int C) {
    const uint8_t *row = w + n * row_bytes;
    for (int64_t s0 = 0; s0 < S; s0 += FLOAT_ROWS) {
        const float *xs = x + s0 * K;
        float *ys = y + s0 * ldy + n;
        const int G = S - s0 < FLOAT_ROWS ? (int)(S - s0) : FLOAT_ROWS;
        switch (type) {
        case F16: FLOAT_PASSES(F16, C); break;
        case BF16: FLOAT_PASSES(BF16, C); break;
        default: FLOAT_PASSES(F32, C); break;
        }
    }
}

/* Columns [begin, end) of a float format's job: in groups of FLOAT_COLS weight rows, group i the rows begin + i +
 * c·step (step = (end − begin) / FLOAT_COLS), so that each thread reads FLOAT_COLS long streams of consecutive rows;
 * the last few rows one at a time. Groups of adjacent rows (FLOAT_COLS short streams that jump every group) took the
 * F16 1.5B target's passes of 1 / 2 / 5 / 9 tokens 1.11 / 1.09-1.12 / 1.05-1.11 / 1.05-1.10 times as long, and one row
 * at a time (one stream a thread) its one-token passes 0.99-1.20 times (the Zen 4, docs/bench/zen4_f16/ab.log). */
static void float_columns(const int type, const uint8_t *w, int64_t K, int64_t row_bytes, const float *x, int64_t S,
                          float *y, int64_t ldy, int64_t begin, int64_t end) {
    const int64_t step = (end - begin) / FLOAT_COLS;
    for (int64_t i = 0; i < step; i++) float_rows(type, w, K, row_bytes, x, S, y, ldy, begin + i, step, FLOAT_COLS);
    for (int64_t n = begin + FLOAT_COLS * step; n < end; n++) float_rows(type, w, K, row_bytes, x, S, y, ldy, n, 1, 1);
}

#endif
