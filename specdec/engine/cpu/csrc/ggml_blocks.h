/* GGML's block formats as both kernels read them: type numbers, block sizes, float16 scales and Q4_K's
 * packed 6-bit scales and minimums. */
#ifndef SPECDEC_GGML_BLOCKS_H
#define SPECDEC_GGML_BLOCKS_H

#include <stdint.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

/* GGML's type numbers (F32: 16 floats a "block") */
enum { F32 = 0, Q4_0 = 2, Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

/* Bytes one block occupies, and weights it holds (0 for a type neither kernel reads). */
static inline int64_t block_bytes(int type) {
    switch (type) {
    case F32: return 64;
    case Q4_0: return 18;
    case Q5_0: return 22;
    case Q8_0: return 34;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case Q6_K: return 210;
    default: return 0;
    }
}

static inline int64_t block_weights(int type) {
    switch (type) {
    case F32: return 16;
    case Q4_0: case Q5_0: case Q8_0: return 32;
    case Q4_K: case Q5_K: case Q6_K: return 256;
    default: return 0;
    }
}

static inline float half_to_float(const uint8_t *p) { /* exact either way */
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    _Float16 f;
    memcpy(&f, &h, 2);
    return (float)f;
#endif
}

/* Sub-block j's (of 8) 6-bit scale and minimum from a Q4_K (or Q5_K) block's 12 packed bytes s. */
static inline void q4_k_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

#endif
