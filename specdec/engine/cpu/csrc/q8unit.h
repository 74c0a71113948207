/* The gguf-q8 path's unit layout, shared by its kernel (q8dot.c) and its packing (q8pack.c).
 *
 * Each build works in units of 8 chunks of CHUNK bytes (64 with AVX-512BW, else 32), so UNIT = 8 ·
 * CHUNK weights and BLOCKS = CHUNK / 4 blocks a unit. Byte p of chunk c is the unit's weight
 * 32·(p / 4) + 4·c + p % 4: a 4-byte integer dot at lane p / 4 always stays inside block p / 4, chunks
 * 0-3 its first half and 4-7 its second, and the 8 chunks' dots give every block's sum with no lanes to
 * fold. The weights are repacked once at load (`q8_repack`) into that order, the bytes of a unit those of
 * its super-blocks, reordered (a row's bytes are its super-blocks', the 32-weight formats zero-padded to
 * whole super-blocks). With AVX-512 a row of an odd number of super-blocks ends in a half unit, stored in
 * the 32-byte chunks' order (a chunk's first half), whose missing blocks dot to zero against zero
 * activations. The activations are quantized into the same order.
 */
#ifndef SPECDEC_Q8UNIT_H
#define SPECDEC_Q8UNIT_H

#include <stdint.h>
#include <string.h>

#include "ggml_blocks.h"
#include "vectors.h"

enum { SB = 256 }; /* weights of a K-quant super-block */

#if defined(__AVX512BW__) && !defined(Q8_PORTABLE)
#define CHUNK 64
#else
#define CHUNK 32
#endif
enum { UNIT = 8 * CHUNK, BLOCKS = CHUNK / 4, SB_PER_UNIT = UNIT / SB, UNITS_PER_ACC = LANES / BLOCKS };

typedef float vl __attribute__((vector_size(CHUNK)));   /* a unit's blocks, one a lane */
typedef int32_t vli __attribute__((vector_size(CHUNK)));
typedef uint32_t vlu __attribute__((vector_size(CHUNK)));
typedef uint64_t vw __attribute__((vector_size(CHUNK))); /* a chunk's bytes, for byte arithmetic */
#define BYTES(b) (0x0101010101010101ull * (b))

/* How the two half scales of Q6_K, Q3_K and Q2_K reach a block's sum: without VNNI as the int16 pair (sc, sc) a
 * lane that vpmaddwd widens the pair sums with (the activations carry their halves' Σu as int16 pairs); with VNNI,
 * and in portable C, the two half sums start at −32·Σu (Q3_K's at −4·Σu, Q2_K's at 0) and are converted and
 * multiplied in float32, exact because every product and the sum are integers below 2^24 (no vpmulld). */
#if defined(Q8_PORTABLE) || defined(__AVX512VNNI__) || defined(__AVXVNNI__)
#define SCALE_PAIRS 0
#else
#define SCALE_PAIRS 1
#endif

/* One activation unit: its quants in unit order, and per block dx, Σu, dx·Σu, its halves' Σu (Q2_K's half mins
 * and, without VNNI, Q6_K's and Q3_K's offsets take them) and with VNNI where Q6_K's and Q3_K's half sums start
 * (their codes less 32 and 4, a half at a time). */
typedef struct act_unit {
    int8_t u[UNIT];
    float dx[BLOCKS];
    int32_t bsum[BLOCKS];
    float dx_bsum[BLOCKS]; /* dx · Σu, the factor of Q4_K's and Q5_K's min term */
    int32_t halves[BLOCKS]; /* Σu of the first and second 16 values, as int16: first low, second high */
#if !SCALE_PAIRS
    int32_t half_start[2][BLOCKS]; /* −32 · Σu of the first and second 16 values: Q6_K's half sums start there,
                                    * Q3_K's at an eighth of it */
#endif
} act_unit;

/* ---- repacked units ----
 * A unit holds SB_PER_UNIT super-blocks' bytes (8 · SB_PER_UNIT blocks of the 32-weight formats):
 * Q4_K: d[n], dmin[n] (f16), sc[8n], m[8n] (6-bit values in bytes), then 4 · CHUNK bytes of nibbles;
 * Q5_K: Q4_K's layout, then CHUNK bytes of 5th bits (as Q5_0's);
 * Q6_K: d[n] (f16), sc[16n] (int8), 4 · CHUNK bytes of low nibbles, 2 · CHUNK of high bit pairs;
 * Q3_K: Q6_K's d[n] and sc[16n] (its scales less 32), then 2 · CHUNK bytes of low bit pairs (laid out as Q6_K's
 * high ones), CHUNK of third bits (bit c of byte p: chunk c's);
 * Q2_K: d[n], dmin[n] (f16), its scale bytes[16n] (sc in the low nibble, m in the high one: GGML's), 2 · CHUNK
 * bytes of codes (laid out as Q3_K's low bit pairs);
 * Q5_0: d[8n] (f16), 4 · CHUNK bytes of low nibbles, CHUNK of 5th bits; Q4_1 and Q5_1: Q4_0's and Q5_0's with
 * m[8n] (f16) after d; Q4_0 and IQ4_NL: d[8n] (f16), 4 · CHUNK
 * bytes of nibbles (IQ4_NL's table indices); IQ4_XS: d[n] (f16), ls[8n] (its 6-bit scale codes in bytes), 4 · CHUNK
 * bytes of table indices; Q8_0: d[8n] (f16), UNIT int8.
 * A half unit is the same with n = 1 and chunks of CHUNK / 2 bytes. */
static inline int64_t sb_bytes(int type) {
    switch (type) {
    case Q4_K: return 148;
    case Q5_K: return 180;
    case Q6_K: return 210;
    case Q3_K: return 114;
    case Q2_K: return 84;
    case Q5_0: return 176;
    case Q4_0: case IQ4_NL: return 144;
    case Q4_1: return 160;
    case Q5_1: return 192;
    case IQ4_XS: return 138;
    case Q8_0: return 272;
    default: return 0;
    }
}

static inline int64_t unit_bytes(int type) { return SB_PER_UNIT * sb_bytes(type); }
static inline int64_t superblocks(int64_t K) { return (K + SB - 1) / SB; }
static inline int64_t units(int64_t K) { return (K + UNIT - 1) / UNIT; }
/* Whether a row of K ends in a half unit (AVX-512: an odd number of super-blocks). */
static inline int half_tail(int64_t K) { return SB_PER_UNIT == 2 && superblocks(K) % 2; }
/* A repacked row's bytes: its super-blocks', reordered. */
static inline int64_t repacked_row_bytes(int type, int64_t K) { return superblocks(K) * sb_bytes(type); }

/* 8 · cb quants from natural order into the order of chunks of cb bytes (above): the 4-byte word c of
 * block l, at word c · cb / 4 + l. cb is CHUNK, or CHUNK / 2 for a half unit. */
static inline void to_unit_order(const int8_t *natural, int8_t *ordered, int cb) {
    uint32_t in[UNIT / 4], out[UNIT / 4];
    memcpy(in, natural, 8 * cb);
    for (int l = 0; l < cb / 4; l++)
        for (int c = 0; c < 8; c++) out[c * cb / 4 + l] = in[8 * l + c];
    memcpy(ordered, out, 8 * cb);
}

#endif
