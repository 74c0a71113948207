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
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "vectors.h"
#include "workers.h"

static inline vf load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store(float *p, vf v) { memcpy(p, &v, sizeof v); }

static inline vf pick(vi mask, vf yes, vf no) { return (vf)(((vi)yes & mask) | ((vi)no & ~mask)); }

/* The first n (< 16) values at p, zeros after. */
static inline vf load_part(const float *p, int64_t n) {
    vf v = {0};
    for (int64_t i = 0; i < n; i++) v[i] = p[i];
    return v;
}

static inline vf vexp(vf x) {
    const vi tiny = x < splat(-87.3f);
    x = pick(x > splat(88.3f), splat(88.3f), x);
    x = pick(tiny, splat(0.0f), x);
    const vf shift = splat(12582912.0f); /* 1.5 · 2^23: adding it rounds to an integer, to nearest even */
    const vf n = (x * splat(1.44269504088896341f) + shift) - shift;
    const vf r = (x - n * splat(0.693359375f)) - n * splat(-2.12194440e-4f);
    vf y = splat(1.9875691500e-4f);
    y = y * r + splat(1.3981999507e-3f);
    y = y * r + splat(8.3334519073e-3f);
    y = y * r + splat(4.1665795894e-2f);
    y = y * r + splat(1.6666665459e-1f);
    y = y * r + splat(5.0000001201e-1f);
    y = (y * (r * r) + r) + splat(1.0f);
    const vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
    return pick(tiny, splat(0.0f), y * (vf)bits);
}

/* Σ a[k]·b[k] over k < K as a 16-lane sum. */
static inline float dot(const float *a, const float *b, int64_t K) {
    vacc acc = acc_of(splat(0.0f));
    int64_t k = 0;
    for (; k + LANES <= K; k += LANES) acc = acc_add(acc, load(a + k) * load(b + k));
    if (k < K) acc = acc_add(acc, load_part(a + k, K - k) * load_part(b + k, K - k));
    return lanes_sum(acc_value(acc));
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
        for (; i + LANES <= I; i += LANES) {
            const vf gv = load(g + i);
            store(o + i, (gv / (splat(1.0f) + vexp(-gv))) * load(u + i));
        }
        if (i < I) {
            const vf gv = load_part(g + i, I - i), uv = load_part(u + i, I - i);
            const vf y = (gv / (splat(1.0f) + vexp(-gv))) * uv;
            for (int64_t k = 0; k < I - i; k++) o[i + k] = y[k];
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
    const float *keys, *values; /* the layer's [KV, capacity, D] */
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

/* Units [begin, end) of (KV head, query): the query heads that share that KV head, at that query. Each key
 * and value is read once per unit, for all of its heads. */
static void attend_units(void *ctx, int64_t begin, int64_t end) {
    attention_job *j = ctx;
    const int64_t D = j->D, G = j->H / j->KV, width = (j->H + 2 * j->KV) * D;
    for (int64_t unit = begin; unit < end; unit++) {
        const int64_t kv = unit / j->S, s = unit % j->S, n = j->start + s + 1; /* keys it sees */
        const int64_t stride = n + LANES;                                        /* a head's row of scores */
        const float *keys = j->keys + kv * j->capacity * D, *values = j->values + kv * j->capacity * D;
        float *scores = scratch(G * stride), q[G][D], top[G], sum[G];
        if (!scores) {
            __atomic_store_n(&j->out_of_memory, 1, __ATOMIC_RELAXED);
            return;
        }
        for (int64_t g = 0; g < G; g++) {
            embed_position(j->qkv + s * width + (kv * G + g) * D, D, j->q_norm, j->eps, j->cos + s * D,
                           j->sin + s * D, q[g]);
            top[g] = -INFINITY;
        }
        for (int64_t k = 0; k < n; k++)
            for (int64_t g = 0; g < G; g++) {
                const float score = dot(q[g], keys + k * D, D) * j->scale;
                scores[g * stride + k] = score;
                top[g] = score > top[g] ? score : top[g];
            }
        for (int64_t g = 0; g < G; g++) {
            float *row = scores + g * stride;
            vacc total = acc_of(splat(0.0f));
            int64_t k = 0;
            for (; k + LANES <= n; k += LANES) {
                const vf e = vexp(load(row + k) - splat(top[g]));
                store(row + k, e);
                total = acc_add(total, e);
            }
            if (k < n) {
                vf e = vexp(load_part(row + k, n - k) - splat(top[g]));
                for (int64_t i = n - k; i < LANES; i++) e[i] = 0.0f; /* past the last key */
                for (int64_t i = 0; i < n - k; i++) row[k + i] = e[i];
                total = acc_add(total, e);
            }
            sum[g] = lanes_sum(acc_value(total));
        }
        float *out = j->out + s * j->H * D + kv * G * D;
        for (int64_t d = 0; d < D; d += LANES) {
            vacc acc[G];
            for (int64_t g = 0; g < G; g++) acc[g] = acc_of(splat(0.0f));
            for (int64_t k = 0; k < n; k++) {
                const vf v = load(values + k * D + d);
                for (int64_t g = 0; g < G; g++) acc[g] = acc_add(acc[g], splat(scores[g * stride + k]) * v);
            }
            for (int64_t g = 0; g < G; g++) store(out + g * D + d, acc_value(acc[g]) / splat(sum[g]));
        }
    }
}

/* Attention of one session's S new tokens at positions [start, start + S), in one layer.
 * qkv [S, (H + 2·KV)·D]: the tokens' queries, keys and values side by side (heads in order);
 * keys, values: the layer's cache [KV, capacity, D], whose positions [0, start) hold the past; the new
 * keys (normed, rotated) and values are written at [start, start + S). cos, sin [S, D] at the tokens'
 * positions; q_norm, k_norm [D] or NULL. out [S, H·D]. D a multiple of 16 and at most 512, at most 32
 * query heads per KV head, start + S ≤ capacity. Returns 0, -1 if the shapes are not these, or -2 if a
 * thread found no memory for its scores (out is then incomplete). */
int lo_attention(const float *qkv, int64_t S, int64_t H, int64_t KV, int64_t D, const float *q_norm,
                 const float *k_norm, float eps, const float *cos, const float *sin, float *keys, float *values,
                 int64_t capacity, int64_t start, float scale, float *out, int threads) {
    if (D % LANES || D > 512 || KV < 1 || H % KV || H / KV > 32 || start + S > capacity) return -1;
    const int64_t width = (H + 2 * KV) * D;
    for (int64_t s = 0; s < S; s++)
        for (int64_t kv = 0; kv < KV; kv++) {
            const float *k = qkv + s * width + (H + kv) * D, *v = k + KV * D;
            const int64_t at = (kv * capacity + start + s) * D;
            embed_position(k, D, k_norm, eps, cos + s * D, sin + s * D, keys + at);
            memcpy(values + at, v, D * sizeof(float));
        }
    attention_job j = {qkv, q_norm, cos, sin, keys, values, out, S, H, KV, D, capacity, start, eps, scale, 0};
    parallel_for(threads, KV * S, attend_units, &j);
    return j.out_of_memory ? -2 : 0;
}
