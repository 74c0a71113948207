/* 16-lane vectors (GCC's vector extensions) and the one 16-lane sum that both gguf-q8 files define their
 * float steps with: the lanes summed by halves, (a[i] + a[i + 8]), then + 4, + 2, + 1. */
#ifndef SPECDEC_VECTORS_H
#define SPECDEC_VECTORS_H

#include <stdint.h>

enum { LANES = 16 };

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));

static inline vf splat(float f) { return (vf){0} + f; }

static inline float lanes_sum(vf a) {
    float h[8], q[4];
    for (int i = 0; i < 8; i++) h[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) q[i] = h[i] + h[i + 4];
    return (q[0] + q[2]) + (q[1] + q[3]);
}

#endif
