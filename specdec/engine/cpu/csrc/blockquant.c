/* y[S, N] = x[S, K] · W[N, K]ᵀ with W kept in its GGML block format, x and y float32.
 *
 * Numerics (the "gguf" compute path): every weight is expanded, in registers, to exactly the float32
 * value gguf-py's dequantizer gives it (d·sc·q − dmin·m for Q4_K, Q5_K and Q2_K, d·sc·(q − 32) for Q6_K,
 * d·sc·(q − 4) for Q3_K (sc its scale less 32), d·(q − 16) for Q5_0, d·(q − 8) for Q4_0, d·q + m for Q4_1 and
 * Q5_1 (one rounding, the sum's), d·q for Q8_0,
 * s·v for IQ4_NL and IQ4_XS (v the table value of its index, s = d or d·(ls − 32)); those products are exact in
 * float32, so a fused multiply-add rounds like gguf-py's multiply-then-subtract; F16's and BF16's values widened,
 * exactly), then
 * multiplied by float32 activations and summed in float32.
 *
 * Row invariance: each output y[s, n] is summed in one fixed order (V lanes over the row's blocks in
 * storage order, then the lanes by a fixed tree) whatever S is and whichever rows share the pass, so
 * a token's result does not depend on what it is computed with. Threads split the output columns
 * (workers.h: libgomp's team on the initial thread, a small pool of our own on any other).
 *
 * Built once per x86 level by specdec/native.py: x86-64-v4 (AVX-512, V = 16 lanes), -v3 (AVX2 + FMA,
 * V = 8) and -v2 (SSE4.1, V = 4); each uses its own register width, so values stay in registers.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "ggml_blocks.h"
#include "workers.h"


/* Per level: V lanes a vector, a pass feeding up to ROWS_PER_PASS activation rows (one accumulator
 * register each), and how V bytes are loaded (LOAD_BYTES) and widened to V int32 lanes; F32, F16 and BF16 go
 * FLOAT_COLS weight rows against up to FLOAT_ROWS activation rows a pass (`float_pass`: FLOAT_COLS · FLOAT_ROWS
 * accumulators, FLOAT_COLS weight vectors and one activation vector in the 32 or 16 registers). */
#if defined(__AVX512F__)
#define V 16
#define ROWS_PER_PASS 12
#define FLOAT_COLS 4
#define FLOAT_ROWS 6
#define LOAD_BYTES(p) _mm_loadu_si128((const __m128i *)(p))
#define WIDEN_U8 _mm512_cvtepu8_epi32
#define WIDEN_S8 _mm512_cvtepi8_epi32
#elif defined(__AVX2__)
#define V 8
#define ROWS_PER_PASS 10
#define FLOAT_COLS 4
#define FLOAT_ROWS 2
#define LOAD_BYTES(p) _mm_loadl_epi64((const __m128i *)(p))
#define WIDEN_U8 _mm256_cvtepu8_epi32
#define WIDEN_S8 _mm256_cvtepi8_epi32
#else
#define V 4
#define ROWS_PER_PASS 8
#define FLOAT_COLS 4
#define FLOAT_ROWS 2
#define LOAD_BYTES(p) load4(p)
#define WIDEN_U8 _mm_cvtepu8_epi32
#define WIDEN_S8 _mm_cvtepi8_epi32
#endif

typedef float vf __attribute__((vector_size(4 * V)));
typedef int32_t vi __attribute__((vector_size(4 * V)));

static inline __m128i load4(const uint8_t *p) {
    int32_t word;
    memcpy(&word, p, 4);
    return _mm_cvtsi32_si128(word);
}

static inline vi widen_u8(const uint8_t *p) { return (vi)WIDEN_U8(LOAD_BYTES(p)); } /* zero-extended */
static inline vi widen_s8(const uint8_t *p) { return (vi)WIDEN_S8(LOAD_BYTES(p)); } /* sign-extended */

/* The IQ4 table values (IQ4_VALUES) of the low nibbles of V bytes at p, or of their high ones, as int32 lanes. */
static inline vi iq4_values(const uint8_t *p, int high) {
    const __m128i table = _mm_loadu_si128((const __m128i *)IQ4_VALUES);
    const __m128i bytes = high ? _mm_srli_epi16(LOAD_BYTES(p), 4) : LOAD_BYTES(p);
    return (vi)WIDEN_S8(_mm_shuffle_epi8(table, _mm_and_si128(bytes, _mm_set1_epi8(15))));
}

/* Block j's scale of an IQ4_NL or IQ4_XS block at b (d, or d·(ls − 32): exact), and its 16 index bytes. */
static inline float iq4_scale(const int type, const uint8_t *b, int j) {
    const float d = half_to_float(b);
    return type == IQ4_XS ? d * (float)(iq4_xs_scale_code(b, j) - 32) : d;
}

static inline const uint8_t *iq4_indices(const int type, const uint8_t *b, int j) {
    return b + (type == IQ4_XS ? IQ4_XS_QS + 16 * j : 2);
}


static inline vf load_f32(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline vf splat(float f) { return (vf){0} + f; }

static inline vf to_float(vi q) { return __builtin_convertvector(q, vf); }

static inline vi lane_index(void) {
    vi lane;
    for (int i = 0; i < V; i++) lane[i] = i;
    return lane;
}

/* ggml_blocks.h's block sizes, for Python. */
int64_t bq_block_bytes(int type) { return block_bytes(type); }
int64_t bq_block_weights(int type) { return block_weights(type); }

/* Sub-block j's step d·sc and offset dmin·m, as gguf-py computes them. */
static inline void q4_k_step_offset(const uint8_t *s, int j, float d, float dmin, float *step, float *offset) {
    uint8_t sc, m;
    q4_k_scale_min(s, j, &sc, &m);
    *step = d * (float)sc; /* gguf-py: d * sc, then * q - dmin * m */
    *offset = dmin * (float)m;
}

/* Q2_K's step d·sc and offset dmin·m of its 16 weights j (of 16) in the block at b, as gguf-py computes them. */
static inline void q2_k_step_offset(const uint8_t *b, int j, float d, float dmin, float *step, float *offset) {
    *step = d * (float)(b[Q2_K_SCALES + j] & 15);
    *offset = dmin * (float)(b[Q2_K_SCALES + j] >> 4);
}

/* Feed one weight vector w (V consecutive weights at column k) to every activation row. */
#define FEED(w, k)                                                                   \
    do {                                                                             \
        const vf w_ = (w);                                                           \
        for (int g = 0; g < G; g++) acc[g] += load_f32(x + g * ldx + (k)) * w_;      \
    } while (0)

/* acc[g] (V lanes) += x[g, :] · row, over the K weights of one row in `type` (a block format: the float formats go
 * by float_columns), in storage order. */
static inline __attribute__((always_inline)) void dot_row(const int type, const uint8_t *row, int64_t K,
                                                          const float *x, int64_t ldx, vf *acc, const int G) {
    const int64_t blocks = K / block_weights(type);
    const int64_t bytes = block_bytes(type);
    for (int64_t i = 0; i < blocks; i++) {
        const uint8_t *b = row + i * bytes;
        if (type == Q4_K || type == Q5_K) { /* 64 weights per 32 bytes: low nibbles the first 32, high nibbles
                                               * the next; Q5_K's fifth bits in qh[32]: bit 2j of qh[l] the low
                                               * nibble's, 2j + 1 the high one's */
            const float d = half_to_float(b), dmin = half_to_float(b + 2);
            const uint8_t *qs = b + (type == Q5_K ? 48 : 16);
            const int64_t k0 = i * 256;
            for (int j = 0; j < 4; j++) {
                float s_lo, m_lo, s_hi, m_hi;
                q4_k_step_offset(b + 4, 2 * j, d, dmin, &s_lo, &m_lo);
                q4_k_step_offset(b + 4, 2 * j + 1, d, dmin, &s_hi, &m_hi);
                for (int l = 0; l < 32; l += V) {
                    const vi q = widen_u8(qs + 32 * j + l);
                    vi low = q & 15, high = q >> 4;
                    if (type == Q5_K) {
                        const vi h = widen_u8(b + 16 + l);
                        low |= ((h >> (2 * j)) & 1) << 4;
                        high |= ((h >> (2 * j + 1)) & 1) << 4;
                    }
                    FEED(to_float(low) * splat(s_lo) - splat(m_lo), k0 + 64 * j + l);
                    FEED(to_float(high) * splat(s_hi) - splat(m_hi), k0 + 64 * j + 32 + l);
                }
            }
        } else if (type == Q6_K) { /* 128 weights from ql[64] (low 4 bits) and qh[32] (high 2 bits) */
            const int8_t *sc = (const int8_t *)(b + 192);
            const float d = half_to_float(b + 208);
            const int64_t k0 = i * 256;
            for (int c = 0; c < 2; c++) {
                for (int l = 0; l < 32; l += V) {
                    const vi a = widen_u8(b + 64 * c + l), e = widen_u8(b + 64 * c + 32 + l);
                    const vi hi = widen_u8(b + 128 + 32 * c + l);
                    const vi q[4] = {(a & 15) | ((hi & 3) << 4), (e & 15) | (((hi >> 2) & 3) << 4),
                                     (a >> 4) | (((hi >> 4) & 3) << 4), (e >> 4) | (((hi >> 6) & 3) << 4)};
                    for (int r = 0; r < 4; r++) {
                        const float s = d * (float)sc[8 * c + 2 * r + l / 16]; /* one scale per 16 weights */
                        FEED(to_float(q[r]) * splat(s) - splat(32.0f * s), k0 + 128 * c + 32 * r + l); /* s·(q − 32) */
                    }
                }
            }
        } else if (type == Q3_K) { /* 128 weights from qs[32] (low 2 bits) and hmask[32] (third bits) */
            int8_t sc[16];
            q3_k_scales(b + Q3_K_SCALES, sc);
            const float d = half_to_float(b + Q3_K_D);
            const int64_t k0 = i * 256;
            for (int c = 0; c < 2; c++) {
                for (int l = 0; l < 32; l += V) {
                    const vi low = widen_u8(b + Q3_K_QS + 32 * c + l), third = widen_u8(b + Q3_K_HMASK + l);
                    for (int r = 0; r < 4; r++) {
                        const vi q = ((low >> (2 * r)) & 3) | (((third >> (4 * c + r)) & 1) << 2);
                        const float s = d * (float)sc[8 * c + 2 * r + l / 16];
                        FEED(to_float(q) * splat(s) - splat(4.0f * s), k0 + 128 * c + 32 * r + l); /* s·(q − 4) */
                    }
                }
            }
        } else if (type == Q2_K) { /* 128 weights from qs[32]: bits 2r of byte l, weight 32r + l */
            const float d = half_to_float(b + Q2_K_D), dmin = half_to_float(b + Q2_K_DMIN);
            const int64_t k0 = i * 256;
            for (int c = 0; c < 2; c++) {
                for (int l = 0; l < 32; l += V) {
                    const vi q = widen_u8(b + Q2_K_QS + 32 * c + l);
                    for (int r = 0; r < 4; r++) {
                        float step, offset;
                        q2_k_step_offset(b, 8 * c + 2 * r + l / 16, d, dmin, &step, &offset);
                        FEED(to_float((q >> (2 * r)) & 3) * splat(step) - splat(offset), k0 + 128 * c + 32 * r + l);
                    }
                }
            }
        } else if (type == IQ4_NL || type == IQ4_XS) { /* per 32 weights Q4_0's layout, table values */
            for (int j = 0; j < block_weights(type) / 32; j++) {
                const float s = iq4_scale(type, b, j);
                const uint8_t *qs = iq4_indices(type, b, j);
                const int64_t k0 = i * block_weights(type) + 32 * j;
                for (int l = 0; l < 16; l += V) {
                    FEED(to_float(iq4_values(qs + l, 0)) * splat(s), k0 + l);
                    FEED(to_float(iq4_values(qs + l, 1)) * splat(s), k0 + 16 + l);
                }
            }
        } else if (type == Q8_0) {
            const float d = half_to_float(b);
            for (int l = 0; l < 32; l += V) FEED(to_float(widen_s8(b + 2 + l)) * splat(d), i * 32 + l);
        } else if (type == Q4_0 || type == Q4_1) { /* low nibbles weights 0-15, high nibbles 16-31; d·q + add */
            float d, add;
            uint32_t high;
            const uint8_t *qs = legacy_block(type, b, &d, &add, &high);
            for (int l = 0; l < 16; l += V) {
                const vi q = widen_u8(qs + l);
                FEED(to_float(q & 15) * splat(d) + splat(add), i * 32 + l);
                FEED(to_float(q >> 4) * splat(d) + splat(add), i * 32 + 16 + l);
            }
        } else if (type == Q5_0 || type == Q5_1) { /* Q4_0's layout after qh, bit j of qh weight j's 5th; d·q + add */
            float d, add;
            uint32_t high;
            const uint8_t *qs = legacy_block(type, b, &d, &add, &high);
            for (int l = 0; l < 16; l += V) {
                const vi q = widen_u8(qs + l);
                const vi bits_lo = ((vi){0} + (int32_t)(high >> l)) >> lane_index();
                const vi bits_hi = ((vi){0} + (int32_t)(high >> (16 + l))) >> lane_index();
                FEED(to_float((q & 15) | ((bits_lo & 1) << 4)) * splat(d) + splat(add), i * 32 + l);
                FEED(to_float((q >> 4) | ((bits_hi & 1) << 4)) * splat(d) + splat(add), i * 32 + 16 + l);
            }
        }
    }
}

static inline float lanes_sum(vf a) { /* a fixed tree: halves, then quarters, ... */
#if V == 16
    typedef float v8f __attribute__((vector_size(32)));
    const v8f h = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
#elif V == 8
    const vf h = a;
#endif
#if V >= 8
    typedef float v4f __attribute__((vector_size(16)));
    const v4f q = __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
#else
    const vf q = a;
#endif
    return (q[0] + q[2]) + (q[1] + q[3]);
}

/* y[g·ldy] = x[g, :] · row for G activation rows: one accumulator per row, fed in one order. */
static inline __attribute__((always_inline)) void row_pass(const int type, const uint8_t *row, int64_t K,
                                                           const float *x, int64_t ldx, float *y, int64_t ldy,
                                                           const int G) {
    vf acc[ROWS_PER_PASS];
    for (int g = 0; g < G; g++) acc[g] = splat(0.0f);
    dot_row(type, row, K, x, ldx, acc, G);
    for (int g = 0; g < G; g++) y[g * ldy] = lanes_sum(acc[g]);
}

#include "float_rows.h"

#define PASS(T, G)                                                                   \
    case G:                                                                          \
        row_pass(T, row, K, xs, K, ys, ldy, G);                                      \
        break;
#if ROWS_PER_PASS == 12
#define PASS_ABOVE_8(T) PASS(T, 9) PASS(T, 10) PASS(T, 11) PASS(T, 12)
#elif ROWS_PER_PASS == 10
#define PASS_ABOVE_8(T) PASS(T, 9) PASS(T, 10)
#else
#define PASS_ABOVE_8(T)
#endif
#define PASSES(T)                                                                                            \
    switch (G) {                                                                                             \
        PASS(T, 1) PASS(T, 2) PASS(T, 3) PASS(T, 4) PASS(T, 5) PASS(T, 6) PASS(T, 7) PASS(T, 8) PASS_ABOVE_8(T) \
    }

typedef struct {
    int type;
    const uint8_t *w;
    int64_t K, row_bytes, S, ldy;
    const float *x;
    float *y;
} job;

#define PASSES_CASE(T) case T: PASSES(T); break;
static void columns(void *ctx, int64_t begin, int64_t end) {
    const job *j = ctx;
    const int type = j->type;
    const uint8_t *w = j->w;
    const int64_t K = j->K, row_bytes = j->row_bytes, S = j->S, ldy = j->ldy;
    const float *x = j->x;
    float *y = j->y;
    if (float_format(type)) {
        float_columns(type, w, K, row_bytes, x, S, y, ldy, begin, end);
        return;
    }
    for (int64_t n = begin; n < end; n++) {
        const uint8_t *row = w + n * row_bytes;
        for (int64_t s0 = 0; s0 < S; s0 += ROWS_PER_PASS) {
            const float *xs = x + s0 * K;
            float *ys = y + s0 * ldy + n;
            const int G = S - s0 < ROWS_PER_PASS ? (int)(S - s0) : ROWS_PER_PASS;
            switch (type) { /* each (type, G) pair compiles to its own loop */
                QUANT_FORMATS(PASSES_CASE)
            default: break; /* the float formats: float_columns */
            }
        }
    }
}

/* y[s * ldy + n] = Σ_k x[s * K + k] · W[n, k] for s < S, n < N. K must be a whole number of blocks;
 * `threads` split n (specdec/engine/csrc/workers.h). Returns 0, or -1 for an unknown type or a K that
 * is not a multiple of the block. */
int bq_matmul(int type, const uint8_t *w, int64_t N, int64_t K, const float *x, int64_t S, float *y, int64_t ldy,
              int threads) {
    if (block_weights(type) == 0 || K % block_weights(type)) return -1;
    job j = {type, w, K, K / block_weights(type) * block_bytes(type), S, ldy, x, y};
    parallel_for(threads, N, columns, &j);
    return 0;
}

/* The 32 values of a Q8_0, Q4_0, Q4_1, Q5_0 or Q5_1 block at b, V lanes at a time: d·q, or d·q + add (d·q exact,
 * then one rounding). */
static inline void legacy_values(const int type, const uint8_t *b, float *x) {
    if (type == Q8_0) {
        const vf d = splat(half_to_float(b));
        for (int l = 0; l < 32; l += V) {
            const vf v = to_float(widen_s8(b + 2 + l)) * d;
            memcpy(x + l, &v, sizeof v);
        }
        return;
    }
    float d, add;
    uint32_t high;
    const uint8_t *qs = legacy_block(type, b, &d, &add, &high);
    for (int l = 0; l < 16; l += V) {
        const vi q = widen_u8(qs + l);
        vi low = q & 15, upper = q >> 4;
        if (type == Q5_0 || type == Q5_1) { /* bit j of high: weight j's 5th */
            low |= ((((vi){0} + (int32_t)(high >> l)) >> lane_index()) & 1) << 4;
            upper |= ((((vi){0} + (int32_t)(high >> (16 + l))) >> lane_index()) & 1) << 4;
        }
        const vf a = to_float(low) * splat(d) + splat(add), c = to_float(upper) * splat(d) + splat(add);
        memcpy(x + l, &a, sizeof a);
        memcpy(x + 16 + l, &c, sizeof c);
    }
}

/* One block of W (at b) dequantized into ob: the exact values both kernels compute with. */
static void dequantize_block(const int type, const uint8_t *b, float *ob) {
    if (type == Q4_K || type == Q5_K) {
        const float d = half_to_float(b), dmin = half_to_float(b + 2);
        const uint8_t *qs = b + (type == Q5_K ? 48 : 16);
        for (int j = 0; j < 4; j++) {
            float s_lo, m_lo, s_hi, m_hi;
            q4_k_step_offset(b + 4, 2 * j, d, dmin, &s_lo, &m_lo);
            q4_k_step_offset(b + 4, 2 * j + 1, d, dmin, &s_hi, &m_hi);
            for (int l = 0; l < 32; l++) {
                const uint8_t q = qs[32 * j + l], h = type == Q5_K ? b[16 + l] : 0;
                ob[64 * j + l] = (float)((q & 15) | (((h >> (2 * j)) & 1) << 4)) * s_lo - m_lo;
                ob[64 * j + 32 + l] = (float)((q >> 4) | (((h >> (2 * j + 1)) & 1) << 4)) * s_hi - m_hi;
            }
        }
    } else if (type == Q6_K) {
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = half_to_float(b + 208);
        for (int c = 0; c < 2; c++)
            for (int l = 0; l < 32; l++) {
                const uint8_t a = b[64 * c + l], e = b[64 * c + 32 + l], hi = b[128 + 32 * c + l];
                const int q[4] = {(a & 15) | ((hi & 3) << 4), (e & 15) | (((hi >> 2) & 3) << 4),
                                  (a >> 4) | (((hi >> 4) & 3) << 4), (e >> 4) | (((hi >> 6) & 3) << 4)};
                for (int r4 = 0; r4 < 4; r4++)
                    ob[128 * c + 32 * r4 + l] = (d * (float)sc[8 * c + 2 * r4 + l / 16]) * (float)(q[r4] - 32);
            }
    } else if (type == Q3_K) {
        int8_t sc[16];
        q3_k_scales(b + Q3_K_SCALES, sc);
        const float d = half_to_float(b + Q3_K_D);
        for (int c = 0; c < 2; c++)
            for (int r = 0; r < 4; r++)
                for (int l = 0; l < 32; l++) {
                    const float s = d * (float)sc[8 * c + 2 * r + l / 16];
                    ob[128 * c + 32 * r + l] = s * (float)(q3_k_code(b, c, r, l) - 4);
                }
    } else if (type == Q2_K) {
        const float d = half_to_float(b + Q2_K_D), dmin = half_to_float(b + Q2_K_DMIN);
        for (int c = 0; c < 2; c++)
            for (int r = 0; r < 4; r++)
                for (int l = 0; l < 32; l++) {
                    float step, offset;
                    q2_k_step_offset(b, 8 * c + 2 * r + l / 16, d, dmin, &step, &offset);
                    ob[128 * c + 32 * r + l] = (float)q2_k_code(b, c, r, l) * step - offset;
                }
    } else if (type == IQ4_NL || type == IQ4_XS) {
        for (int j = 0; j < block_weights(type) / 32; j++) {
            const float s = iq4_scale(type, b, j);
            const uint8_t *qs = iq4_indices(type, b, j);
            for (int l = 0; l < 16; l++) {
                ob[32 * j + l] = s * (float)IQ4_VALUES[qs[l] & 15];
                ob[32 * j + 16 + l] = s * (float)IQ4_VALUES[qs[l] >> 4];
            }
        }
    } else if (type == Q8_0 || type == Q4_0 || type == Q4_1 || type == Q5_0 || type == Q5_1) {
        legacy_values(type, b, ob);
    } else { /* F32, F16 and BF16 */
        for (int l = 0; l < 16; l += V) {
            const vf v = load_values(type, b + value_bytes(type) * l);
            memcpy(ob + l, &v, sizeof v);
        }
    }
}

/* out[r, :] = the dequantized row ids[r] of W: the embedding lookup, and the kernel's weights for tests. */
int bq_dequantize_rows(int type, const uint8_t *w, int64_t K, const int64_t *ids, int64_t R, float *out) {
    if (block_weights(type) == 0 || K % block_weights(type)) return -1;
    const int64_t row_bytes = K / block_weights(type) * block_bytes(type);
    const int64_t per = block_weights(type), bytes = block_bytes(type);
    for (int64_t r = 0; r < R; r++)
        for (int64_t i = 0; i < K / per; i++)
            dequantize_block(type, w + ids[r] * row_bytes + i * bytes, out + r * K + i * per);
    return 0;
}

typedef uint8_t vbytes __attribute__((vector_size(V)));

/* The larger of a and b lane by lane (vectors of float type T, int type I: no NaN). */
#define LARGER(T, I, a, b) ((T)(((I)((a) > (b)) & (I)(a)) | ((I)((a) <= (b)) & (I)(b))))

/* The largest lane of a (no NaN), halves first, in registers. */
static inline float lanes_max(vf a) {
    typedef float v4f __attribute__((vector_size(16)));
    typedef int32_t v4i __attribute__((vector_size(16)));
#if V == 16
    typedef float v8f __attribute__((vector_size(32)));
    typedef int32_t v8i __attribute__((vector_size(32)));
    const v8f a0 = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7);
    const v8f a1 = __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
    const v8f h = LARGER(v8f, v8i, a0, a1);
#elif V == 8
    const vf h = a;
#endif
#if V >= 8
    const v4f b0 = __builtin_shufflevector(h, h, 0, 1, 2, 3), b1 = __builtin_shufflevector(h, h, 4, 5, 6, 7);
    const v4f q = LARGER(v4f, v4i, b0, b1);
#else
    const v4f q = a;
#endif
    const float c = q[0] > q[2] ? q[0] : q[2], e = q[1] > q[3] ? q[1] : q[3];
    return c > e ? c : e;
}

/* min(trunc(x·id + 8.5), 15) lane by lane (x·id + 8.5 is positive: the conversion truncates it). */
__attribute__((optimize("fp-contract=off"))) static inline vi codes_q4_0(vf x, float id) {
    const vi v = __builtin_convertvector(x * splat(id) + splat(8.5f), vi), over = v > 15;
    return (v & ~over) | (((vi){0} + 15) & over);
}

/* GGML's Q4_0 of 32 float32 values (18 bytes: float16 d, then q[l] | q[l + 16] << 4), as gguf-py quantizes: the
 * first value of largest magnitude m, d = m / −8, id = 1 / d (0 where d is 0), q = min(trunc(x·id + 8.5), 15),
 * each step rounded to float32 (no fused multiply-add), d rounded to float16 to nearest even. V lanes at a time:
 * x·id lies in [−8, 8], so x·id + 8.5 is positive and converting it to an integer truncates it. */
__attribute__((optimize("fp-contract=off"))) static void q4_0_of(const float *x, uint8_t *out) {
    const vi magnitude_bits = (vi){0} + 0x7fffffff;
    vf most = splat(0.0f);
    for (int l = 0; l < 32; l += V) {
        const vf a = (vf)((vi)load_f32(x + l) & magnitude_bits);
        most = LARGER(vf, vi, a, most);
    }
    const float amax = lanes_max(most);
    float m = x[0]; /* numpy's argmax: the first of largest magnitude (of a block of ±0, x[0]); no branch */
    for (int l = 31; l >= 0; l--) m = __builtin_fabsf(x[l]) == amax ? x[l] : m;
    const float d = m / -8.0f, id = d == 0.0f ? 0.0f : 1.0f / d;
    const _Float16 h = (_Float16)d;
    memcpy(out, &h, 2);
    for (int l = 0; l < 16; l += V) { /* q[l] | q[l + 16] << 4 */
        const vi low = codes_q4_0(load_f32(x + l), id), upper = codes_q4_0(load_f32(x + 16 + l), id);
        const vbytes packed = __builtin_convertvector(low | upper << 4, vbytes);
        memcpy(out + 2 + l, &packed, sizeof packed);
    }
}

/* W [N, K] (type's blocks of 32 weights) as GGML's Q4_0 of its exact values, into out [N, K / 32 · 18]: what
 * gguf-py's quantizer gives the dequantized rows, without them. Returns 0, or -1 for another type or a K that is
 * not a whole number of blocks. */
int bq_requantize_q4_0(int type, const uint8_t *w, int64_t N, int64_t K, uint8_t *out) {
    if (block_weights(type) != 32 || K % 32) return -1;
    const int64_t blocks = N * (K / 32);
    const int legacy = type == Q8_0 || type == Q4_0 || type == Q4_1 || type == Q5_0 || type == Q5_1;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < blocks; i++) {
        float x[32];
        if (legacy) /* inlined here: through dequantize_block's call, 1.7x the time */
            legacy_values(type, w + i * block_bytes(type), x);
        else
            dequantize_block(type, w + i * block_bytes(type), x);
        q4_0_of(x, out + i * 18);
    }
    return 0;
}

#include "iq3_s.h"
