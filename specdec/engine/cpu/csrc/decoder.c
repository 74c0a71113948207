/* The gguf-q8 path's decoder layers in one call: every layer's norms, integer linears, attention per session
 * and SiLU gating, the residual additions included, in the order specdec/engine/cpu/layer_ops.py runs them
 * one call at a time. The same functions on the same buffers, so the same bits; what goes is the Python
 * between them (about 1 ms of a 0.5B draft's 9 ms step on 2 cores). */
#include <stdint.h>

#include "kernels.h"

typedef struct { /* one q8_matmul of a linear: rows [offset, offset + rows) of its output, in one format */
    int64_t type;
    const uint8_t *weights;
    int64_t rows, cols, offset;
    const float *bias; /* at the part's first output, or NULL */
} dec_part;

typedef struct {
    const dec_part *parts;
    int64_t count, out_features;
} dec_linear;

typedef struct {
    dec_linear qkv, out, gate_up, down;
    const float *input_norm, *post_norm, *q_norm, *k_norm; /* q_norm, k_norm may be NULL */
    float input_eps, post_eps, head_eps;
} dec_layer;

typedef struct { /* one session's tokens in the pass, in row order */
    int64_t tokens, start, capacity, layer_stride; /* layer_stride: the cache's halves between layers */
    uint16_t *keys, *values;                       /* layer 0's [KV, capacity, D], halves */
} dec_step;

typedef struct { /* [rows, width] each: hidden, (H + 2·KV)·D, H·D, hidden, 2·I, I; act: rows' activation blocks */
    float *normed, *qkv, *attended, *projected, *gate_up, *gated;
    act_unit *act;
} dec_buffers;

enum { REFUSED_SHAPES = -1, NO_MEMORY = -2, REFUSED_FORMAT = -3 };

/* y [rows, out_features] = x [rows, K] · Wᵀ + b, x quantized once for every part. */
static int linear(const dec_linear *l, const float *x, int64_t rows, int64_t K, float *y, act_unit *act,
                  int threads) {
    q8_quantize(x, rows, K, act);
    for (int64_t i = 0; i < l->count; i++) {
        const dec_part *p = l->parts + i;
        const int status = q8_matmul((int)p->type, p->weights, p->rows, p->cols, act, rows, y + p->offset,
                                     l->out_features, p->bias, threads);
        if (status) return status == -2 ? NO_MEMORY : REFUSED_FORMAT;
    }
    return 0;
}

static void add_rows(float *h, const float *y, int64_t count) {
    for (int64_t i = 0; i < count; i++) h[i] += y[i];
}

/* Layers [0, count) over h [rows, hidden] (updated in place): the rows are the steps' tokens one after the
 * other; cos, sin [rows, D] at their positions. Each step's cache gains its tokens' keys and values at
 * [start, start + tokens) in every layer (its length is left to the caller). Returns 0; REFUSED_SHAPES or
 * NO_MEMORY from the attention, REFUSED_FORMAT or NO_MEMORY from a linear (h is then partly updated). */
int dec_layers(const dec_layer *layers, int64_t count, float *h, int64_t rows, int64_t hidden, const float *cos,
               const float *sin, const dec_step *steps, int64_t nsteps, int64_t H, int64_t KV, int64_t D,
               float scale, const dec_buffers *b, int threads) {
    const int64_t width = (H + 2 * KV) * D;
    int status;
    for (int64_t index = 0; index < count; index++) {
        const dec_layer *L = layers + index;
        lo_rms_norm(h, rows, hidden, L->input_norm, L->input_eps, b->normed);
        if ((status = linear(&L->qkv, b->normed, rows, hidden, b->qkv, b->act, threads))) return status;
        for (int64_t i = 0, begin = 0; i < nsteps; begin += steps[i].tokens, i++) {
            const dec_step *s = steps + i;
            status = lo_attention(b->qkv + begin * width, s->tokens, H, KV, D, L->q_norm, L->k_norm, L->head_eps,
                                  cos + begin * D, sin + begin * D, s->keys + index * s->layer_stride,
                                  s->values + index * s->layer_stride, s->capacity, s->start, scale,
                                  b->attended + begin * H * D, threads);
            if (status) return status;
        }
        if ((status = linear(&L->out, b->attended, rows, H * D, b->projected, b->act, threads))) return status;
        add_rows(h, b->projected, rows * hidden);
        lo_rms_norm(h, rows, hidden, L->post_norm, L->post_eps, b->normed);
        if ((status = linear(&L->gate_up, b->normed, rows, hidden, b->gate_up, b->act, threads))) return status;
        const int64_t I = L->gate_up.out_features / 2;
        lo_silu_mul(b->gate_up, rows, I, b->gated);
        if ((status = linear(&L->down, b->gated, rows, I, b->projected, b->act, threads))) return status;
        add_rows(h, b->projected, rows * hidden);
    }
    return 0;
}
