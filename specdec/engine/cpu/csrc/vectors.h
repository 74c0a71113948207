/* 16-lane vectors (GCC's vector extensions) and the one 16-lane sum that both gguf-q8 files define their
 * float steps with: the lanes summed by halves, (a[i] + a[i + 8]), then + 4, + 2, + 1. */
#ifndef SPECDEC_VECTORS_H
#define SPECDEC_VECTORS_H

#include <stdint.h>
#include <string.h>

enum { LANES = 16 };

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));

static inline vf splat(float f) { return (vf){0} + f; }

/* The CPU's own vectors (vpiece: 16 float lanes with AVX-512, 8 with AVX, 4 below), for steps that are lane by
 * lane and so give the same bits at any width: GCC splits a vf wider than the CPU's vectors through memory.
 * A vf carried from one loop iteration to the next (vacc) is kept as such pieces: GCC keeps a wider vf in
 * memory between iterations (on AVX2: a store and scalar reloads each time, a store-forwarding stall per
 * integer-kernel super-block). Lane for lane the same additions as on a vf. */
#if defined(__AVX512F__)
#define PIECE_BYTES 64
#elif defined(__AVX__)
#define PIECE_BYTES 32
#else
#define PIECE_BYTES 16
#endif
enum { PIECE_LANES = PIECE_BYTES / 4, PIECES = 64 / PIECE_BYTES };
typedef float vpiece __attribute__((vector_size(PIECE_BYTES))); /* the CPU's own vectors */
typedef int32_t vpiece_i __attribute__((vector_size(PIECE_BYTES)));

static inline vpiece piece_splat(float f) { return (vpiece){0} + f; }

/* v rounded to an integer, to nearest even, for |v| < 2^22: adding 1.5 · 2^23 rounds (the float addition rounds
 * to nearest even; no contraction, -ffp-contract=off), subtracting it gives the integer back. */
static inline vpiece piece_round(vpiece v) {
    const vpiece magic = piece_splat(12582912.0f);
    return (v + magic) - magic;
}

/* yes where mask is all ones, no where it is 0, lane by lane. */
static inline vpiece piece_pick(vpiece_i mask, vpiece yes, vpiece no) {
    return (vpiece)(((vpiece_i)yes & mask) | ((vpiece_i)no & ~mask));
}

#if PIECE_BYTES == 64
typedef vf vacc;
static inline vacc acc_of(vf v) { return v; }
static inline vf acc_value(vacc a) { return a; }
static inline vacc acc_add(vacc a, vf t) { return a + t; }
#else
typedef struct {
    vpiece p[PIECES];
} vacc;

static inline vacc acc_of(vf v) {
    vacc a;
    memcpy(a.p, &v, sizeof v);
    return a;
}

static inline vf acc_value(vacc a) {
    vf v;
    memcpy(&v, a.p, sizeof v);
    return v;
}

static inline vacc acc_add(vacc a, vf t) {
    const vacc b = acc_of(t);
    for (int i = 0; i < PIECES; i++) a.p[i] += b.p[i];
    return a;
}
#endif

static inline float lanes_sum(vf a) {
    float h[8], q[4];
    for (int i = 0; i < 8; i++) h[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) q[i] = h[i] + h[i + 4];
    return (q[0] + q[2]) + (q[1] + q[3]);
}

/* acc + a[0..16) · b[0..16), lane for lane, on the CPU's own vectors: a 16-lane product formed whole is split
 * through memory by GCC below AVX-512 (measured on AVX2: attention's scores 13× slower than this way). */
static inline vacc acc_mul_add(vacc acc, const float *a, const float *b) {
#if PIECE_BYTES == 64
    vf x, y;
    memcpy(&x, a, sizeof x);
    memcpy(&y, b, sizeof y);
    return acc + x * y;
#else
    for (int i = 0; i < PIECES; i++) {
        vpiece x, y;
        memcpy(&x, a + i * PIECE_LANES, sizeof x);
        memcpy(&y, b + i * PIECE_LANES, sizeof y);
        acc.p[i] += x * y;
    }
    return acc;
#endif
}

/* lanes_sum of an accumulator, on its pieces: the same additions. */
static inline float acc_lanes_sum(vacc a) {
#if PIECE_BYTES == 64
    return lanes_sum(a);
#else
    typedef float v8 __attribute__((vector_size(32)));
    v8 h; /* h[i] = a[i] + a[i + 8] */
#if PIECE_BYTES == 32
    h = a.p[0] + a.p[1];
#else
    const vpiece low = a.p[0] + a.p[2], high = a.p[1] + a.p[3];
    memcpy(&h, &low, sizeof low);
    memcpy((float *)&h + 4, &high, sizeof high);
#endif
    float q[4];
    for (int i = 0; i < 4; i++) q[i] = h[i] + h[i + 4];
    return (q[0] + q[2]) + (q[1] + q[3]);
#endif
}

/* The n bytes at p (each 64-byte line) prefetched into every cache level: every prefetch of the weights
 * (q8dot.c) and of the KV cache (layer_ops.c). A prefetch never faults, past an array's end included. */
static inline __attribute__((always_inline)) void prefetch_bytes(const void *p, int64_t n) {
    for (int64_t b = 0; b < n; b += 64) __builtin_prefetch((const char *)p + b, 0, 3);
}

#endif
