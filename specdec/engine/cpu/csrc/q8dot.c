/* y[S, N] = x[S, K] · W[N, K]ᵀ with W in a GGML block format and x quantized to 8 bits per row: the
 * "gguf-q8" compute path. Integer dot products, like llama.cpp's, with a definition of our own.
 *
 * Definition (specdec/engine/q8dot.py states it in one sentence; tests/test_q8dot.py transcribes it):
 * - Activations: each row in groups of 32 values; dx = amax / 127, u = round-half-even(x · (127 / amax))
 *   clamped to ±127 (all zero where amax is 0).
 * - Weights: integers q with a float scale per 16 weights (s = d·sc for Q4_K / Q6_K, d for Q5_0 / Q8_0,
 *   exact in float32) and, for Q4_K, a min per 16 (m = dmin·min). Per group g of 16 weights the
 *   integer sums I = Σ (q − offset)·u and M = Σ u are exact (offset 32 for Q6_K, 16 for Q5_0, else 0).
 * - Float steps, each rounded to float32, no fused multiply-add: t = (s·dx)·I, minus m·(dx·M) for Q4_K;
 *   group g feeds accumulator g mod 16 in order (acc += t); y = the 16 accumulators summed by halves
 *   ((a[i] + a[i + 8]), then + 4, + 2, + 1).
 * Every output is that fixed sequence whatever the rows beside it: the path is row-invariant.
 *
 * Layout: the weights are repacked once at load (`q8_repack`) into super-blocks of 256 weights (8
 * blocks for the 32-weight formats, zero-padded at a row's end), their quants in "vector order": byte
 * p of vector t (t < 4, p < 64) is the weight 16·(p / 4) + 4·t + p % 4, so a 4-byte dot product at
 * lane p / 4 always stays inside one 16-weight group. The activations are quantized into the same
 * order. Each weight super-block is unpacked once per pass and dotted with every row in it.
 *
 * Built per level by specdec/engine/native.py: VNNI (vpdpbusd on 512 or 256 bits), AVX2 and SSE4.1
 * (vpmaddubsw: u8·s8 pairs summed in int16, which never saturates here: |q|·|u| ≤ 128·127, and the pair
 * sums of up to 4 vectors added in int16 before widening, as the largest code of each format allows),
 * portable C. Integer sums are exact, so every build gives the same bits.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_blocks.h"
#include "kernels.h"
#include "vectors.h"
#include "workers.h"
#if !defined(Q8_PORTABLE)
#include <immintrin.h>
#endif

enum { SB = 256 };

typedef uint32_t vu __attribute__((vector_size(64)));
typedef uint8_t vb __attribute__((vector_size(64)));

/* One activation super-block: 256 quants in vector order, and per lane (16-weight group) dx, Σu and dx·Σu. */
typedef struct act_block {
    int8_t u[SB];
    float dx[LANES];
    int32_t bsum[LANES];
    float dx_bsum[LANES]; /* dx · Σu, the factor of Q4_K's min term */
} act_block;

/* ---- the integer dot of 256 u8 weights with 256 s8 activations, lane by lane, per level ---- */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define NATIVE 64
typedef __m512i nv;
#define NV_LOAD(p) _mm512_loadu_si512((const void *)(p))
#define DP(acc, w, x) _mm512_dpbusd_epi32(acc, w, x)
#define NV_ABS(q) _mm512_abs_epi8(q)
#define NV_SIGN_OF(q) _mm512_movm_epi8(_mm512_movepi8_mask(q)) /* −1 where q < 0 */
#define NV_SIGN(x, s) _mm512_sub_epi8(_mm512_xor_si512(x, s), s)
#elif defined(__AVXVNNI__)
#define NATIVE 32
typedef __m256i nv;
#define NV_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define DP(acc, w, x) _mm256_dpbusd_avx_epi32(acc, w, x)
#define NV_ABS(q) _mm256_abs_epi8(q)
#define NV_SIGN_OF(q) (q)
#define NV_SIGN(x, s) _mm256_sign_epi8(x, s) /* x where s > 0, −x where s < 0, 0 where s = 0 (then |q| is 0) */
#elif defined(__AVX2__)
#define NATIVE 32
typedef __m256i nv;
#define NV_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define PAIRS(w, x) _mm256_maddubs_epi16(w, x) /* int16 sums of byte pairs */
#define ADD16(a, b) _mm256_add_epi16(a, b)
#define WIDEN_ADD(acc, p) _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
#define NV_ABS(q) _mm256_abs_epi8(q)
#define NV_SIGN_OF(q) (q)
#define NV_SIGN(x, s) _mm256_sign_epi8(x, s) /* x where s > 0, −x where s < 0, 0 where s = 0 (then |q| is 0) */
#elif defined(__SSE4_1__)
#define NATIVE 16
typedef __m128i nv;
#define NV_LOAD(p) _mm_loadu_si128((const __m128i *)(p))
#define PAIRS(w, x) _mm_maddubs_epi16(w, x)
#define ADD16(a, b) _mm_add_epi16(a, b)
#define WIDEN_ADD(acc, p) _mm_add_epi32(acc, _mm_madd_epi16(p, _mm_set1_epi16(1)))
#define NV_ABS(q) _mm_abs_epi8(q)
#define NV_SIGN_OF(q) (q)
#define NV_SIGN(x, s) _mm_sign_epi8(x, s)
#endif

#ifdef NATIVE
enum { CHUNKS = SB / NATIVE, RANGES = 64 / NATIVE }; /* native vectors a super-block; lane ranges a vector */

/* Lane l of the result: Σ over t of the 4-byte dot at bytes 4l..4l+3 of vector t (w unsigned, u signed);
 * with `sign` (0 or −1 a byte), u's bytes are negated where sign is −1 first. Without VNNI, `sums16`
 * chunks' int16 pair sums are added in int16 before widening (fewer multiplies): the caller's weight bound
 * keeps them exact, sums16 · 2 · max|w| · 127 ≤ 32767. */
static inline __attribute__((always_inline)) vi dot_lanes(const nv *w, const nv *sign, const int8_t *u, int sums16) {
    nv acc[RANGES];
    memset(acc, 0, sizeof acc);
#ifdef PAIRS
    for (int c0 = 0; c0 < CHUNKS; c0 += RANGES * sums16)
        for (int r = 0; r < RANGES; r++) {
            nv pairs;
            for (int k = 0; k < sums16; k++) {
                const int c = c0 + r + k * RANGES;
                const nv x = sign ? NV_SIGN(NV_LOAD(u + c * NATIVE), sign[c]) : NV_LOAD(u + c * NATIVE);
                pairs = k ? ADD16(pairs, PAIRS(w[c], x)) : PAIRS(w[c], x);
            }
            acc[r] = WIDEN_ADD(acc[r], pairs);
        }
#else
    (void)sums16;
    for (int c = 0; c < CHUNKS; c++) {
        const nv x = sign ? NV_SIGN(NV_LOAD(u + c * NATIVE), sign[c]) : NV_LOAD(u + c * NATIVE);
        acc[c % RANGES] = DP(acc[c % RANGES], w[c], x);
    }
#endif
    vi out;
    memcpy(&out, acc, sizeof out);
    return out;
}

static inline void load_weights(nv *w, const uint8_t *bytes) {
    for (int c = 0; c < CHUNKS; c++) w[c] = NV_LOAD(bytes + c * NATIVE);
}

/* Signed int8 weights as |q| (the unsigned operand) and what moves their sign onto the activations. */
static inline void load_signed_weights(nv *w, nv *sign, const int8_t *q) {
    for (int c = 0; c < CHUNKS; c++) {
        const nv v = NV_LOAD(q + c * NATIVE);
        w[c] = NV_ABS(v);
        sign[c] = NV_SIGN_OF(v);
    }
}
#define LEVEL_NAME (NATIVE == 64 ? "avx512-vnni" : NATIVE == 16 ? "sse4.1" : VNNI256 ? "avx-vnni" : "avx2")
#ifdef __AVXVNNI__
#define VNNI256 1
#else
#define VNNI256 0
#endif
#else /* portable C */
typedef uint8_t nv;
enum { CHUNKS = SB };
static inline __attribute__((always_inline)) vi dot_lanes(const nv *w, const nv *sign, const int8_t *u, int sums16) {
    (void)sums16;
    vi out = {0};
    for (int k = 0; k < SB; k++) out[(k % 64) / 4] += (int32_t)w[k] * (sign && sign[k] ? -u[k] : u[k]);
    return out;
}
static inline void load_weights(nv *w, const uint8_t *bytes) { memcpy(w, bytes, SB); }
static inline void load_signed_weights(nv *w, nv *sign, const int8_t *q) {
    for (int k = 0; k < SB; k++) {
        w[k] = (uint8_t)(q[k] < 0 ? -q[k] : q[k]);
        sign[k] = q[k] < 0;
    }
}
#define LEVEL_NAME "portable"
#endif

const char *q8_level(void) { return LEVEL_NAME; }

/* ---- the build's integer dot product at its best: the compute floor's peak ---- */
enum { PEAK_ROWS = 8 };

typedef struct {
    int64_t rounds;
    int32_t sink[64]; /* each part's total, so that nothing is optimised away */
} peak_job;

static void peak_part(void *ctx, int64_t begin, int64_t end) {
    peak_job *j = ctx;
    uint8_t bytes[SB] __attribute__((aligned(64)));
    int8_t u[PEAK_ROWS][SB] __attribute__((aligned(64)));
    memset(bytes, 1, sizeof bytes);
    memset(u, 1, sizeof u);
    nv w[CHUNKS];
    load_weights(w, bytes);
    for (int64_t part = begin; part < end; part++) {
        vi total = {0};
        for (int64_t r = 0; r < j->rounds; r++) {
            __asm__ volatile("" : : "r"(u) : "memory"); /* the activations are read again each round, as in a pass */
            for (int g = 0; g < PEAK_ROWS; g++) total += dot_lanes(w, 0, u[g], 4);
        }
        int32_t sum = 0;
        for (int l = 0; l < LANES; l++) sum += total[l];
        j->sink[part % 64] = sum;
    }
}

/* Multiply-adds done by `threads` threads at once, each dotting PEAK_ROWS cached activation rows with one
 * register-resident Q4_K-like weight super-block `rounds` times: the kernel's integer step with nothing else
 * (no weight reads, no float steps). The caller times the call. */
int64_t q8_dot_peak(int threads, int64_t rounds) {
    peak_job j = {rounds, {0}};
    parallel_for(threads, threads, peak_part, &j);
    return (int64_t)threads * rounds * PEAK_ROWS * SB;
}

/* ---- repacked super-block layouts ---- */
enum {
    Q4K_BYTES = 148, /* d, dmin (f16), sc[8], m[8] (6-bit values in bytes), 128 bytes of nibbles */
    Q6K_BYTES = 210, /* d (f16), sc[16] (int8), 128 bytes of low nibbles, 64 of high bit pairs */
    Q5_0_BYTES = 176, /* d[8] (f16), 128 bytes of low nibbles, 32 of 5th bits */
    Q8_0_BYTES = 272, /* d[8] (f16), 256 int8 */
};

static inline int64_t sb_bytes(int type) {
    switch (type) {
    case Q4_K: return Q4K_BYTES;
    case Q6_K: return Q6K_BYTES;
    case Q5_0: return Q5_0_BYTES;
    case Q8_0: return Q8_0_BYTES;
    default: return 0;
    }
}

static inline int64_t superblocks(int64_t K) { return (K + SB - 1) / SB; }

int64_t q8_row_bytes(int type, int64_t K) { return sb_bytes(type) ? superblocks(K) * sb_bytes(type) : 0; }
int64_t q8_act_bytes(int64_t K) { return superblocks(K) * (int64_t)sizeof(act_block); }

/* 256 quants from natural order into vector order (see Layout): vector t is the natural order's 4-byte words
 * t, t + 4, ..., t + 60, so weight k lands at byte 64·((k % 16) / 4) + 4·(k / 16) + k % 4. */
static inline void to_vector_order(const int8_t *natural, int8_t *ordered) {
    uint32_t in[SB / 4], out[SB / 4];
    memcpy(in, natural, SB);
    for (int t = 0; t < 4; t++)
        for (int w = 0; w < 16; w++) out[16 * t + w] = in[4 * w + t];
    memcpy(ordered, out, SB);
}

/* The quants of one GGML block (256 or 32 weights) as integers q[k] (before any offset). */
static void decode_block(int type, const uint8_t *b, int8_t *q) {
    if (type == Q4_K) {
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                q[64 * j + l] = b[16 + 32 * j + l] & 15;
                q[64 * j + 32 + l] = b[16 + 32 * j + l] >> 4;
            }
    } else if (type == Q6_K) {
        for (int c = 0; c < 2; c++)
            for (int l = 0; l < 32; l++) {
                const uint8_t a = b[64 * c + l], e = b[64 * c + 32 + l], hi = b[128 + 32 * c + l];
                q[128 * c + l] = (a & 15) | ((hi & 3) << 4);
                q[128 * c + 32 + l] = (e & 15) | (((hi >> 2) & 3) << 4);
                q[128 * c + 64 + l] = (a >> 4) | (((hi >> 4) & 3) << 4);
                q[128 * c + 96 + l] = (e >> 4) | (((hi >> 6) & 3) << 4);
            }
    } else if (type == Q5_0) {
        uint32_t high;
        memcpy(&high, b + 2, 4);
        for (int l = 0; l < 16; l++) {
            q[l] = (b[6 + l] & 15) | (((high >> l) & 1) << 4);
            q[16 + l] = (b[6 + l] >> 4) | (((high >> (16 + l)) & 1) << 4);
        }
    } else { /* Q8_0 */
        memcpy(q, b + 2, 32);
    }
}

/* Nibbles of 256 quants in vector order: byte p of half h holds vector 2h's (low) and 2h+1's (high). */
static void pack_nibbles(const int8_t *ordered, uint8_t *out) {
    for (int h = 0; h < 2; h++)
        for (int p = 0; p < 64; p++)
            out[64 * h + p] = (ordered[128 * h + p] & 15) | ((ordered[128 * h + 64 + p] & 15) << 4);
}

/* W [N, K] in GGML blocks -> the super-block layout above (`q8_row_bytes(type, K)` bytes a row).
 * Returns 0, or -1 for a type this path does not take or a K that is not a whole number of blocks. */
int q8_repack(int type, const uint8_t *w, int64_t N, int64_t K, uint8_t *out) {
    if (!sb_bytes(type) || K % block_weights(type)) return -1;
    const int64_t in_row = K / block_weights(type) * block_bytes(type), out_row = q8_row_bytes(type, K);
    const int64_t nsb = superblocks(K);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *src = w + n * in_row;
        uint8_t *dst = out + n * out_row;
        memset(dst, 0, out_row);
        for (int64_t i = 0; i < nsb; i++) {
            int8_t natural[SB] = {0}, ordered[SB];
            uint8_t *o = dst + i * sb_bytes(type);
            if (type == Q4_K || type == Q6_K) {
                const uint8_t *b = src + i * block_bytes(type);
                decode_block(type, b, natural);
                if (type == Q4_K) {
                    memcpy(o, b, 4); /* d, dmin */
                    for (int j = 0; j < 8; j++) q4_k_scale_min(b + 4, j, o + 4 + j, o + 12 + j);
                } else {
                    memcpy(o, b + 208, 2);
                    memcpy(o + 2, b + 192, 16);
                }
            } else {
                for (int j = 0; j < 8 && (i * 8 + j) * 32 < K; j++) {
                    const uint8_t *b = src + (i * 8 + j) * block_bytes(type);
                    decode_block(type, b, natural + 32 * j);
                    memcpy(o + 2 * j, b, 2);
                }
            }
            to_vector_order(natural, ordered);
            if (type == Q4_K) {
                pack_nibbles(ordered, o + 20);
            } else if (type == Q6_K) {
                pack_nibbles(ordered, o + 18);
                for (int p = 0; p < 64; p++)
                    for (int t = 0; t < 4; t++) o[146 + p] |= ((ordered[64 * t + p] >> 4) & 3) << (2 * t);
            } else if (type == Q5_0) {
                pack_nibbles(ordered, o + 16);
                for (int t = 0; t < 4; t++) /* the 5th bit of vector t's byte p: byte 8t + p % 8, bit p / 8 */
                    for (int p = 0; p < 64; p++) o[144 + 8 * t + p % 8] |= ((ordered[64 * t + p] >> 4) & 1) << (p / 8);
            } else {
                memcpy(o + 16, ordered, SB);
            }
        }
    }
    return 0;
}

/* One 16-value half of a 32-value group: its largest |x| lane by lane folded into m (|x| with the sign bit
 * cleared, and taken only where larger, as the scalar `v > amax` would: zeros of either sign and NaNs never). */
static inline vf fold_amax(vf m, vf x) {
    const vf magnitude = (vf)((vi)x & 0x7fffffff);
    const vi larger = magnitude > m;
    return (vf)(((vi)magnitude & larger) | ((vi)m & ~larger));
}

/* round-half-even(v) for |v| < 2^22, by adding and subtracting 1.5 · 2^23 (the float addition rounds to
 * nearest even; no contraction, -ffp-contract=off), then clamped to ±127: an int32 a lane. */
static inline vi quant_lanes(vf v) {
    const vf magic = splat(12582912.0f);
    vi q = __builtin_convertvector((v + magic) - magic, vi);
    q = (q & (q <= 127)) | (127 & (q > 127));
    return (q & (q >= -127)) | (-127 & (q < -127));
}

typedef int8_t vq __attribute__((vector_size(16)));

/* x [S, K] float32 -> S rows of `superblocks(K)` activation blocks (the definition's quantization, 16 lanes at
 * a time: every step lane by lane as the definition has it, so the same bits as value by value). */
void q8_quantize(const float *x, int64_t S, int64_t K, act_block *out) {
    const int64_t nsb = superblocks(K);
    for (int64_t s = 0; s < S; s++) {
        const float *row = x + s * K;
        for (int64_t i = 0; i < nsb; i++) {
            act_block *a = out + s * nsb + i;
            int8_t natural[SB] __attribute__((aligned(64))) = {0}; /* the quants in natural order */
            for (int g = 0; g < SB / 32; g++) {
                const int64_t k0 = i * SB + 32 * g;
                float dx = 0.0f;
                int32_t sums[2] = {0, 0};
                if (k0 < K) {
                    vf half[2], m = splat(0.0f);
                    memcpy(half, row + k0, sizeof half);
                    m = fold_amax(fold_amax(m, half[0]), half[1]);
                    float amax = 0.0f;
                    for (int l = 0; l < LANES; l++) amax = m[l] > amax ? m[l] : amax;
                    dx = amax / 127.0f;
                    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
                    for (int h = 0; h < 2; h++) {
                        const vi q = quant_lanes(half[h] * inv);
                        for (int l = 0; l < LANES; l++) sums[h] += q[l];
                        const vq bytes = __builtin_convertvector(q, vq);
                        memcpy(natural + 32 * g + 16 * h, &bytes, 16);
                    }
                }
                for (int h = 0; h < 2; h++) {
                    a->dx[2 * g + h] = dx;
                    a->bsum[2 * g + h] = sums[h];
                    a->dx_bsum[2 * g + h] = dx * (float)sums[h];
                }
            }
            to_vector_order(natural, a->u);
        }
    }
}

/* ---- the matmul ---- */

/* Byte arithmetic in 64-bit lanes: x86 has no 8-bit shifts, and masking first keeps bits inside their bytes. */
typedef uint64_t v64 __attribute__((vector_size(64)));
#define BYTES(b) (0x0101010101010101ull * (b))

static inline v64 load64(const uint8_t *p) {
    v64 v;
    memcpy(&v, p, 64);
    return v;
}

static inline v64 nibbles(const uint8_t *p, int high) { return (high ? load64(p) >> 4 : load64(p)) & BYTES(15); }

/* The 16 lanes' values from 8 bytes at p, each for two adjacent lanes (a lane per 16 weights, a byte per 32),
 * as int32; by byte shuffle and widening, because GCC lowers shuffles of 16 floats and conversions from
 * bytes to scalar stores and reloads on AVX2 (measured: 4x slower verify). */
static inline vi pairs_of_bytes(const uint8_t *p, int is_signed) {
    vi out;
#if defined(__SSSE3__)
    const __m128i pairs = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)p),
                                           _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7));
#if defined(__AVX512F__)
    const __m512i w = is_signed ? _mm512_cvtepi8_epi32(pairs) : _mm512_cvtepu8_epi32(pairs);
    memcpy(&out, &w, 64);
#elif defined(__AVX2__)
    const __m256i lo = is_signed ? _mm256_cvtepi8_epi32(pairs) : _mm256_cvtepu8_epi32(pairs);
    const __m128i high_bytes = _mm_srli_si128(pairs, 8);
    const __m256i hi = is_signed ? _mm256_cvtepi8_epi32(high_bytes) : _mm256_cvtepu8_epi32(high_bytes);
    memcpy(&out, &lo, 32);
    memcpy((char *)&out + 32, &hi, 32);
#else
    for (int l = 0; l < LANES; l++) out[l] = is_signed ? (int32_t)(int8_t)p[l / 2] : (int32_t)p[l / 2];
    (void)pairs;
#endif
#else
    for (int l = 0; l < LANES; l++) out[l] = is_signed ? (int32_t)(int8_t)p[l / 2] : (int32_t)p[l / 2];
#endif
    return out;
}

/* 16 int8 values at p, one a lane, as int32. */
static inline vi signed_lanes(const uint8_t *p) {
    vi out;
#if defined(__AVX512F__)
    const __m512i w = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
    memcpy(&out, &w, 64);
#elif defined(__AVX2__)
    for (int h = 0; h < 2; h++) {
        const __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * h)));
        memcpy((char *)&out + 32 * h, &w, 32);
    }
#else
    for (int l = 0; l < LANES; l++) out[l] = (int8_t)p[l];
#endif
    return out;
}

/* 8 float16 block scales at p, each for the two lanes of its 32 weights. */
static inline vf block_scales(const uint8_t *p) {
    vf out;
#if defined(__F16C__)
    const __m128i halves = _mm_loadu_si128((const __m128i *)p);
    const __m128i lo = _mm_unpacklo_epi16(halves, halves), hi = _mm_unpackhi_epi16(halves, halves);
#if defined(__AVX512F__)
    const __m512 f = _mm512_cvtph_ps(_mm256_set_m128i(hi, lo));
    memcpy(&out, &f, 64);
#else
    const __m256 flo = _mm256_cvtph_ps(lo), fhi = _mm256_cvtph_ps(hi);
    memcpy(&out, &flo, 32);
    memcpy((char *)&out + 32, &fhi, 32);
#endif
#else
    for (int l = 0; l < LANES; l++) out[l] = half_to_float(p + 2 * (l / 2));
#endif
    return out;
}

enum { MAX_ROWS = 16 };

/* One super-block of one weight row against G activation rows: acc[g] += its terms. */
static inline __attribute__((always_inline)) void superblock(const int type, const uint8_t *o, const act_block *a,
                                                             int64_t lda, vacc *acc, int G) {
    uint8_t bytes[SB] __attribute__((aligned(64)));
    vf s, m = {0};
    int offset_bits = 0; /* I = dot − Σu · 2^bits: 32 for Q6_K, 16 for Q5_0 */
    /* chunks summed in int16 (see dot_lanes): max |w| is 15 for Q4_K, 31 for Q5_0, 63 for Q6_K, 128 for Q8_0 */
    const int sums16 = type == Q4_K || type == Q5_0 ? 4 : type == Q6_K ? 2 : 1;
    if (type == Q4_K) {
        s = __builtin_convertvector(pairs_of_bytes(o + 4, 0), vf) * half_to_float(o);      /* d · sc */
        m = __builtin_convertvector(pairs_of_bytes(o + 12, 0), vf) * half_to_float(o + 2); /* dmin · m */
        for (int t = 0; t < 4; t++) {
            const v64 q = nibbles(o + 20 + 64 * (t / 2), t % 2);
            memcpy(bytes + 64 * t, &q, 64);
        }
    } else if (type == Q6_K) {
        s = __builtin_convertvector(signed_lanes(o + 2), vf) * half_to_float(o);
        const v64 high = load64(o + 146);
        for (int t = 0; t < 4; t++) {
            const v64 q = nibbles(o + 18 + 64 * (t / 2), t % 2) | (((high >> (2 * t)) & BYTES(3)) << 4);
            memcpy(bytes + 64 * t, &q, 64);
        }
        offset_bits = 5;
    } else if (type == Q5_0) {
        s = block_scales(o);
        const v64 lane = {0, 1, 2, 3, 4, 5, 6, 7}; /* byte p's 5th bit is bit p / 8 of qh byte p % 8 */
        for (int t = 0; t < 4; t++) {
            uint64_t word;
            memcpy(&word, o + 144 + 8 * t, 8);
            const v64 q = nibbles(o + 16 + 64 * (t / 2), t % 2) | ((((v64){0} + word) >> lane) & BYTES(1)) << 4;
            memcpy(bytes + 64 * t, &q, 64);
        }
        offset_bits = 4;
    } else { /* Q8_0: |q| is the unsigned operand, and q's sign moves onto the activations */
        s = block_scales(o);
    }
    nv w[CHUNKS], sign[CHUNKS];
    if (type == Q8_0)
        load_signed_weights(w, sign, (const int8_t *)o + 16);
    else
        load_weights(w, bytes);
    for (int g = 0; g < G; g++) {
        const act_block *x = a + g * lda;
        vi dot = dot_lanes(w, type == Q8_0 ? sign : 0, x->u, sums16);
        vf dx, term;
        vi bsum;
        memcpy(&dx, x->dx, 64);
        memcpy(&bsum, x->bsum, 64);
        if (offset_bits) dot -= (vi)((vu)bsum << offset_bits); /* a shift, unsigned: defined for negative sums */
        term = (s * dx) * __builtin_convertvector(dot, vf);
        if (type == Q4_K) {
            vf dx_bsum;
            memcpy(&dx_bsum, x->dx_bsum, 64);
            term = term - m * dx_bsum;
        }
        acc[g] = acc_add(acc[g], term);
    }
}

/* Activations beyond L1_BYTES go in chunks of CHUNK_BYTES, which stay in the L1 cache while a block of
 * columns (COLUMN_BLOCK) passes over them, the weights streaming through the rest of it (measured on a Zen 5:
 * the down projection's 35 super-blocks, 5 rows, 1.9x faster on cached weights). A chunk reads a short stretch
 * of each weight row, which the hardware prefetcher finds late: row_pass prefetches the next row's stretch
 * (from memory, Q6_K down projections of 4-9 rows 1.3-1.7x faster; L1_BYTES 32 KiB instead of 48 made 3 rows
 * 1.5x faster). */
enum { L1_BYTES = 32768, CHUNK_BYTES = 24576 };

/* A pass of several rows over whole weight rows (not in chunks) prefetches the weights this many
 * super-blocks ahead, on into the next rows, which follow in memory: with the rows' work between two
 * super-blocks the hardware prefetcher falls behind (measured on a Zen 4, the 1.5B target: S = 2 about
 * 49 -> 42 ms, S = 9 118 -> 98 ms, S = 5 within the noise). One row, where it keeps up, is left alone. A
 * prefetch never faults, past the array's end included. */
enum { PREFETCH_AHEAD = 8 };

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

/* One weight row's super-blocks [i0, i1) against G activation rows. The first chunk (i0 = 0) starts
 * the 16 accumulators at zero, a later one from `keep`; the last (i1 = nsb) writes y, an earlier one
 * leaves the accumulators in `keep`. Chunking changes no term's order. */
static inline __attribute__((always_inline)) void row_pass(const int type, const uint8_t *row, int64_t i0,
                                                           int64_t i1, int64_t nsb, const act_block *a, vacc *keep,
                                                           float *y, int64_t ldy, const float *bias, int G) {
    vacc acc[MAX_ROWS];
    for (int g = 0; g < G; g++) acc[g] = i0 == 0 ? acc_of(splat(0.0f)) : keep[g];
    if (i1 - i0 < nsb) { /* a chunk: the next row's part is a short stream the hardware would find late */
        const uint8_t *next = row + nsb * sb_bytes(type) + i0 * sb_bytes(type);
        for (int64_t b = 0; b < (i1 - i0) * sb_bytes(type); b += 64) __builtin_prefetch(next + b, 0, 0);
    }
    for (int64_t i = i0; i < i1; i++) {
        if (G > 1 && i1 - i0 == nsb) /* a whole row: the stream of rows runs on into the next (PREFETCH_AHEAD) */
            for (int64_t b = 0; b < sb_bytes(type); b += 64)
                __builtin_prefetch(row + (i + PREFETCH_AHEAD) * sb_bytes(type) + b, 0, 0);
        superblock(type, row + i * sb_bytes(type), a + i, nsb, acc, G);
    }
    if (i1 < nsb) {
        for (int g = 0; g < G; g++) keep[g] = acc[g];
        return;
    }
    for (int g = 0; g < G; g++) {
        const float sum = lanes_sum(acc_value(acc[g]));
        y[g * ldy] = bias ? sum + *bias : sum;
    }
}

#define PASS(T, G) \
    case G: row_pass(T, j->w + n * j->row_bytes, i0, i1, j->nsb, j->a, kept, j->out + n, j->ldy, \
                     j->bias ? j->bias + n : 0, G); break;
#define PASSES(T) \
    switch (G) { \
        PASS(T, 1) PASS(T, 2) PASS(T, 3) PASS(T, 4) PASS(T, 5) PASS(T, 6) PASS(T, 7) PASS(T, 8) \
        PASS(T, 9) PASS(T, 10) PASS(T, 11) PASS(T, 12) PASS(T, 13) PASS(T, 14) PASS(T, 15) PASS(T, 16) \
    }

/* G rows against columns of W, the super-blocks in chunks of `chunk`: what the workers split by columns. */
typedef struct {
    int type, G;
    const uint8_t *w;
    int64_t row_bytes, chunk, nsb, ldy;
    const act_block *a;
    float *out;
    const float *bias;
    int out_of_memory; /* set by a worker that found no memory for its accumulators: q8_matmul returns -2 */
} job;

/* Columns a worker takes through every chunk before the next ones: their accumulators between chunks stay
 * in this thread's cache (COLUMN_BLOCK · G vectors), where one pass per chunk over all N columns kept N · G
 * of them in memory (at 13-16 rows a 1536-wide Q4_K matrix of 107,520 columns ran 2x slower than unchunked). */
enum { COLUMN_BLOCK = 16 };

static void columns(void *ctx, int64_t begin, int64_t end) {
    job *j = ctx;
    const int G = j->G;
    vacc *keep = 0;
    if (j->chunk < j->nsb && !(keep = keep_buffer(COLUMN_BLOCK * G))) {
        __atomic_store_n(&j->out_of_memory, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t b0 = begin; b0 < end; b0 += COLUMN_BLOCK) {
        const int64_t b1 = b0 + COLUMN_BLOCK < end ? b0 + COLUMN_BLOCK : end;
        for (int64_t i0 = 0; i0 < j->nsb; i0 += j->chunk) {
            const int64_t i1 = i0 + j->chunk < j->nsb ? i0 + j->chunk : j->nsb;
            for (int64_t n = b0; n < b1; n++) {
                vacc *kept = keep ? keep + (n - b0) * G : 0;
                switch (j->type) { /* each (type, G) pair compiles to its own loop, its accumulators in registers */
                case Q4_K: PASSES(Q4_K); break;
                case Q6_K: PASSES(Q6_K); break;
                case Q5_0: PASSES(Q5_0); break;
                default: PASSES(Q8_0); break;
                }
            }
        }
    }
}

/* y[s * ldy + n] = the definition's x[s] · W[n] (+ bias[n], one float32 addition, if bias is not NULL)
 * for s < S, n < N, with `act` from q8_quantize(x) and W repacked by q8_repack. `threads` split n.
 * Returns 0, -1 for a type this path does not take, -2 if out of memory. */
int q8_matmul(int type, const uint8_t *w, int64_t N, int64_t K, const act_block *act, int64_t S, float *y,
              int64_t ldy, const float *bias, int threads) {
    if (!sb_bytes(type)) return -1;
    const int64_t nsb = superblocks(K), row_bytes = q8_row_bytes(type, K);
    for (int64_t s0 = 0; s0 < S; s0 += MAX_ROWS) {
        const int G = S - s0 < MAX_ROWS ? (int)(S - s0) : MAX_ROWS;
        int64_t chunk = nsb;
        if (G * nsb * (int64_t)sizeof(act_block) > L1_BYTES) {
            chunk = CHUNK_BYTES / (G * (int64_t)sizeof(act_block));
            chunk = chunk < 1 ? 1 : chunk;
        }
        job j = {type, G, w, row_bytes, chunk, nsb, ldy, act + s0 * nsb, y + s0 * ldy, bias, 0};
        parallel_for(threads, N, columns, &j);
        if (j.out_of_memory) return -2;
    }
    return 0;
}
