/* The gguf-q8 path's packing: weights repacked once at load into the unit layout (q8unit.h), and activation
 * rows quantized into it, both as the definition in q8dot.c has them. */
#include <stdint.h>
#include <string.h>

#include "ggml_blocks.h"
#include "kernels.h"
#include "q8unit.h"

int64_t q8_row_bytes(int type, int64_t K) { return repacked_row_bytes(type, K); }
int64_t q8_act_bytes(int64_t K) { return units(K) * (int64_t)sizeof(act_unit); }

/* The quants of one GGML block (256 or 32 weights) as integers q[k] (before any offset; IQ4's table indices). */
static void decode_block(int type, const uint8_t *b, int8_t *q) {
    if (type == Q4_K || type == Q5_K) { /* Q5_K: qh[32] before the nibbles, bit 2j of qh[l] the low one's 5th */
        const uint8_t *qs = b + (type == Q5_K ? 48 : 16);
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                const uint8_t h = type == Q5_K ? b[16 + l] : 0;
                q[64 * j + l] = (qs[32 * j + l] & 15) | (((h >> (2 * j)) & 1) << 4);
                q[64 * j + 32 + l] = (qs[32 * j + l] >> 4) | (((h >> (2 * j + 1)) & 1) << 4);
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
    } else if (type == Q3_K) {
        for (int c = 0; c < 2; c++)
            for (int r = 0; r < 4; r++)
                for (int l = 0; l < 32; l++) q[128 * c + 32 * r + l] = (int8_t)q3_k_code(b, c, r, l);
    } else if (type == Q2_K) {
        for (int c = 0; c < 2; c++)
            for (int r = 0; r < 4; r++)
                for (int l = 0; l < 32; l++) q[128 * c + 32 * r + l] = (int8_t)q2_k_code(b, c, r, l);
    } else if (type == IQ4_XS) { /* block j of 32: Q4_0's layout at qs + 16j */
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < 16; l++) {
                q[32 * j + l] = b[IQ4_XS_QS + 16 * j + l] & 15;
                q[32 * j + 16 + l] = b[IQ4_XS_QS + 16 * j + l] >> 4;
            }
    } else if (type != Q8_0) { /* Q4_0's layout: Q4_0, Q4_1, Q5_0, Q5_1 (with their fifth bits), IQ4_NL */
        float d, add;
        uint32_t high = 0;
        const uint8_t *qs = type == IQ4_NL ? b + 2 : legacy_block(type, b, &d, &add, &high);
        for (int l = 0; l < 16; l++) {
            q[l] = (qs[l] & 15) | (((high >> l) & 1) << 4);
            q[16 + l] = (qs[l] >> 4) | (((high >> (16 + l)) & 1) << 4);
        }
    } else { /* Q8_0 */
        memcpy(q, b + 2, 32);
    }
}

/* Nibbles of a unit's quants in unit order (chunks of cb bytes): byte p of half h holds chunk 2h's (low) and
 * 2h + 1's (high). */
static void pack_nibbles(const int8_t *ordered, uint8_t *out, int cb) {
    for (int h = 0; h < 4; h++)
        for (int p = 0; p < cb; p++) out[cb * h + p] = (ordered[2 * cb * h + p] & 15) | ((ordered[2 * cb * h + cb + p] & 15) << 4);
}

/* Bit `bit` of a unit's quants in unit order (the 5th of Q5_0's and Q5_K's, after their nibbles): a 64-bit word
 * holds 64 / cb chunks; byte p of chunk c is bit (cb / 8) · (c % (64 / cb)) + p / 8 of the word's byte p % 8 (so one
 * shift a 64-bit lane spreads them). */
static void pack_bit_plane(const int8_t *ordered, uint8_t *plane, int cb, int bit) {
    const int per_word = 64 / cb;
    for (int c = 0; c < 8; c++)
        for (int p = 0; p < cb; p++)
            plane[8 * (c / per_word) + p % 8] |= ((ordered[cb * c + p] >> bit) & 1)
                                                 << ((cb / 8) * (c % per_word) + p / 8);
}

/* `width` bits (1 or 2) of a unit's quants in unit order, from bit `bit` (Q6_K's high pair, Q3_K's low pair and its
 * third bit, Q2_K's codes): byte p of piece c / (8 / width) holds chunk c's at bit width · (c % (8 / width)), so
 * that a chunk's come from one load, one shift and one mask. */
static void pack_bit_slices(const int8_t *ordered, uint8_t *out, int cb, int bit, int width) {
    const int per_byte = 8 / width, mask = (1 << width) - 1;
    for (int c = 0; c < 8; c++)
        for (int p = 0; p < cb; p++)
            out[cb * (c / per_byte) + p] |= ((ordered[cb * c + p] >> bit) & mask) << (width * (c % per_byte));
}

/* W [N, K] in GGML blocks -> the unit layout of q8unit.h (`q8_row_bytes(type, K)` bytes a row).
 * Returns 0, or -1 for a type this path does not take or a K that is not a whole number of blocks. */
int q8_repack(int type, const uint8_t *w, int64_t N, int64_t K, uint8_t *out) {
    if (!sb_bytes(type) || K % block_weights(type)) return -1;
    const int64_t in_row = K / block_weights(type) * block_bytes(type), out_row = repacked_row_bytes(type, K);
    const int64_t nu = units(K), blocks_in = K / block_weights(type);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *src = w + n * in_row;
        uint8_t *dst = out + n * out_row;
        memset(dst, 0, out_row);
        for (int64_t i = 0; i < nu; i++) {
            const int half = half_tail(K) && i == nu - 1, sbu = half ? 1 : SB_PER_UNIT, cb = half ? CHUNK / 2 : CHUNK;
            int8_t natural[UNIT] = {0}, ordered[UNIT];
            uint8_t *o = dst + i * unit_bytes(type);
            if (block_weights(type) == SB) {
                for (int s = 0; s < sbu && i * SB_PER_UNIT + s < blocks_in; s++) {
                    const uint8_t *b = src + (i * SB_PER_UNIT + s) * block_bytes(type);
                    decode_block(type, b, natural + SB * s);
                    if (type == Q6_K) {
                        memcpy(o + 2 * s, b + 208, 2);
                        memcpy(o + 2 * sbu + 16 * s, b + 192, 16);
                    } else if (type == Q3_K) {
                        memcpy(o + 2 * s, b + Q3_K_D, 2);
                        q3_k_scales(b + Q3_K_SCALES, (int8_t *)o + 2 * sbu + 16 * s);
                    } else if (type == Q2_K) {
                        memcpy(o + 2 * s, b + Q2_K_D, 2);
                        memcpy(o + 2 * sbu + 2 * s, b + Q2_K_DMIN, 2);
                        memcpy(o + 4 * sbu + 16 * s, b + Q2_K_SCALES, 16);
                    } else if (type == IQ4_XS) {
                        memcpy(o + 2 * s, b, 2);
                        for (int j = 0; j < 8; j++) o[2 * sbu + 8 * s + j] = (uint8_t)iq4_xs_scale_code(b, j);
                    } else {
                        memcpy(o + 2 * s, b, 2);               /* d */
                        memcpy(o + 2 * sbu + 2 * s, b + 2, 2); /* dmin */
                        for (int j = 0; j < 8; j++)
                            q4_k_scale_min(b + 4, j, o + 4 * sbu + 8 * s + j, o + 12 * sbu + 8 * s + j);
                    }
                }
            } else {
                for (int j = 0; j < 8 * sbu && i * 8 * SB_PER_UNIT + j < blocks_in; j++) {
                    const uint8_t *b = src + (i * 8 * SB_PER_UNIT + j) * block_bytes(type);
                    decode_block(type, b, natural + 32 * j);
                    memcpy(o + 2 * j, b, 2);
                    if (type == Q4_1 || type == Q5_1) memcpy(o + 16 * sbu + 2 * j, b + 2, 2); /* m */
                }
            }
            to_unit_order(natural, ordered, cb);
            if (type == Q4_K || type == Q5_K) {
                pack_nibbles(ordered, o + 20 * sbu, cb);
                if (type == Q5_K) pack_bit_plane(ordered, o + 20 * sbu + 4 * cb, cb, 4);
            } else if (type == Q6_K) {
                pack_nibbles(ordered, o + 18 * sbu, cb);
                pack_bit_slices(ordered, o + 18 * sbu + 4 * cb, cb, 4, 2);
            } else if (type == Q3_K) {
                pack_bit_slices(ordered, o + 18 * sbu, cb, 0, 2);
                pack_bit_slices(ordered, o + 18 * sbu + 2 * cb, cb, 2, 1);
            } else if (type == Q2_K) {
                pack_bit_slices(ordered, o + 20 * sbu, cb, 0, 2);
            } else if (type == IQ4_XS) {
                pack_nibbles(ordered, o + 10 * sbu, cb);
            } else if (type != Q8_0) { /* Q4_0's layout (Q4_1, Q5_1: after m), then Q5_0's and Q5_1's fifth bits */
                const int64_t at = (type == Q4_1 || type == Q5_1 ? 32 : 16) * sbu;
                pack_nibbles(ordered, o + at, cb);
                if (type == Q5_0 || type == Q5_1) pack_bit_plane(ordered, o + at + 4 * cb, cb, 4);
            } else {
                memcpy(o + 16 * sbu, ordered, 8 * cb);
            }
        }
    }
    return 0;
}

/* The quantization on the CPU's own vectors (vectors.h's vpiece): every step is lane by lane or an exact integer
 * sum or maximum, so any width gives the same bits; GCC splits a 16-lane vector wider than the CPU's through
 * memory (measured on AVX2: 3.3 ns a value, against 1.0 this way). */
typedef int8_t qb __attribute__((vector_size(PIECE_LANES)));

/* A piece's |x| lane by lane folded into m (|x| with the sign bit cleared, and taken only where larger, as the
 * scalar `v > amax` would: zeros of either sign and NaNs never). */
static inline vpiece fold_amax(vpiece m, vpiece x) {
    const vpiece magnitude = (vpiece)((vpiece_i)x & 0x7fffffff);
    return piece_pick(magnitude > m, magnitude, m);
}

/* round-half-even(v) (`piece_round`), then clamped to ±127: an int32 a lane. */
static inline vpiece_i quant_lanes(vpiece v) {
    vpiece_i q = __builtin_convertvector(piece_round(v), vpiece_i);
    q = (q & (q <= 127)) | (127 & (q > 127));
    return (q & (q >= -127)) | (-127 & (q < -127));
}

/* x [S, K] float32 -> S rows of `units(K)` activation units (the definition's quantization, a piece at a time:
 * every step lane by lane as the definition has it, so the same bits as value by value). */
void q8_quantize(const float *x, int64_t S, int64_t K, act_unit *out) {
    const int64_t nu = units(K);
    for (int64_t s = 0; s < S; s++) {
        const float *row = x + s * K;
        for (int64_t i = 0; i < nu; i++) {
            act_unit *a = out + s * nu + i;
            int8_t natural[UNIT] __attribute__((aligned(64))) = {0}; /* the quants in natural order */
            for (int l = 0; l < BLOCKS; l++) {
                const int64_t k0 = i * UNIT + 32 * l;
                float dx = 0.0f;
                int32_t sums[2] = {0, 0};
                if (k0 < K) {
                    vpiece block[32 / PIECE_LANES], m = {0};
                    memcpy(block, row + k0, sizeof block);
                    for (int p = 0; p < 32 / PIECE_LANES; p++) m = fold_amax(m, block[p]);
                    float amax = 0.0f;
                    for (int k = 0; k < PIECE_LANES; k++) amax = m[k] > amax ? m[k] : amax;
                    dx = amax / 127.0f;
                    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
                    for (int p = 0; p < 32 / PIECE_LANES; p++) {
                        const vpiece_i q = quant_lanes(block[p] * inv);
                        for (int k = 0; k < PIECE_LANES; k++) sums[p * PIECE_LANES / 16] += q[k];
                        const qb bytes = __builtin_convertvector(q, qb);
                        memcpy(natural + 32 * l + PIECE_LANES * p, &bytes, PIECE_LANES);
                    }
                }
                a->dx[l] = dx;
                a->bsum[l] = sums[0] + sums[1];
                a->dx_bsum[l] = dx * (float)(sums[0] + sums[1]);
                a->halves[l] = (int32_t)((uint32_t)(uint16_t)sums[0] | (uint32_t)(uint16_t)sums[1] << 16);
#if !SCALE_PAIRS
                a->half_start[0][l] = -32 * sums[0];
                a->half_start[1][l] = -32 * sums[1];
#endif
            }
            to_unit_order(natural, a->u, CHUNK);
        }
    }
}

