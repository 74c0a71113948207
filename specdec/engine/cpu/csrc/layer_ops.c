/* The float steps of a decoder layer between the integer kernels of the "gguf-q8" path: RMS norm, SiLU
 * gating, and attention with its rotary embedding and KV-cache writes. One C call each instead of dozens
 * of small torch ops (on a 1.5B model those cost about 7 of a step's 34 ms).
 *
 * Every output row is computed on its own, in one fixed order of float32 operations (no fused multiply-
 * adds: the library is built with -ffp-contract=off), whatever rows share the call and however the
 * threads split it. So these steps are row-invariant, like the kernels, and give the same bits on every
 * CPU level. Their definition:
 * - Sums of 16-lane vectors: element k feeds lane k mod 16 in order; the lanes are summed by halves.
 * - exp(x): x rounded to n = x·log2(e) (to nearest), r = (x − n·c1) − n·c2, a degree-6 polynomial in r
 *   (Cephes' expf) times 2ⁿ; 0 below −87.3, and x clamped to 88.3 above.
 * - RMS norm: y = w · (x · (1 / sqrt(Σx² / K + eps))).
 * - SiLU gating: y = (g / (1 + exp(−g))) · u.
 * - Attention of the query at position p: scores s_j = (q·k_j) · scale for keys j ≤ p (dot products as
 *   16-lane sums over the head's dimensions), e_j = exp(s_j − max s), o = (Σ_j e_j·v_j, in key order) /
 *   Σ e_j (a 16-lane sum over j). Queries and keys get the rotary embedding as Hugging Face writes it:
 *   x·cos + rotate_half(x)·sin, after an optional per-head RMS norm (Qwen3's q_norm / k_norm).
 * - The KV cache holds keys (embedded) and values in IEEE half precision, as llama.cpp's default F16 cache
 *   does: each rounded to nearest even when written (overflow to ±inf), read back exactly.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "vectors.h"
#include "workers.h"
#if defined(__F16C__)
#include <immintrin.h>
#endif

static inline vf load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* The first n (< 16) values at p, zeros after. */
static inline vf load_part(const float *p, int64_t n) {
    vf v = {0};
    for (int64_t i = 0; i < n; i++) v[i] = p[i];
    return v;
}

/* ---- the cache's half precision ---- */

/* f rounded to the nearest half (ties to even; ±inf past 65504 and a half; NaN stays NaN, quiet): the compiler's
 * IEEE conversion (F16C's vcvtps2ph, or libgcc's below it), under the default rounding mode as every step here. */
static inline uint16_t half_of(float f) {
    const _Float16 h = (_Float16)f;
    uint16_t bits;
    memcpy(&bits, &h, sizeof bits);
    return bits;
}

/* A piece of halves at p as floats, exactly: F16C's vcvtph2ps, or below it the half's bits in a float's place
 * times 2^112 (exact, subnormal halves included), inf and NaN (quieted) kept. */
static inline vpiece piece_kv(const uint16_t *p) {
    vpiece v;
#if defined(__F16C__) && PIECE_BYTES == 64
    const __m512 f = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    memcpy(&v, &f, sizeof v);
#elif defined(__F16C__) && PIECE_BYTES == 32
    const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    memcpy(&v, &f, sizeof v);
#else
    vpiece_i h;
    for (int l = 0; l < PIECE_LANES; l++) h[l] = p[l];
    const vpiece_i magnitude = (h & 0x7fff) << 13; /* a float 2^-112 times the half (a subnormal one included) */
    const vpiece_i special = 0x7f800000 | magnitude | ((magnitude > 0x0f800000) & 0x400000); /* inf, NaN quieted */
    v = piece_pick(magnitude >= 0x0f800000, (vpiece)special, (vpiece)magnitude * piece_splat(0x1p112f));
    v = (vpiece)((vpiece_i)v | ((h & 0x8000) << 16));
#endif
    return v;
}

/* n halves at p (n a multiple of 16) as floats, into out. */
static inline void floats_of_halves(const uint16_t *p, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i += PIECE_LANES) {
        const vpiece v = piece_kv(p + i);
        memcpy(out + i, &v, sizeof v);
    }
}

/* exp lane by lane, on the CPU's own vectors (a 16-lane vf is split through memory below AVX-512: SiLU took
 * 15.7 µs a row of 8,960 at AVX2 that way, against 3.2 at AVX-512). */
static inline vpiece piece_exp(vpiece x) {
    const vpiece_i tiny = x < piece_splat(-87.3f);
    x = piece_pick(x > piece_splat(88.3f), piece_splat(88.3f), x);
    x = piece_pick(tiny, piece_splat(0.0f), x);
    const vpiece n = piece_round(x * piece_splat(1.44269504088896341f));
    const vpiece r = (x - n * piece_splat(0.693359375f)) - n * piece_splat(-2.12194440e-4f);
    vpiece y = piece_splat(1.9875691500e-4f);
    y = y * r + piece_splat(1.3981999507e-3f);
    y = y * r + piece_splat(8.3334519073e-3f);
    y = y * r + piece_splat(4.1665795894e-2f);
    y = y * r + piece_splat(1.6666665459e-1f);
    y = y * r + piece_splat(5.0000001201e-1f);
    y = (y * (r * r) + r) + piece_splat(1.0f);
    const vpiece_i bits = (__builtin_convertvector(n, vpiece_i) + 127) << 23;
    return piece_pick(tiny, piece_splat(0.0f), y * (vpiece)bits);
}

/* exp of 16 lanes, a piece at a time. */
static inline vf vexp(vf x) {
    vpiece p[PIECES];
    memcpy(p, &x, sizeof x);
    for (int i = 0; i < PIECES; i++) p[i] = piece_exp(p[i]);
    memcpy(&x, p, sizeof x);
    return x;
}

/* SiLU gating of one piece: (g / (1 + exp(−g))) · u. */
static inline vpiece piece_silu_mul(vpiece g, vpiece u) {
    return (g / (piece_splat(1.0f) + piece_exp(-g))) * u;
}

/* Σ a[k]·b[k] over k < K as a 16-lane sum. */
static inline float dot(const float *a, const float *b, int64_t K) {
    vacc acc = acc_of(splat(0.0f));
    int64_t k = 0;
    for (; k + LANES <= K; k += LANES) acc = acc_mul_add(acc, a + k, b + k);
    if (k < K) acc = acc_add(acc, load_part(a + k, K - k) * load_part(b + k, K - k));
    return acc_lanes_sum(acc);
}

/* out[S, K] = the RMS norm of each row of x[S, K] with weight w[K]; out may be x. */
void lo_rms_norm(const float *x, int64_t S, int64_t K, const float *w, float eps, float *out) {
    for (int64_t s = 0; s < S; s++) {
        const float *row = x + s * K;
        const float r = 1.0f / sqrtf(dot(row, row, K) / (float)K + eps);
        for (int64_t k = 0; k < K; k++) out[s * K + k] = w[k] * (row[k] * r);
    }
}

/* out[S, I] = SiLU(gate) · up, for gate_up[S, 2I] = gate | up side by side. */
void lo_silu_mul(const float *gate_up, int64_t S, int64_t I, float *out) {
    for (int64_t s = 0; s < S; s++) {
        const float *g = gate_up + s * 2 * I, *u = g + I;
        float *o = out + s * I;
        int64_t i = 0;
        for (; i + PIECE_LANES <= I; i += PIECE_LANES) {
            vpiece gv, uv;
            memcpy(&gv, g + i, sizeof gv);
            memcpy(&uv, u + i, sizeof uv);
            const vpiece y = piece_silu_mul(gv, uv);
            memcpy(o + i, &y, sizeof y);
        }
        if (i < I) {
            vpiece gv = {0}, uv = {0};
            memcpy(&gv, g + i, (I - i) * sizeof(float));
            memcpy(&uv, u + i, (I - i) * sizeof(float));
            const vpiece y = piece_silu_mul(gv, uv);
            memcpy(o + i, &y, (I - i) * sizeof(float));
        }
    }
}

/* A head's vector x[D] after the optional RMS norm (weight norm[D]) and the rotary embedding. */
static void embed_position(const float *x, int64_t D, const float *norm, float eps, const float *cos,
                           const float *sin, float *out) {
    float normed[D];
    if (norm) {
        lo_rms_norm(x, 1, D, norm, eps, normed);
        x = normed;
    }
    const int64_t half = D / 2;
    for (int64_t i = 0; i < half; i++) out[i] = x[i] * cos[i] - x[i + half] * sin[i];
    for (int64_t i = half; i < D; i++) out[i] = x[i] * cos[i] + x[i - half] * sin[i];
}

typedef struct {
    const float *qkv, *q_norm, *cos, *sin;
    const uint16_t *keys, *values; /* the layer's [KV, capacity, D], halves */
    float *out;
    int64_t S, H, KV, D, capacity, start;
    float eps, scale;
    int out_of_memory; /* set by a unit that found no scratch memory: lo_attention returns -2 */
} attention_job;

static float *scratch(int64_t count) {
    static __thread float *buffer;
    static __thread int64_t size;
    if (count > size) {
        free(buffer);
        size = count > 2 * size ? count : 2 * size;
        buffer = malloc(size * sizeof(float));
        if (!buffer) size = 0;
    }
    return buffer;
}

#if PIECE_BYTES == 64
/* lanes_sum of each of the 16 vectors a[0..15], as one vector (lane j: a[j]'s sum). The same additions, the
 * same pairs, as a tree of shuffles across the 16 vectors, each stage adding the lanes that lanes_sum adds at
 * that stage (i and i + 8, then i and i + 4, then 0 and 2 and 1 and 3, then the two). */
static inline vf lanes_sums(const vf a[16]) {
    typedef int32_t vmask __attribute__((vector_size(64)));
    const vmask halves_lo = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const vmask halves_hi = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const vmask quarters_lo = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const vmask quarters_hi = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
    const vmask pairs_lo = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
    const vmask pairs_hi = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
    const vmask even = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    const vmask odd = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
    vf h[8], q[4], r[2];
    for (int i = 0; i < 8; i++) /* vectors 2i, 2i+1: h = a[i] + a[i + 8], 8 lanes each */
        h[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], halves_lo) +
               __builtin_shuffle(a[2 * i], a[2 * i + 1], halves_hi);
    for (int i = 0; i < 4; i++) /* vectors 4i..4i+3: q = h[i] + h[i + 4], 4 lanes each */
        q[i] = __builtin_shuffle(h[2 * i], h[2 * i + 1], quarters_lo) +
               __builtin_shuffle(h[2 * i], h[2 * i + 1], quarters_hi);
    for (int i = 0; i < 2; i++) /* vectors 8i..8i+7: (q[0] + q[2]), (q[1] + q[3]) */
        r[i] = __builtin_shuffle(q[2 * i], q[2 * i + 1], pairs_lo) + __builtin_shuffle(q[2 * i], q[2 * i + 1], pairs_hi);
    return __builtin_shuffle(r[0], r[1], even) + __builtin_shuffle(r[0], r[1], odd);
}
#endif

enum { KEY_BLOCK = 16 }; /* keys scored at once: one lanes_sums */
enum { PREFETCH_KEYS = 64 }; /* the cache's keys and values are prefetched this many keys ahead */

#if PIECE_BYTES == 64
/* scores[h·stride + j] = (q[h]·block[j]) · scale for HEADS heads (1 or 2) and the block's 16 keys: 16 / HEADS
 * keys at a time against every head (each key chunk loaded once for all of them), the 16 accumulators summed
 * by one lanes_sums. */
static inline __attribute__((always_inline)) void score_block(const float *q, const int heads, const uint16_t *block,
                                                              int64_t D, float scale, float *scores, int64_t stride) {
    const int per = KEY_BLOCK / heads; /* keys a pass */
    for (int part = 0; part < heads; part++) {
        const uint16_t *keys = block + part * per * D;
        vacc acc[KEY_BLOCK];
        for (int j = 0; j < KEY_BLOCK; j++) acc[j] = acc_of(splat(0.0f));
        for (int64_t c = 0; c < D; c += LANES) {
            vf qc[2];
            for (int h = 0; h < heads; h++) qc[h] = load(q + h * D + c);
#pragma GCC unroll 16
            for (int j = 0; j < per; j++) {
                const vf kc = piece_kv(keys + j * D + c); /* a piece is 16 lanes here */
                for (int h = 0; h < heads; h++) acc[h * per + j] = acc_add(acc[h * per + j], qc[h] * kc);
            }
        }
        vf sums[KEY_BLOCK];
        for (int j = 0; j < KEY_BLOCK; j++) sums[j] = acc_value(acc[j]);
        const vf s = lanes_sums(sums) * splat(scale);
        for (int h = 0; h < heads; h++) memcpy(scores + h * stride + part * per, (const float *)&s + h * per, per * 4);
    }
}
#endif

/* scores[g·stride + k] = (q[g]·keys[k]) · scale for k < n, each dot product a 16-lane sum over D (`dot`), the
 * keys read PREFETCH_KEYS ahead. With 512-bit vectors, keys in blocks of 16 (`score_block`, each half made a float
 * as it is loaded), heads in pairs and an odd one alone; the keys past the last block one at a time, each made
 * floats once for every head (converting it for each head cost AVX2 10% more time at 5 queries). */
static void score_keys(const float *q, int64_t G, const uint16_t *keys, int64_t n, int64_t D, float scale,
                       float *scores, int64_t stride) {
    float key[D];
    int64_t k = 0;
#if PIECE_BYTES == 64 /* narrower builds spill a block's accumulators: one key at a time there */
    for (; k + KEY_BLOCK <= n; k += KEY_BLOCK) {
        prefetch_bytes(keys + (k + PREFETCH_KEYS) * D, KEY_BLOCK * D * sizeof *keys);
        int64_t g = 0;
        for (; g + 2 <= G; g += 2) score_block(q + g * D, 2, keys + k * D, D, scale, scores + g * stride + k, stride);
        if (g < G) score_block(q + g * D, 1, keys + k * D, D, scale, scores + g * stride + k, stride);
    }
#endif
    for (; k < n; k++) {
        prefetch_bytes(keys + (k + PREFETCH_KEYS) * D, D * sizeof *keys);
        floats_of_halves(keys + k * D, D, key);
        for (int64_t g = 0; g < G; g++) scores[g * stride + k] = dot(q + g * D, key, D) * scale;
    }
}

/* Chunks at once: with 512-bit vectors 6 rows × 4 chunks fill 24 of the 32 registers; with narrower ones a
 * chunk is several registers, and one chunk at a time keeps 6 rows' accumulators in them (on AVX2: 12 of 16). */
#if PIECE_BYTES == 64
#define CHUNKS_AT_ONCE 4
#else
#define CHUNKS_AT_ONCE 1
#endif
#define WEIGH_ROWS 6
#define WEIGH_NAME(ROWS, CHUNKS) weigh_##ROWS##_##CHUNKS
#define WEIGH_FOR(ROWS, CHUNKS) WEIGH_NAME(ROWS, CHUNKS)

/* out[r] = Σ_k e[r·stride + k] · values[k] over k < n, in key order, for ROWS rows (heads) and CHUNKS 16-lane
 * chunks of the head's dimensions from d on; then each divided by sum[r]. The row and chunk counts are
 * constants, and the accumulators are the CPU's own vectors, so they stay in registers (11 of AVX2's 12; as
 * 16-lane `vacc`s GCC kept them in memory, a load and a store each at every key). */
#define WEIGH_VALUES(ROWS, CHUNKS)                                                                                \
    static void WEIGH_NAME(ROWS, CHUNKS)(const float *e, int64_t stride, const uint16_t *values, int64_t n, int64_t D, \
                                        int64_t d, const float *sum, float *out) {                              \
        enum { P = CHUNKS * PIECES }; /* the CPU's own vectors a row */                                           \
        vpiece acc[ROWS][P];                                                                                      \
        for (int r = 0; r < ROWS; r++)                                                                            \
            for (int i = 0; i < P; i++) acc[r][i] = piece_splat(0.0f);                                            \
        for (int64_t k = 0; k < n; k++) {                                                                         \
            prefetch_bytes(values + (k + PREFETCH_KEYS) * D + d, CHUNKS * LANES * sizeof *values);               \
            vpiece v[P];                                                                                          \
            for (int i = 0; i < P; i++) v[i] = piece_kv(values + k * D + d + i * PIECE_LANES);                    \
            for (int r = 0; r < ROWS; r++) {                                                                      \
                const vpiece p = piece_splat(e[r * stride + k]);                                                  \
                for (int i = 0; i < P; i++) acc[r][i] += p * v[i];                                                \
            }                                                                                                     \
        }                                                                                                         \
        for (int r = 0; r < ROWS; r++)                                                                            \
            for (int i = 0; i < P; i++) {                                                                         \
                const vpiece o = acc[r][i] / piece_splat(sum[r]);                                                 \
                memcpy(out + r * D + d + i * PIECE_LANES, &o, sizeof o);                                          \
            }                                                                                                     \
    }
WEIGH_VALUES(1, 1)
#if CHUNKS_AT_ONCE > 1
WEIGH_VALUES(1, 4)
#endif
WEIGH_VALUES(2, CHUNKS_AT_ONCE)
WEIGH_VALUES(3, CHUNKS_AT_ONCE)
WEIGH_VALUES(4, CHUNKS_AT_ONCE)
WEIGH_VALUES(5, CHUNKS_AT_ONCE)
WEIGH_VALUES(6, CHUNKS_AT_ONCE)

typedef void (*weigh_fn)(const float *, int64_t, const uint16_t *, int64_t, int64_t, int64_t, const float *, float *);
static const weigh_fn weigh_rows[WEIGH_ROWS + 1] = {
    0, WEIGH_FOR(1, CHUNKS_AT_ONCE), WEIGH_FOR(2, CHUNKS_AT_ONCE), WEIGH_FOR(3, CHUNKS_AT_ONCE),
    WEIGH_FOR(4, CHUNKS_AT_ONCE), WEIGH_FOR(5, CHUNKS_AT_ONCE), WEIGH_FOR(6, CHUNKS_AT_ONCE)};

/* out[g] = Σ_k e[g·stride + k] · values[k] / sum[g] for g < G, the heads in groups of at most WEIGH_ROWS. */
static void weigh_values(const float *e, int64_t G, int64_t stride, const uint16_t *values, int64_t n, int64_t D,
                         const float *sum, float *out) {
    const int64_t groups = (G + WEIGH_ROWS - 1) / WEIGH_ROWS, size = (G + groups - 1) / groups;
    for (int64_t g = 0; g < G; g += size) {
        const int64_t rows = G - g < size ? G - g : size;
        int64_t d = 0;
        for (; d + CHUNKS_AT_ONCE * LANES <= D; d += CHUNKS_AT_ONCE * LANES)
            weigh_rows[rows](e + g * stride, stride, values, n, D, d, sum + g, out + g * D);
        for (; d < D; d += LANES)
            for (int64_t r = 0; r < rows; r++)
                weigh_1_1(e + (g + r) * stride, stride, values, n, D, d, sum + g + r, out + (g + r) * D);
    }
}

/* The largest of x[0..n), NaNs passed over (−inf if every one is): lane by lane, then across the lanes. A
 * maximum is exact in any order; only the sign of a zero maximum may differ, and x − (±0) and exp(±0) do not
 * depend on it (the scalar loop's chain of dependent compares cost 8% of a verify's attention at depth). */
static inline float largest(const float *x, int64_t n) {
    vpiece top = piece_splat(-INFINITY);
    int64_t k = 0;
    for (; k + PIECE_LANES <= n; k += PIECE_LANES) {
        vpiece v;
        memcpy(&v, x + k, sizeof v);
        top = piece_pick(v > top, v, top);
    }
    float t = -INFINITY;
    for (int l = 0; l < PIECE_LANES; l++) t = top[l] > t ? top[l] : t;
    for (; k < n; k++) t = x[k] > t ? x[k] : t;
    return t;
}

/* Units [begin, end) of (KV head, query): the query heads that share that KV head, at that query. Each key
 * and value is read once per unit, for all of its heads. */
static void attend_units(void *ctx, int64_t begin, int64_t end) {
    attention_job *j = ctx;
    const int64_t D = j->D, G = j->H / j->KV, width = (j->H + 2 * j->KV) * D;
    for (int64_t unit = begin; unit < end; unit++) {
        const int64_t kv = unit / j->S, s = unit % j->S, n = j->start + s + 1; /* keys it sees */
        const int64_t stride = n + LANES;                                        /* a head's row of scores */
        const uint16_t *keys = j->keys + kv * j->capacity * D, *values = j->values + kv * j->capacity * D;
        float *scores = scratch(G * stride), q[G * D], sum[G];
        if (!scores) {
            __atomic_store_n(&j->out_of_memory, 1, __ATOMIC_RELAXED);
            return;
        }
        for (int64_t g = 0; g < G; g++)
            embed_position(j->qkv + s * width + (kv * G + g) * D, D, j->q_norm, j->eps, j->cos + s * D,
                           j->sin + s * D, q + g * D);
        score_keys(q, G, keys, n, D, j->scale, scores, stride);
        for (int64_t g = 0; g < G; g++) {
            float *row = scores + g * stride;
            const float top = largest(row, n);
            vacc total = acc_of(splat(0.0f));
            int64_t k = 0;
            for (; k + LANES <= n; k += LANES) {
                const vf e = vexp(load(row + k) - splat(top));
                store(row + k, e);
                total = acc_add(total, e);
            }
            if (k < n) {
                vf e = vexp(load_part(row + k, n - k) - splat(top));
                for (int64_t i = n - k; i < LANES; i++) e[i] = 0.0f; /* past the last key */
                for (int64_t i = 0; i < n - k; i++) row[k + i] = e[i];
                total = acc_add(total, e);
            }
            sum[g] = acc_lanes_sum(total);
        }
        weigh_values(scores, G, stride, values, n, D, sum, j->out + s * j->H * D + kv * G * D);
    }
}

/* Attention of one session's S new tokens at positions [start, start + S), in one layer.
 * qkv [S, (H + 2·KV)·D]: the tokens' queries, keys and values side by side (heads in order);
 * keys, values: the layer's cache [KV, capacity, D] in halves, whose positions [0, start) hold the past; the new
 * keys (normed, rotated) and values are written at [start, start + S), rounded to halves. cos, sin [S, D] at the tokens'
 * positions; q_norm, k_norm [D] or NULL. out [S, H·D]. D a multiple of 16 and at most 512, at most 32
 * query heads per KV head, start + S ≤ capacity. Returns 0, -1 if the shapes are not these, or -2 if a
 * thread found no memory for its scores (out is then incomplete). */
int lo_attention(const float *qkv, int64_t S, int64_t H, int64_t KV, int64_t D, const float *q_norm,
                 const float *k_norm, float eps, const float *cos, const float *sin, uint16_t *keys, uint16_t *values,
                 int64_t capacity, int64_t start, float scale, float *out, int threads) {
    if (D % LANES || D > 512 || KV < 1 || H % KV || H / KV > 32 || start + S > capacity) return -1;
    const int64_t width = (H + 2 * KV) * D;
    for (int64_t s = 0; s < S; s++)
        for (int64_t kv = 0; kv < KV; kv++) {
            const float *k = qkv + s * width + (H + kv) * D, *v = k + KV * D;
            const int64_t at = (kv * capacity + start + s) * D;
            float embedded[D];
            embed_position(k, D, k_norm, eps, cos + s * D, sin + s * D, embedded);
            for (int64_t i = 0; i < D; i++) keys[at + i] = half_of(embedded[i]), values[at + i] = half_of(v[i]);
        }
    attention_job j = {qkv, q_norm, cos, sin, keys, values, out, S, H, KV, D, capacity, start, eps, scale, 0};
    parallel_for(threads, KV * S, attend_units, &j);
    return j.out_of_memory ? -2 : 0;
}
