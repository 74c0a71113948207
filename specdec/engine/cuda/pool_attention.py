"""Attention read straight from the static runner's KV pool: one Triton program per (segment, KV head).

The program holds the segment's queries of every head that shares the KV head (G·S rows, folded as
row g·S + s), and walks the segment's slot in blocks of `BLOCK_N` keys from position 0 up to the
segment's furthest row, with an online softmax in float32, each row masked to keys at or before its own
position. Scores q·kᵀ and p·v run on the tensor cores: bfloat16 in, float32 accumulated (float32 in:
float32 products, not TF32). It writes the rows as the output projection reads them, [B·S, H·D].

What makes a row's bits its own:
- blocks start at absolute positions (0, 64, 128, ...), so the blocks a row sees do not depend on the
  window, the batch or the segment's other rows;
- a block past a row's position adds exactly nothing: its scores are -inf, so the running maximum and
  sum keep their bits (a factor exp(0) = 1, a sum of zeros), and the loop's length (the furthest row)
  therefore does not matter either;
- a tile's row is its own dot products and its own reductions, whatever the other rows hold.

Against the memory-efficient kernel it replaces on CUDA (on an H200: 12.9 µs a layer for a one-user
step, plus 4.7 µs of gathering the window's keys and values into copies and folding the queries), it
reads only the blocks a segment can see and copies nothing: 6.5 µs a layer (docs/PERFORMANCE.md,
"H200, 2026-11-30"). Triton is imported when this module is: import it only where
the kernel runs (CUDA), or under TRITON_INTERPRET=1 (tests on a CPU, where the interpreter has no
bfloat16 matrix product: the dots then run in float32).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

BLOCK_N = 64  # keys a step of the walk reads
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _attend(q_ptr, k_ptr, v_ptr, pos_ptr, slot_ptr, out_ptr,
            stride_qh, stride_qt, stride_ks, stride_kl, stride_kh, stride_vs, stride_vl, stride_vh, stride_ot,
            scale, S: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, FLOAT_DOTS: tl.constexpr, PRECISION: tl.constexpr):
    b = tl.program_id(0)  # segment
    kv = tl.program_id(1)  # KV head
    r = tl.arange(0, BLOCK_M)  # folded rows: r = g·S + s
    real = r < G * S
    s = tl.where(real, r % S, 0)
    head = kv * G + tl.where(real, r // S, 0)
    token = b * S + s
    d = tl.arange(0, D)
    q = tl.load(q_ptr + head[:, None] * stride_qh + token[:, None] * stride_qt + d[None, :],
                mask=real[:, None], other=0.0)  # [BLOCK_M, D]
    if FLOAT_DOTS:
        q = q.to(tl.float32)
    position = tl.load(pos_ptr + token)  # [BLOCK_M]: each row's own
    last = tl.max(position, axis=0)  # the segment's furthest row
    slot = tl.load(slot_ptr + b)
    keys = k_ptr + slot * stride_ks + kv * stride_kh
    values = v_ptr + slot * stride_vs + kv * stride_vh
    top = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running maximum of each row's scores
    total = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp(score - top)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for begin in range(0, last + 1, BLOCK_N):
        n = begin + tl.arange(0, BLOCK_N)
        inside = (n <= last)[:, None]
        k = tl.load(keys + n[:, None] * stride_kl + d[None, :], mask=inside, other=0.0)  # [BLOCK_N, D]
        v = tl.load(values + n[:, None] * stride_vl + d[None, :], mask=inside, other=0.0)
        if FLOAT_DOTS:
            k, v = k.to(tl.float32), v.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [BLOCK_M, BLOCK_N] float32
        scores = tl.where(n[None, :] <= position[:, None], scores, float("-inf"))
        new_top = tl.maximum(top, tl.max(scores, axis=1))
        shrink = tl.exp(top - new_top)  # 0 on the first block; exactly 1 where the block adds nothing
        p = tl.exp(scores - new_top[:, None])
        total = total * shrink + tl.sum(p, axis=1)
        acc = acc * shrink[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        top = new_top
    out = acc / total[:, None]
    tl.store(out_ptr + token[:, None] * stride_ot + head[:, None] * D + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=real[:, None])


@torch.library.custom_op("specdec::pool_attention", mutates_args=())
def pool_attention(q: torch.Tensor, pool_keys: torch.Tensor, pool_values: torch.Tensor, positions: torch.Tensor,
                   slots: torch.Tensor, scale: float) -> torch.Tensor:
    """q [H, B·S, D] (segment b's rows at b·S..), pool_keys/pool_values [slots + 1, L, KV, D] (already
    holding this pass's keys and values), positions [B, S] each row's position, slots [B] each segment's
    slot -> [B·S, H·D] in q's dtype: row (b, s), head h attends over its slot's keys 0..positions[b, s]."""
    H, T, D = q.shape
    B, S = positions.shape
    KV = pool_keys.shape[2]
    assert T == B * S and H % KV == 0 and pool_keys.stride(3) == pool_values.stride(3) == 1
    q = q if q.stride(2) == 1 else q.contiguous()
    out = torch.empty(T, H * D, dtype=q.dtype, device=q.device)
    rows = max(16, triton.next_power_of_2(H // KV * S))
    _attend[(B, KV)](q, pool_keys, pool_values, positions.contiguous(), slots.contiguous(), out,
                     q.stride(0), q.stride(1), pool_keys.stride(0), pool_keys.stride(1), pool_keys.stride(2),
                     pool_values.stride(0), pool_values.stride(1), pool_values.stride(2), out.stride(0),
                     scale, S=S, G=H // KV, D=D, BLOCK_M=rows, BLOCK_N=BLOCK_N, FLOAT_DOTS=INTERPRETED,
                     PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=4, num_stages=2)
    return out


@pool_attention.register_fake
def _(q, pool_keys, pool_values, positions, slots, scale):
    H, T, D = q.shape
    return q.new_empty(T, H * D)
