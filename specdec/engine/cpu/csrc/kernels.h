/* The gguf-q8 library's functions that its other files call: the integer kernel (q8dot.c) and the layers'
 * float steps (layer_ops.c). Each file's own comments state the contracts. */
#ifndef SPECDEC_KERNELS_H
#define SPECDEC_KERNELS_H

#include <stdint.h>

typedef struct act_unit act_unit; /* one row's activation unit (q8dot.c) */

void q8_quantize(const float *x, int64_t S, int64_t K, act_unit *out);
int q8_matmul(int type, const uint8_t *w, int64_t N, int64_t K, const act_unit *act, int64_t S, float *y,
              int64_t ldy, const float *bias, int threads);

void lo_rms_norm(const float *x, int64_t S, int64_t K, const float *w, float eps, float *out);
void lo_silu_mul(const float *gate_up, int64_t S, int64_t I, float *out);
int lo_attention(const float *qkv, int64_t S, int64_t H, int64_t KV, int64_t D, const float *q_norm,
                 const float *k_norm, float eps, const float *cos, const float *sin, uint16_t *keys, uint16_t *values,
                 int64_t capacity, int64_t start, float scale, float *out, int threads);

#endif
