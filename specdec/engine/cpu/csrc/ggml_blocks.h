/* GGML's block formats as both kernels read them: type numbers, block sizes, float16 scales, Q4_K's packed
 * 6-bit scales and minimums, Q2_K's layout, Q3_K's packed 6-bit scales, the 32-weight legacy blocks, IQ4's table
 * and IQ4_XS's scales. */
#ifndef SPECDEC_GGML_BLOCKS_H
#define SPECDEC_GGML_BLOCKS_H

#include <stdint.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

/* GGML's type numbers (F32, F16 and BF16: 16 values a "block") */
enum { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12,
       Q5_K = 13, Q6_K = 14, IQ4_NL = 20, IQ4_XS = 23, BF16 = 30 };

/* The quantized formats by X-macro, X(T) once each: those whose codes are unsigned, and those whose codes are
 * signed (Q8_0's, and IQ4's table values). A kernel's switch over them compiles each format's loop on its own. */
#define UNSIGNED_CODE_FORMATS(X) X(Q4_K) X(Q5_K) X(Q6_K) X(Q3_K) X(Q2_K) X(Q5_0) X(Q4_0) X(Q4_1) X(Q5_1)
#define SIGNED_CODE_FORMATS(X) X(Q8_0) X(IQ4_NL) X(IQ4_XS)
#define QUANT_FORMATS(X) UNSIGNED_CODE_FORMATS(X) SIGNED_CODE_FORMATS(X)

/* Bytes one block occupies, and weights it holds (0 for a type neither kernel reads). */
static inline int64_t block_bytes(int type) {
    switch (type) {
    case F32: return 64;
    case F16: case BF16: return 32;
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q5_0: return 22;
    case Q5_1: return 24;
    case Q8_0: return 34;
    case Q2_K: return 84;
    case Q3_K: return 110;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case Q6_K: return 210;
    case IQ4_NL: return 18;
    case IQ4_XS: return 136;
    default: return 0;
    }
}

static inline int64_t block_weights(int type) {
    switch (type) {
    case F32: case F16: case BF16: return 16;
    case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: case IQ4_NL: return 32;
    case Q2_K: case Q3_K: case Q4_K: case Q5_K: case Q6_K: case IQ4_XS: return 256;
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

/* A Q2_K block (84 bytes): scales[16], qs[64], d, dmin (float16). Weight 128c + 32r + l (c < 2, r < 4, l < 32)
 * has the code q = (qs[32c + l] >> 2r) & 3 and the value (d·sc)·q − dmin·m, sc and m the low and high nibble of
 * scales[8c + 2r + l / 16], its 16 weights' scale and min. */
enum { Q2_K_SCALES = 0, Q2_K_QS = 16, Q2_K_D = 80, Q2_K_DMIN = 82 };

/* The code q (0..3) of weight 128c + 32r + l of the Q2_K block at b. */
static inline int q2_k_code(const uint8_t *b, int c, int r, int l) { return (b[Q2_K_QS + 32 * c + l] >> (2 * r)) & 3; }

/* A Q3_K block (110 bytes): hmask[32], qs[64], scales[12], d (float16). Weight 128c + 32r + l (c < 2, r < 4,
 * l < 32) has the code q = its low two bits, (qs[32c + l] >> 2r) & 3, and its third bit, (hmask[l] >> (4c + r)) & 1,
 * as bit 2 (0..7), and the value d·(sc − 32)·(q − 4), sc the 6-bit scale of its 16 weights, 8c + 2r + l / 16. */
enum { Q3_K_HMASK = 0, Q3_K_QS = 32, Q3_K_SCALES = 96, Q3_K_D = 108 };

/* The code q (0..7) of weight 128c + 32r + l of the Q3_K block at b. */
static inline int q3_k_code(const uint8_t *b, int c, int r, int l) {
    return ((b[Q3_K_QS + 32 * c + l] >> (2 * r)) & 3) | (((b[Q3_K_HMASK + l] >> (4 * c + r)) & 1) << 2);
}

/* The 16 scales sc − 32 of a Q3_K block from its 12 packed bytes s: scale j's low four bits in byte j % 8 at bit
 * 4·(j / 8), its high two in byte 8 + j % 4 at bit 2·(j / 4). */
static inline void q3_k_scales(const uint8_t *s, int8_t *sc) {
    for (int j = 0; j < 16; j++)
        sc[j] = (int8_t)((((s[j % 8] >> (4 * (j / 8))) & 15) | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
}

/* A Q4_0, Q4_1, Q5_0 or Q5_1 block at b: weight l (of 32) is d·q + add, q its nibble (l in the low nibble of byte
 * l, 16 + l in its high one) with bit l of *high as its fifth (Q5_0, Q5_1; 0 for the others), add −8d, −16d or m
 * (Q4_1, Q5_1; exact either way: d·q and 8d are, and so is their difference). Returns the 16 nibble bytes. */
static inline const uint8_t *legacy_block(const int type, const uint8_t *b, float *d, float *add, uint32_t *high) {
    const int with_m = type == Q4_1 || type == Q5_1, fifth = type == Q5_0 || type == Q5_1;
    *d = half_to_float(b);
    *add = with_m ? half_to_float(b + 2) : (fifth ? -16.0f : -8.0f) * *d;
    *high = 0;
    if (fifth) memcpy(high, b + (with_m ? 4 : 2), 4);
    return b + (with_m ? 4 : 2) + (fifth ? 4 : 0);
}

/* IQ4_NL and IQ4_XS: each weight a 4-bit index into one table of 16 int8 values (GGML's kvalues_iq4nl), times its
 * block's scale. IQ4_NL's block (18 bytes): d (float16), qs[16], index l in qs[l]'s low nibble, 16 + l in its high
 * one: Q4_0's layout. IQ4_XS's (136 bytes): d (float16), scales_h (16 bits), scales_l[4], qs[128]; block j of 32
 * has Q4_0's layout at qs + 16j and the scale d·(ls − 32), ls its 6-bit code. */
static const int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
enum { IQ4_XS_SCALES_H = 2, IQ4_XS_SCALES_L = 4, IQ4_XS_QS = 8 };

/* Block j's (of 8) 6-bit scale code ls of the IQ4_XS block at b: low four bits in scales_l[j / 2] at 4·(j % 2),
 * high two in scales_h at 2j. */
static inline int iq4_xs_scale_code(const uint8_t *b, int j) {
    const int high = b[IQ4_XS_SCALES_H] | b[IQ4_XS_SCALES_H + 1] << 8;
    return ((b[IQ4_XS_SCALES_L + j / 2] >> (4 * (j % 2))) & 15) | (((high >> (2 * j)) & 3) << 4);
}

#endif
