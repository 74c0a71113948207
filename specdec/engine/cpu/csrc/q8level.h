/* The gguf-q8 kernel's vocabulary per level: its native vectors, the integer dot of a unit's weights (u8) with
 * its activations (s8), and how a unit's weights load. Part of q8dot.c's translation unit (after q8unit.h),
 * which each level's build compiles with its own flags (specdec/engine/cpu/native.py). */
#ifndef SPECDEC_Q8LEVEL_H
#define SPECDEC_Q8LEVEL_H

#if !defined(Q8_PORTABLE)
#include <immintrin.h>
#endif

/* ---- the integer dot of a unit's weights (u8) with its activations (s8), block by block, per level ---- */
#if defined(Q8_PORTABLE)
#elif CHUNK == 64
#define NATIVE 64
typedef __m512i nv;
#define NV_LOAD(p) _mm512_loadu_si512((const void *)(p))
#define NV_ZERO() _mm512_setzero_si512()
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
#define NV_ZERO() _mm256_setzero_si256()
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

/* Per 32-bit lane, the two int16 products summed: a₀·b₀ + a₁·b₁. */
static inline vli madd_pairs(vli a, vli b) {
    nv x[RANGES], y[RANGES];
    memcpy(x, &a, CHUNK);
    memcpy(y, &b, CHUNK);
    for (int r = 0; r < RANGES; r++) x[r] = MADD16(x[r], y[r]);
    return vli_of(x);
}
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
static inline vli madd_pairs(vli a, vli b) {
    vli out;
    for (int l = 0; l < BLOCKS; l++)
        out[l] = (int16_t)(a[l] & 0xffff) * (int16_t)(b[l] & 0xffff) + (int16_t)(a[l] >> 16) * (int16_t)(b[l] >> 16);
    return out;
}
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

#endif
