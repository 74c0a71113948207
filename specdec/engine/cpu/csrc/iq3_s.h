/* IQ3_S super-blocks as Q6_K ones of the same values (specdec/engine/cpu/iq3_s.py says why they are the same):
 * a load's rewrite, block by block. Part of blockquant.c's translation unit.
 *
 * IQ3_S (GGML's 110 bytes): float16 d, 64 low bytes of the grid rows' 9-bit indices, 8 bytes of their ninth bits
 * (index 8b + i: byte b, bit i), 32 sign bytes (bit j of byte b: value 8b + j), 4 bytes of 4-bit scales (one per
 * 32 values, a byte's low nibble first). Q6_K (210 bytes): 128 bytes of low code nibbles, 64 of high code bit
 * pairs, 16 int8 scales (one per 16 values), float16 d. */
#ifndef SPECDEC_IQ3_S_H
#define SPECDEC_IQ3_S_H

/* codes[16 · row + s]: grid row's 4 Q6_K codes (±g + 32, byte j for value j) under the sign bits s. */
static void iq3_s_block_as_q6_k(const uint8_t *in, const uint32_t *codes, uint8_t *out) {
    uint8_t q[256]; /* the block's Q6_K codes, in value order */
    for (int k = 0; k < 64; k++) {
        const int row = in[2 + k] | ((in[66 + k / 8] >> (k % 8)) & 1) << 8;
        const int signs = (in[74 + k / 2] >> (4 * (k % 2))) & 15;
        memcpy(q + 4 * k, &codes[16 * row + signs], 4);
    }
    uint8_t *ql = out, *qh = out + 128;
    for (int half = 0; half < 2; half++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *v = q + 128 * half + l; /* v[0], v[32], v[64], v[96]: the half's four quarters */
            ql[64 * half + l] = (uint8_t)((v[0] & 15) | (v[64] & 15) << 4);
            ql[64 * half + 32 + l] = (uint8_t)((v[32] & 15) | (v[96] & 15) << 4);
            qh[32 * half + l] = (uint8_t)(v[0] >> 4 | (v[32] >> 4) << 2 | (v[64] >> 4) << 4 | (v[96] >> 4) << 6);
        }
    for (int j = 0; j < 16; j++) out[192 + j] = (uint8_t)(1 + 2 * ((in[106 + j / 4] >> (4 * (j / 2 % 2))) & 15));
    memcpy(out + 208, in, 2);
}

/* n IQ3_S super-blocks at in as Q6_K ones into out (n · 210 bytes), with the codes table above. */
void bq_iq3_s_as_q6_k(const uint8_t *in, int64_t n, const uint32_t *codes, uint8_t *out) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) iq3_s_block_as_q6_k(in + i * 110, codes, out + i * 210);
}

#endif
