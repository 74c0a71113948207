/* y[S, N] = x[S, K] · W[N, K]ᵀ with W in a GGML block format and x quantized to 8 bits per row: the
 * "gguf-q8" compute path. Integer dot products, like llama.cpp's, with a definition of our own.
 *
 * Definition (specdec/engine/cpu/q8dot.py states it in one sentence; tests/test_q8dot.py transcribes it):
 * - Activations: each row in blocks of 32 values; dx = amax / 127, u = round-half-even(x · (127 / amax))
 *   clamped to ±127 (all zero where amax is 0).
 * - Weights: integers q. Per block j of 32 weights the integer sum I is exact: Σ q·u for Q4_K and Q8_0,
 *   Σ (q − 16)·u for Q5_0, Σ (q − 8)·u for Q4_0, and for Q6_K sc₁·Σ₁ (q − 32)·u + sc₂·Σ₂ (q − 32)·u over its
 *   two 16-weight halves with their int8 scales. The block's float scale s is d·sc for Q4_K, d for the others
 *   (exact in float32), and Q4_K's min m = dmin·min.
 * - Float steps, each rounded to float32, no fused multiply-add: t = (s·dx)·I, minus m·(dx·Σu) for Q4_K;
 *   block j feeds accumulator j mod 16 in order (acc += t); y = the 16 accumulators summed by halves
 *   ((a[i] + a[i + 8]), then + 4, + 2, + 1).
 * Every output is that fixed sequence whatever the rows beside it: the path is row-invariant.
 *
 * Layout: q8unit.h. Each weight unit is unpacked once per pass and dotted with every row in it; a unit's
 * BLOCKS terms are one vector of float steps a row.
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
#if !defined(Q8_PORTABLE)
#include <immintrin.h>
#endif

/* ---- the integer dot of a unit's weights (u8) with its activations (s8), block by block, per level ---- */
#if defined(Q8_PORTABLE)
#elif CHUNK == 64
#define NATIVE 64
typedef __m512i nv;
#define NV_LOAD(p) _mm512_loadu_si512((const void *)(p))
#define MADD16(a, b) _mm512_madd_epi16(a, b)
#define NV_ABS(q) _mm512_abs_epi8(q)
#define NV_SIGN_OF(q) _mm512_movm_epi8(_mm512_movepi8_mask(q)) /* −1 where q < 0 */
#define NV_SIGN(x, s) _mm512_sub_epi8(_mm512_xor_si512(x, s), s)
#ifdef __AVX512VNNI__
#define DP(acc, w, x) _mm512_dpbusd_epi32(acc, w, x)
#else /* AVX-512BW without VNNI: AVX2's instructions on 64 bytes */
#define PAIRS(w, x) _mm512_maddubs_epi16(w, x)
#define ADD16(a, b) _mm512_add_epi16(a, b)
#define ADD32(a, b) _mm512_add_epi32(a, b)
#define SPLAT16(v) _mm512_set1_epi16(v)
#endif
#elif defined(__AVXVNNI__)
#define NATIVE 32
typedef __m256i nv;
#define NV_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define DP(acc, w, x) _mm256_dpbusd_avx_epi32(acc, w, x)
#define MADD16(a, b) _mm256_madd_epi16(a, b)
#define NV_ABS(q) _mm256_abs_epi8(q)
#define NV_SIGN_OF(q) (q)
#define NV_SIGN(x, s) _mm256_sign_epi8(x, s) /* x where s > 0, −x where s < 0, 0 where s = 0 (then |q| is 0) */
#elif defined(__AVX2__)
#define NATIVE 32
typedef __m256i nv;
#define NV_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define PAIRS(w, x) _mm256_maddubs_epi16(w, x) /* int16 sums of byte pairs */
#define ADD16(a, b) _mm256_add_epi16(a, b)
#define ADD32(a, b) _mm256_add_epi32(a, b)
#define MADD16(a, b) _mm256_madd_epi16(a, b)
#define SPLAT16(v) _mm256_set1_epi16(v)
#define NV_ABS(q) _mm256_abs_epi8(q)
#define NV_SIGN_OF(q) (q)
#define NV_SIGN(x, s) _mm256_sign_epi8(x, s)
#elif defined(__SSE4_1__)
#define NATIVE 16
typedef __m128i nv;
#define NV_LOAD(p) _mm_loadu_si128((const __m128i *)(p))
#define PAIRS(w, x) _mm_maddubs_epi16(w, x)
#define ADD16(a, b) _mm_add_epi16(a, b)
#define ADD32(a, b) _mm_add_epi32(a, b)
#define MADD16(a, b) _mm_madd_epi16(a, b)
#define SPLAT16(v) _mm_set1_epi16(v)
#define NV_ABS(q) _mm_abs_epi8(q)
#define NV_SIGN_OF(q) (q)
#define NV_SIGN(x, s) _mm_sign_epi8(x, s)
#endif

#ifdef NATIVE
enum { RANGES = CHUNK / NATIVE, NVS = 8 * RANGES }; /* native vectors a chunk, and a unit */

static inline vli vli_of(const nv *pieces) {
    vli v;
    memcpy(&v, pieces, CHUNK);
    return v;
}

/* Lane l: block l's integer sum over the 8 chunks; with `sign` (0 or −1 a byte) u's bytes are negated where
 * sign is −1 first. Without VNNI, with `scale` (Q6_K), chunks 0-3 (the first halves) weigh scale[0] and
 * chunks 4-7 scale[1] (with VNNI Q6_K takes unit_halves), and `sums16` chunks' int16 pair sums are added in
 * int16 before widening: the caller's weight bound keeps them exact, sums16 · 2 · max|w| · 127 ≤ 32767, and
 * sums16 divides 4 where there is a scale. */
static inline __attribute__((always_inline)) vli unit_dot(const nv *w, const nv *sign, const int8_t *u, int sums16,
                                                          const vli *scale) {
#ifdef PAIRS
    nv acc[RANGES], mult[2][RANGES];
    for (int r = 0; r < RANGES; r++) acc[r] = SPLAT16(0);
    if (scale) {
        memcpy(mult[0], &scale[0], CHUNK);
        memcpy(mult[1], &scale[1], CHUNK);
    } else {
        for (int r = 0; r < RANGES; r++) mult[0][r] = mult[1][r] = SPLAT16(1);
    }
    for (int r = 0; r < RANGES; r++)
        for (int c0 = 0; c0 < 8; c0 += sums16) {
            nv pairs;
            for (int k = 0; k < sums16; k++) {
                const int v = (c0 + k) * RANGES + r;
                const nv x = sign ? NV_SIGN(NV_LOAD(u + v * NATIVE), sign[v]) : NV_LOAD(u + v * NATIVE);
                pairs = k ? ADD16(pairs, PAIRS(w[v], x)) : PAIRS(w[v], x);
            }
            acc[r] = ADD32(acc[r], MADD16(pairs, mult[c0 >= 4][r]));
        }
    return vli_of(acc);
#else
    (void)sums16, (void)scale; /* Q6_K goes through unit_halves */
    nv acc;
    memset(&acc, 0, sizeof acc);
    for (int c = 0; c < 8; c++)
        acc = DP(acc, w[c], sign ? NV_SIGN(NV_LOAD(u + c * NATIVE), sign[c]) : NV_LOAD(u + c * NATIVE));
    return vli_of(&acc);
#endif
}

#ifndef PAIRS
/* With VNNI, Q6_K: half[h] += lane l's dot over the chunks of block l's half h (0-3, then 4-7). */
static inline __attribute__((always_inline)) void unit_halves(const nv *w, const int8_t *u, vli *half) {
    nv acc[2];
    memcpy(acc, half, sizeof acc);
    for (int c = 0; c < 8; c++) acc[c >= 4] = DP(acc[c >= 4], w[c], NV_LOAD(u + c * NATIVE));
    memcpy(half, acc, sizeof acc);
}
#endif

static inline void load_weights(nv *w, const uint8_t *bytes) {
    for (int v = 0; v < NVS; v++) w[v] = NV_LOAD(bytes + v * NATIVE);
}

/* Signed int8 weights as |q| (the unsigned operand) and what moves their sign onto the activations. */
static inline void load_signed_weights(nv *w, nv *sign, const int8_t *q) {
    for (int v = 0; v < NVS; v++) {
        const nv x = NV_LOAD(q + v * NATIVE);
        w[v] = NV_ABS(x);
        sign[v] = NV_SIGN_OF(x);
    }
}

#ifdef PAIRS
/* Per 32-bit lane, the two int16 products summed: a₀·b₀ + a₁·b₁. */
static inline vli madd_pairs(vli a, vli b) {
    nv x[RANGES], y[RANGES];
    memcpy(x, &a, CHUNK);
    memcpy(y, &b, CHUNK);
    for (int r = 0; r < RANGES; r++) x[r] = MADD16(x[r], y[r]);
    return vli_of(x);
}
#endif
#ifdef PAIRS
#define LEVEL_NAME (NATIVE == 64 ? "avx512" : NATIVE == 16 ? "sse4.1" : "avx2")
#else
#define LEVEL_NAME (NATIVE == 64 ? "avx512-vnni" : "avx-vnni")
#endif
#else /* portable C */
typedef uint8_t nv;
enum { NVS = UNIT };
static inline void unit_halves(const nv *w, const int8_t *u, vli *half) {
    for (int k = 0; k < UNIT; k++) half[k / CHUNK >= 4][(k % CHUNK) / 4] += (int32_t)w[k] * u[k];
}
static inline __attribute__((always_inline)) vli unit_dot(const nv *w, const nv *sign, const int8_t *u, int sums16,
                                                          const vli *scale) {
    (void)sums16, (void)scale;
    vli out = {0};
    for (int k = 0; k < UNIT; k++) out[(k % CHUNK) / 4] += (int32_t)w[k] * (sign && sign[k] ? -u[k] : u[k]);
    return out;
}
static inline void load_weights(nv *w, const uint8_t *bytes) { memcpy(w, bytes, UNIT); }
static inline void load_signed_weights(nv *w, nv *sign, const int8_t *q) {
    for (int k = 0; k < UNIT; k++) {
        w[k] = (uint8_t)(q[k] < 0 ? -q[k] : q[k]);
        sign[k] = q[k] < 0;
    }
}
#define LEVEL_NAME "portable"
#endif
#if defined(PAIRS) != SCALE_PAIRS
#error "q8unit.h's SCALE_PAIRS disagrees with the level this build chose"
#endif

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

/* cb bytes at p (CHUNK, or CHUNK / 2 for a half unit), the rest of the chunk zero. With AVX-512 a half unit's by
 * one 32-byte load: through memory (a copy into a zeroed vector) each cost a store-forwarding stall. */
static inline __attribute__((always_inline)) vw load_chunk(const uint8_t *p, int cb) {
    vw v = {0};
#if CHUNK == 64
    if (cb == CHUNK / 2) {
        const __m512i loaded = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)p));
        memcpy(&v, &loaded, CHUNK);
        return v;
    }
#endif
    memcpy(&v, p, cb);
    return v;
}

/* Chunk 2h + high's 4-bit quants, from the nibble bytes of half h at p. */
static inline vw nibbles(const uint8_t *p, int high, int cb) {
    return (high ? load_chunk(p, cb) >> 4 : load_chunk(p, cb)) & BYTES(15);
}

/* The unit's BLOCKS bytes at p (unsigned), one a lane, as int32. */
static inline vli byte_lanes(const uint8_t *p) {
    vli out;
#if CHUNK == 64
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    memcpy(&out, &v, 64);
#elif defined(__AVX2__)
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    memcpy(&out, &v, 32);
#else
    for (int l = 0; l < BLOCKS; l++) out[l] = p[l];
#endif
    return out;
}

/* 2 · BLOCKS int8 at p as int16, two a lane (Q6_K's half scales of each block). */
static inline vli byte_pairs(const int8_t *p) {
    vli out;
#if CHUNK == 64
    const __m512i v = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p));
    memcpy(&out, &v, 64);
#elif defined(__AVX2__)
    const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    memcpy(&out, &v, 32);
#else
    for (int l = 0; l < BLOCKS; l++) out[l] = (int32_t)((uint32_t)(uint16_t)p[2 * l] | (uint32_t)(uint16_t)p[2 * l + 1] << 16);
#endif
    return out;
}

/* BLOCKS float16 scales at p, one a lane; of a half unit (`half`), the first 8 and zeros. */
static inline vl half_lanes(const uint8_t *p, int half) {
    vl out;
    (void)half; /* the 32-byte chunk builds have no half units */
#if CHUNK == 64
    const __m512 f = half ? _mm512_zextps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)))
                          : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    memcpy(&out, &f, 64);
#elif defined(__F16C__)
    const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    memcpy(&out, &f, 32);
#else
    for (int l = 0; l < BLOCKS; l++) out[l] = half_to_float(p + 2 * l);
#endif
    return out;
}

/* Lane l: the float16 at p + 2 · (l / 8), its super-block's (8 blocks a super-block); of a half unit, one. */
static inline vl superblock_lanes(const uint8_t *p, int half) {
    vl out;
#if CHUNK == 64 /* two super-blocks a unit: both converted at once, then 8 lanes each by one permutation (GCC
                 * built it from 8 masked broadcasts; on a Zen 4, cached, a Q4_K unit at one row 0.83x the time) */
    uint32_t pair;
    memcpy(&pair, p, 4);
    if (half) pair &= 0xffff; /* one super-block: the other lanes +0 */
    const __m512 f = _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                           _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)pair))));
    memcpy(&out, &f, 64);
#else
    (void)half;
    out = (vl){0} + half_to_float(p);
#endif
    return out;
}

/* What one unit of a weight row needs, unpacked once per pass. */
typedef struct {
    nv w[NVS], sign[NVS]; /* sign: Q8_0 only */
    vl s, m;              /* the blocks' scales, and Q4_K's mins */
    vli scale[2];         /* Q6_K without VNNI: the half scales as unit_dot takes them */
    vli scale_pairs;      /* Q6_K without VNNI: (sc₁, sc₂) as int16, for the offset's Σ sc·Σu */
    vl half_scale[2];     /* Q6_K with VNNI: sc₁ and sc₂ as floats */
} unit_weights;

/* Chunk c's weights as unsigned bytes, of the unit at o (of sbu super-blocks, chunks of cb bytes: a half unit
 * if cb is CHUNK / 2, whose lanes past 8 read other bytes, finite, against zero activations); not Q8_0. */
static inline __attribute__((always_inline)) vw weight_chunk(const int type, const uint8_t *o, const int c,
                                                             const int sbu, const int cb) {
    if (type == Q4_K) return nibbles(o + 20 * sbu + cb * (c / 2), c % 2, cb);
    if (type == Q6_K) {
        const uint8_t *high = o + 18 * sbu + 4 * cb;
        return nibbles(o + 18 * sbu + cb * (c / 2), c % 2, cb) |
               (((load_chunk(high + cb * (c / 4), cb) >> (2 * (c % 4))) & BYTES(3)) << 4);
    }
    const vw low = nibbles(o + 16 * sbu + cb * (c / 2), c % 2, cb); /* Q4_0's codes, Q5_0's low four bits */
    if (type == Q4_0) return low;
    const int per_word = 64 / cb; /* Q5_0's fifth bits */
    vw lane;
    for (int i = 0; i < CHUNK / 8; i++) lane[i] = i;
    uint64_t word;
    memcpy(&word, o + 16 * sbu + 4 * cb + 8 * (c / per_word), 8);
    const vw shift = lane + (uint64_t)((cb / 8) * (c % per_word));
    return low | ((((vw){0} + word) >> shift) & BYTES(1)) << 4;
}

/* The scales of the unit at o (a half unit if `half`): s, and m, scale, scale_pairs or half_scale by type. */
static inline __attribute__((always_inline)) void unpack_scales(const int type, const uint8_t *o, unit_weights *u,
                                                                const int half) {
    const int sbu = half ? 1 : SB_PER_UNIT;
    if (type == Q4_K) { /* a half unit's lanes past 8 read the mins' and quants' bytes: finite, against zeros */
        u->s = __builtin_convertvector(byte_lanes(o + 4 * sbu), vl) * superblock_lanes(o, half);           /* d · sc */
        u->m = __builtin_convertvector(byte_lanes(o + 12 * sbu), vl) * superblock_lanes(o + 2 * sbu, half); /* dmin · m */
    } else if (type == Q6_K) {
        u->s = superblock_lanes(o, half);
        const vli pairs = byte_pairs((const int8_t *)o + 2 * sbu);
        u->scale_pairs = pairs;
        if (SCALE_PAIRS) { /* (sc₁, sc₁) and (sc₂, sc₂) a lane */
            u->scale[0] = (vli)(((vlu)pairs & 0xffff) | ((vlu)pairs << 16));
            u->scale[1] = (vli)(((vlu)pairs & 0xffff0000u) | ((vlu)pairs >> 16));
        } else { /* the sign-extended int16s */
            u->half_scale[0] = __builtin_convertvector((vli)((vlu)pairs << 16) >> 16, vl);
            u->half_scale[1] = __builtin_convertvector(pairs >> 16, vl);
        }
    } else { /* Q5_0, Q4_0 and Q8_0 */
        u->s = half_lanes(o, half);
    }
}

/* The unit at o (a half unit if `half`: its lanes past 8 hold zero weights, and scales that are finite) */
static inline __attribute__((always_inline)) void unpack_unit(const int type, const uint8_t *o, unit_weights *u,
                                                              const int half) {
    const int sbu = half ? 1 : SB_PER_UNIT, cb = half ? CHUNK / 2 : CHUNK;
    uint8_t bytes[UNIT] __attribute__((aligned(64)));
    unpack_scales(type, o, u, half);
    if (type == Q8_0) { /* |q| is the unsigned operand, and q's sign moves onto the activations */
        if (!half) {
            load_signed_weights(u->w, u->sign, (const int8_t *)o + 16 * sbu);
            return;
        }
        for (int c = 0; c < 8; c++) {
            const vw q = load_chunk(o + 16 * sbu + cb * c, cb);
            memcpy(bytes + CHUNK * c, &q, CHUNK);
        }
        load_signed_weights(u->w, u->sign, (const int8_t *)bytes);
        return;
    }
    for (int c = 0; c < 8; c++) {
        const vw q = weight_chunk(type, o, c, sbu, cb);
        memcpy(bytes + CHUNK * c, &q, CHUNK);
    }
    load_weights(u->w, bytes);
}

/* A unit's terms t (its BLOCKS lanes) into accumulators [BLOCKS · part, BLOCKS · (part + 1)) of acc. */
static inline vacc acc_add_unit(vacc a, vl t, int part) {
#if CHUNK == 64 /* a unit is the 16 accumulators */
    (void)part;
    return acc_add(a, t);
#else
    enum { PER_UNIT = CHUNK / PIECE_BYTES };
    vpiece p[PER_UNIT];
    memcpy(p, &t, CHUNK);
    for (int i = 0; i < PER_UNIT; i++) a.p[part * PER_UNIT + i] += p[i];
    return a;
#endif
}

enum { MAX_ROWS = 16 };

/* A unit's terms against activation row x from its exact block sums: (s·dx)·I, less m·(dx·Σu) for Q4_K. */
static inline __attribute__((always_inline)) vl float_steps(const int type, const unit_weights *u, vl exact,
                                                            const act_unit *x) {
    vl dx;
    memcpy(&dx, x->dx, CHUNK);
    vl term = (u->s * dx) * exact;
    if (type == Q4_K) {
        vl dx_bsum;
        memcpy(&dx_bsum, x->dx_bsum, CHUNK);
        term = term - u->m * dx_bsum;
    }
    return term;
}

/* Q6_K's block sums I from its two half sums (each started at −32·Σu), with VNNI and in portable C:
 * sc₁·I₁ + sc₂·I₂ in float32, exact: |sc·I| ≤ 128 · 16 · 32 · 127 and the sum < 2^24. */
static inline vl q6_k_halves_sum(const unit_weights *u, vli first, vli second) {
    return __builtin_convertvector(first, vl) * u->half_scale[0] +
           __builtin_convertvector(second, vl) * u->half_scale[1];
}

/* Q5_0's and Q4_0's block sums I from Σ q·u: less 16 · Σu or 8 · Σu, their codes being q − 16 and q − 8 (a
 * shift, unsigned: defined for negative sums); the other formats' as they are. */
static inline vli centred(const int type, vli dot, const act_unit *x) {
    if (type != Q5_0 && type != Q4_0) return dot;
    vli sums;
    memcpy(&sums, x->bsum, CHUNK);
    return dot - (vli)((vlu)sums << (type == Q5_0 ? 4 : 3));
}

/* Chunks whose int16 pair sums are added in int16 before widening (see unit_dot): max |w| is 15 for Q4_K and Q4_0,
 * 31 for Q5_0, 63 for Q6_K, 128 for Q8_0. */
static inline int sums16_of(const int type) {
    return type == Q4_K || type == Q4_0 ? 8 : type == Q5_0 ? 4 : type == Q6_K ? 2 : 1;
}

/* The terms of a unit against activation row x from unit_dot's sums: I as floats, then the float steps. */
static inline __attribute__((always_inline)) vl dot_terms(const int type, const unit_weights *u, vli dot,
                                                          const act_unit *x) {
#if SCALE_PAIRS
    if (type == Q6_K) { /* less 32 · (sc₁·Σ₁u + sc₂·Σ₂u); a shift, unsigned: defined for negative sums */
        vli sums;
        memcpy(&sums, x->halves, CHUNK);
        dot -= (vli)((vlu)madd_pairs(sums, u->scale_pairs) << 5);
    }
#endif
    return float_steps(type, u, __builtin_convertvector(centred(type, dot, x), vl), x);
}

/* The terms of one unpacked unit against one activation row x: its BLOCKS lanes. */
static inline __attribute__((always_inline)) vl unit_terms(const int type, const unit_weights *u, const act_unit *x) {
#if !SCALE_PAIRS
    if (type == Q6_K) {
        vli half[2];
        memcpy(half, x->half_start, sizeof half);
        unit_halves(u->w, x->u, half);
        return float_steps(type, u, q6_k_halves_sum(u, half[0], half[1]), x);
    }
#endif
    return dot_terms(type, u, unit_dot(u->w, type == Q8_0 ? u->sign : 0, x->u, sums16_of(type),
                                       type == Q6_K ? u->scale : 0), x);
}

/* One unit of one weight row (a half unit if `half`) against G activation rows: acc[g] += its terms, at
 * accumulators `part`. */
static inline __attribute__((always_inline)) void unit(const int type, const uint8_t *o, const act_unit *a,
                                                       int64_t lda, vacc *acc, int G, int part, const int half) {
    unit_weights u;
    unpack_unit(type, o, &u, half);
    for (int g = 0; g < G; g++) acc[g] = acc_add_unit(acc[g], unit_terms(type, &u, a + g * lda), part);
}

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

static inline __attribute__((always_inline)) void unit_group_by_chunk(const int type, const uint8_t *o, const act_unit *a,
                                                                int64_t lda, vacc *acc, int G, int part) {
    unit_weights u;
    unpack_scales(type, o, &u, 0);
    const int sums16 = sums16_of(type);
    nv mult[2], pairs[MAX_ROWS], dot[MAX_ROWS];
    if (type == Q6_K) memcpy(mult, u.scale, sizeof mult);
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
    return type != Q8_0 && G >= 2 && G <= (sums16_of(type) == 8 ? BY_CHUNK_ROWS : BY_CHUNK_ROWS_WIDENED);
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
 * passes 0.89-0.96x (11-16 rows level, so not taken). Not at one row (1.0-1.08x; chunk by chunk with shared loads
 * 1.27-1.37x slower on gate/up and the output layer at both threads); not for Q8_0, whose weights take twice the
 * registers (their signs; 1.0-1.23x). AVX-512 only: with AVX2's 16 registers the spills made it 1.3-3x slower.
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

#ifndef PAIRS
/* One unit of two weight rows (at o and o + other) against G ≤ PAIR_ROWS activation rows, chunk by chunk: each
 * weight chunk unpacked into one register per weight row and each activation chunk loaded into one register for
 * both, so that 2·G integer sums and 2·G accumulators fit in the 32 registers at up to 7 rows (Q6_K's first
 * halves take 2·G more: from 6 rows their accumulators stay in memory; whole units, 16 registers of weights,
 * spill there). acc0[g] and acc1[g] += their terms. */
static inline __attribute__((always_inline)) void unit_pair_by_chunk(const int type, const uint8_t *o, int64_t other,
                                                                     const act_unit *a, int64_t lda, vacc *acc0,
                                                                     vacc *acc1, int G) {
    unit_weights u[2];
    unpack_scales(type, o, &u[0], 0);
    unpack_scales(type, o + other, &u[1], 0);
    nv dot[2][PAIR_ROWS], first[2][PAIR_ROWS]; /* first: Q6_K's first halves */
    for (int g = 0; g < G; g++)
        for (int r = 0; r < 2; r++) dot[r][g] = type == Q6_K ? NV_LOAD(a[g * lda].half_start[0]) : _mm512_setzero_si512();
#pragma GCC unroll 8 /* as GCC unrolls it without the barrier below */
    for (int c = 0; c < 8; c++) {
        if (type == Q6_K && c == 4) /* the first halves done, the second ones start */
            for (int g = 0; g < G; g++)
                for (int r = 0; r < 2; r++) {
                    first[r][g] = dot[r][g];
                    dot[r][g] = NV_LOAD(a[g * lda].half_start[1]);
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
    for (int g = 0; g < G; g++) /* each block sum I as unit_terms finishes it */
        for (int r = 0; r < 2; r++) {
            const act_unit *x = a + g * lda;
            vli sum;
            memcpy(&sum, &dot[r][g], CHUNK);
            vl exact = __builtin_convertvector(centred(type, sum, x), vl);
            if (type == Q6_K) {
                vli first_half;
                memcpy(&first_half, &first[r][g], CHUNK);
                exact = q6_k_halves_sum(&u[r], first_half, sum);
            }
            const vl t = float_steps(type, &u[r], exact, x);
            if (r == 0) acc0[g] = acc_add(acc0[g], t);
            else acc1[g] = acc_add(acc1[g], t);
        }
}
#endif
#endif

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
 * AVX-512 only Q8_0 goes in chunks: the other formats' passes that would go in chunks go over two weight rows
 * at once, on whole rows (`paired`; on a Zen 4 the down projections at 5 rows 0.65-0.68x the time of chunks).
 * With AVX2, whose units go chunk by chunk (UNIT_BY_CHUNK), only from 128 KiB: on the Zen 4 capped at AVX2, the
 * down projections at 5-9 rows then took 0.75-0.84x the time of chunks, passes of 5-9 tokens 0.87-0.95x; from
 * 256 KiB, level at 5-9 and 0.89-0.93x at 12-16 rows, but past the L2 of some AVX2 CPUs (256 KiB). */
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
    switch (type) {
    case Q4_K: unit(Q4_K, o, a, lda, acc, G, 0, 1); break;
    case Q6_K: unit(Q6_K, o, a, lda, acc, G, 0, 1); break;
    case Q5_0: unit(Q5_0, o, a, lda, acc, G, 0, 1); break;
    case Q4_0: unit(Q4_0, o, a, lda, acc, G, 0, 1); break;
    default: unit(Q8_0, o, a, lda, acc, G, 0, 1); break;
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

#if CHUNK == 64
/* Two whole weight rows, at row and row + other (`far` rows on), each ending in a half unit if `tail`,
 * against G activation rows (2 ≤ G ≤ PAIR_ROWS): y[g * ldy] and y[g * ldy + far], each unit chunk by chunk if
 * `by_chunk` (`pair_by_chunk`). Each row's stream is prefetched as row_pass prefetches a whole row's. */
static inline __attribute__((always_inline)) void row_pair_pass(const int type, const uint8_t *row, int64_t other,
                                                                int64_t far, int tail, int64_t nu, const act_unit *a,
                                                                float *y, int64_t ldy, const float *bias, int G,
                                                                const int by_chunk) {
    vacc acc0[PAIR_ROWS], acc1[PAIR_ROWS];
    (void)by_chunk; /* whole units only without VNNI */
    for (int g = 0; g < G; g++) acc0[g] = acc1[g] = acc_of(splat(0.0f));
    const int64_t bytes = unit_bytes(type), end = tail ? nu - 1 : nu;
    for (int64_t i = 0; i < end; i++) { /* a unit is the 16 accumulators */
        prefetch_ahead(type, row, i);
        prefetch_ahead(type, row + other, i);
#ifndef PAIRS
        if (by_chunk) {
            /* Q6_K's first halves take 2·G registers more: from 6 rows the accumulators stay in memory */
            if (type == Q6_K && G > PAIR_Q6_K_IN_REGISTERS) __asm__("" : "+m"(acc0), "+m"(acc1));
            unit_pair_by_chunk(type, row + i * bytes, other, a + i, nu, acc0, acc1, G);
            continue;
        }
#endif
        unit_pair(type, row + i * bytes, other, a + i, nu, acc0, acc1, G);
    }
    if (tail) {
        last_unit(type, row + end * bytes, a + end, nu, acc0, G);
        last_unit(type, row + other + end * bytes, a + end, nu, acc1, G);
    }
    store_rows(acc0, G, y, ldy, bias);
    store_rows(acc1, G, y + far, ldy, bias ? bias + far : 0);
}

/* Whether a pair's units against G rows of nu units go chunk by chunk (above). */
static inline int pair_by_chunk(int G, int64_t nu) {
#ifdef PAIRS
    (void)G, (void)nu;
    return 0;
#else
    return G > UNIT_PAIR_ROWS || (G >= PAIR_BY_CHUNK_FROM && G * nu * (int64_t)sizeof(act_unit) <= PAIR_BY_CHUNK_L1);
#endif
}

#define PAIR_PASS_AS(T, G, BY_CHUNK) \
    row_pair_pass(T, j->w + n * j->row_bytes, far * j->row_bytes, far, j->tail, j->nu, j->a + g0 * j->nu, \
                  j->out + g0 * j->ldy + n, j->ldy, j->bias ? j->bias + n : 0, G, BY_CHUNK)
#define PAIR_PASS(T, G) \
    case G: \
        if (pair_by_chunk(G, j->nu)) PAIR_PASS_AS(T, G, 1); \
        else PAIR_PASS_AS(T, G, 0); \
        break;
#ifndef PAIRS /* PAIR_ROWS 7 */
#define PAIR_PASSES(T) \
    switch (g) { PAIR_PASS(T, 2) PAIR_PASS(T, 3) PAIR_PASS(T, 4) PAIR_PASS(T, 5) PAIR_PASS(T, 6) PAIR_PASS(T, 7) }
#else
#define PAIR_PASSES(T) \
    switch (g) { PAIR_PASS(T, 2) PAIR_PASS(T, 3) PAIR_PASS(T, 4) }
#endif
#endif

#define PASS(T, G) \
    case G: row_pass(T, j->w + n * j->row_bytes, j->row_bytes, j->tail, i0, i1, j->nu, j->a, kept, j->out + n, j->ldy, \
                     j->bias ? j->bias + n : 0, G); break;
#define PASSES(T) \
    switch (G) { \
        PASS(T, 1) PASS(T, 2) PASS(T, 3) PASS(T, 4) PASS(T, 5) PASS(T, 6) PASS(T, 7) PASS(T, 8) \
        PASS(T, 9) PASS(T, 10) PASS(T, 11) PASS(T, 12) PASS(T, 13) PASS(T, 14) PASS(T, 15) PASS(T, 16) \
    }

/* Whether a pass of G rows of this format, in chunks of `chunk` of its nu units, goes over two weight rows at
 * once (then over whole rows). */
static inline int paired(int type, int G, int64_t chunk, int64_t nu) {
#if CHUNK == 64
    return type != Q8_0 && G >= 2 && (G <= PAIR_MAX_ROWS || chunk < nu);
#else
    (void)type, (void)G, (void)chunk, (void)nu;
    return 0;
#endif
}

/* G rows against columns of W, the units in chunks of `chunk`: what the workers split by columns. */
typedef struct {
    int type, G, tail, pairs; /* tail: rows end in a half unit; pairs: two weight rows at once (whole rows) */
    const uint8_t *w;
    int64_t row_bytes, chunk, nu, ldy;
    const act_unit *a;
    float *out;
    const float *bias;
    int out_of_memory; /* set by a worker that found no memory for its accumulators: q8_matmul returns -2 */
} job;

/* Columns a worker takes through every chunk before the next ones: their accumulators between chunks stay
 * in this thread's cache (COLUMN_BLOCK · G vectors), where one pass per chunk over all N columns kept N · G
 * of them in memory (at 13-16 rows a 1536-wide Q4_K matrix of 107,520 columns ran 2x slower than unchunked). */
enum { COLUMN_BLOCK = 16 };

#if CHUNK == 64
/* Columns n and n + far for n in [begin, begin + far), two at once (`paired`), in groups of at most PAIR_ROWS
 * activation rows. Out of line: inlined in `columns`, the same code ran the 1.5B target's passes of 2-4
 * tokens 1.02-1.07x slower (three runs of `specdec bench --kernel-ab`; out of line 1.00-1.01x, as before groups). */
static __attribute__((noinline)) void pair_columns(const job *j, int64_t begin, int64_t far) {
    const int G = j->G, groups = (G + PAIR_ROWS - 1) / PAIR_ROWS;
    for (int64_t n = begin; n < begin + far; n++) {
        for (int k = 0, g0 = 0; k < groups; k++) {
            const int g = (G - g0) / (groups - k);
            switch (j->type) {
            case Q4_K: PAIR_PASSES(Q4_K); break;
            case Q6_K: PAIR_PASSES(Q6_K); break;
            case Q5_0: PAIR_PASSES(Q5_0); break;
            default: PAIR_PASSES(Q4_0); break;
            }
            g0 += g;
        }
    }
}
#endif

static void columns(void *ctx, int64_t begin, int64_t end) {
    job *j = ctx;
    const int G = j->G;
#if CHUNK == 64
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
            for (int64_t n = b0; n < b1; n++) {
                vacc *kept = keep ? keep + (n - b0) * G : 0;
                switch (j->type) { /* each (type, G) pair compiles to its own loop, its accumulators in registers */
                case Q4_K: PASSES(Q4_K); break;
                case Q6_K: PASSES(Q6_K); break;
                case Q5_0: PASSES(Q5_0); break;
                case Q4_0: PASSES(Q4_0); break;
                default: PASSES(Q8_0); break;
                }
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
