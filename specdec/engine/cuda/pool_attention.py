"""Attention read straight from the static runner's KV pool: a Triton program per (segment, KV head, part).

The program holds the segment's queries of every head that shares the KV head (G·S rows, folded as
row g·S + s), and walks the segment's slot in blocks of `BLOCK_N` keys from position 0 up to the
segment's furthest row, with an online softmax in float32, each row masked to keys at or before its own
position. Scores q·kᵀ and p·v run on the tensor cores: bfloat16 in, float32 accumulated (float32 in:
float32 products, not TF32). It writes the rows as the output projection reads them, [B·S, H·D].

A long window splits the walk: past SPLIT_N keys, each program walks one part of SPLIT_N keys (parts at
absolute positions 0, SPLIT_N, ...) and writes its rows' running maximum, sum and weighted values; a second
kernel merges each row's parts in order. One program walking 4,000 keys in 63 blocks for each (segment, KV
head), two programs for a lone session, leaves most of a GPU idle; 16 parts of 256 keys spread it.

What makes a row's bits its own:
- blocks start at absolute positions (0, 64, 128, ...), so the blocks a row sees do not depend on the
  window, the batch or the segment's other rows;
- a block past a row's position adds exactly nothing: its scores are -inf, so the running maximum and
  sum keep their bits (a factor exp(0) = 1, a sum of zeros), and the loop's length (the furthest row)
  therefore does not matter either;
- a tile's row is its own dot products and its own reductions, whatever the other rows hold;
- split or not, a row's parts are the same (they begin at absolute positions), a part it sees nothing of
  leaves the merge exactly as it was, and its first part is the unsplit walk's first SPLIT_N keys: so a
  row within the first part has the same bits in a short window (walked whole) as beside a deeper
  neighbour (split), and a deeper row the same bits in any window that holds it.

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


def _split_n(setting: str) -> int:
    """SPECDEC_POOL_SPLIT_N's keys a part (default 256), a positive multiple of BLOCK_N: a window no longer
    than that walks whole, so a value past every window never splits (a split walk timed against a whole one
    in service)."""
    keys = int(setting) if setting.strip().isdigit() else 0
    if keys <= 0 or keys % BLOCK_N:
        raise ValueError(f"SPECDEC_POOL_SPLIT_N must be a positive multiple of {BLOCK_N}, not {setting!r}")
    return keys


SPLIT_N = _split_n(os.environ.get("SPECDEC_POOL_SPLIT_N", "256"))  # keys a program walks in a longer window
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _fold(b, kv, S: tl.constexpr, G: tl.constexpr, BLOCK_M: tl.constexpr):
    """The program's rows r = g·S + s: whether each is real, its head and its token (row of q and out)."""
    r = tl.arange(0, BLOCK_M)
    real = r < G * S
    s = tl.where(real, r % S, 0)
    return real, kv * G + tl.where(real, r // S, 0), b * S + s


@triton.jit
def _walk(q, keys, values, position, begin, end, stride_kl, stride_vl, scale, D: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FLOAT_DOTS: tl.constexpr, PRECISION: tl.constexpr):
    """The online softmax of each row over the keys begin..end-1 it can see (blocks from `begin`, absolute):
    (the largest score, the sum of exp(score - largest), the sum of exp(score - largest)·v). A row that sees
    none of them gets (-inf, 0, 0)."""
    d = tl.arange(0, D)
    top = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running maximum of each row's scores
    total = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp(score - top)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(begin, end, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        inside = (n < end)[:, None]
        k = tl.load(keys + n[:, None] * stride_kl + d[None, :], mask=inside, other=0.0)  # [BLOCK_N, D]
        v = tl.load(values + n[:, None] * stride_vl + d[None, :], mask=inside, other=0.0)
        if FLOAT_DOTS:
            k, v = k.to(tl.float32), v.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [BLOCK_M, BLOCK_N] float32
        scores = tl.where((n[None, :] <= position[:, None]) & (n[None, :] < end), scores, float("-inf"))
        new_top = tl.maximum(top, tl.max(scores, axis=1))
        base = tl.where(new_top == float("-inf"), 0.0, new_top)  # a row that has seen nothing yet stays empty
        shrink = tl.exp(top - base)  # 0 on a row's first block; exactly 1 where the block adds nothing
        p = tl.exp(scores - base[:, None])
        total = total * shrink + tl.sum(p, axis=1)
        acc = acc * shrink[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        top = new_top
    return top, total, acc


@triton.jit
def _attend(q_ptr, k_ptr, v_ptr, pos_ptr, slot_ptr, out_ptr, top_ptr, total_ptr, acc_ptr,
            stride_qh, stride_qt, stride_ks, stride_kl, stride_kh, stride_vs, stride_vl, stride_vh, stride_ot,
            scale, T, H, S: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, SPLIT_N: tl.constexpr, SPLIT: tl.constexpr, FLOAT_DOTS: tl.constexpr,
            PRECISION: tl.constexpr):
    """Program (segment, KV head, part): without SPLIT the whole walk, written to out; with it, the keys
    part·SPLIT_N.. of SPLIT_N, its (top, total, acc) written for `_merge` (nothing where the part begins past
    the segment's furthest row)."""
    b, kv = tl.program_id(0), tl.program_id(1)
    real, head, token = _fold(b, kv, S, G, BLOCK_M)
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
    if SPLIT:
        begin = tl.program_id(2).to(tl.int64) * SPLIT_N  # as wide as the positions, which end the walk
        top, total, acc = _walk(q, keys, values, position, begin, tl.minimum(begin + SPLIT_N, last + 1), stride_kl,
                                stride_vl, scale, D, BLOCK_M, BLOCK_N, FLOAT_DOTS, PRECISION)
        row = tl.program_id(2) * T * H + token * H + head  # [BLOCK_M]: the part's (token, head)
        wanted = real & (tl.full([BLOCK_M], 0, tl.int32) + begin <= last)  # nothing where the part begins past it
        tl.store(top_ptr + row, top, mask=wanted)
        tl.store(total_ptr + row, total, mask=wanted)
        tl.store(acc_ptr + row[:, None] * D + d[None, :], acc, mask=wanted[:, None])
    else:
        top, total, acc = _walk(q, keys, values, position, 0, last + 1, stride_kl, stride_vl, scale, D, BLOCK_M,
                                BLOCK_N, FLOAT_DOTS, PRECISION)
        out = acc / total[:, None]
        tl.store(out_ptr + token[:, None] * stride_ot + head[:, None] * D + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=real[:, None])


@triton.jit
def _merge(pos_ptr, out_ptr, top_ptr, total_ptr, acc_ptr, stride_ot, T, H, S: tl.constexpr, G: tl.constexpr,
           D: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT_N: tl.constexpr):
    """Program (segment, KV head): its rows' parts merged in order, from the first; a part a row sees nothing
    of leaves it exactly as it was, so a row within the first part has the unsplit walk's bits."""
    real, head, token = _fold(tl.program_id(0), tl.program_id(1), S, G, BLOCK_M)
    d = tl.arange(0, D)
    last = tl.max(tl.load(pos_ptr + token), axis=0)
    row = token * H + head
    top = tl.load(top_ptr + row, mask=real, other=0.0)
    total = tl.load(total_ptr + row, mask=real, other=1.0)
    acc = tl.load(acc_ptr + row[:, None] * D + d[None, :], mask=real[:, None], other=0.0)
    for part in range(1, tl.cdiv(last + 1, SPLIT_N)):
        at = part * T * H + row
        part_top = tl.load(top_ptr + at, mask=real, other=float("-inf"))
        part_total = tl.load(total_ptr + at, mask=real, other=0.0)
        part_acc = tl.load(acc_ptr + at[:, None] * D + d[None, :], mask=real[:, None], other=0.0)
        seen = part_top != float("-inf")
        new_top = tl.maximum(top, part_top)
        mine, theirs = tl.exp(top - new_top), tl.exp(part_top - new_top)
        total = tl.where(seen, total * mine + part_total * theirs, total)
        acc = tl.where(seen[:, None], acc * mine[:, None] + part_acc * theirs[:, None], acc)
        top = tl.where(seen, new_top, top)
    out = acc / total[:, None]
    tl.store(out_ptr + token[:, None] * stride_ot + head[:, None] * D + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=real[:, None])


@torch.library.custom_op("specdec::pool_attention", mutates_args=())
def pool_attention(q: torch.Tensor, pool_keys: torch.Tensor, pool_values: torch.Tensor, positions: torch.Tensor,
                   slots: torch.Tensor, scale: float, window: int) -> torch.Tensor:
    """q [H, B·S, D] (segment b's rows at b·S..), pool_keys/pool_values [slots + 1, L, KV, D] (already
    holding this pass's keys and values), positions [B, S] each row's position, below `window`; slots [B]
    each segment's slot -> [B·S, H·D] in q's dtype: row (b, s), head h attends over its slot's keys
    0..positions[b, s]. A window past SPLIT_N splits each walk into parts of SPLIT_N keys, one program
    each, merged in order: a row's bits depend on its position alone, not on the window."""
    H, T, D = q.shape
    B, S = positions.shape
    KV = pool_keys.shape[2]
    assert T == B * S and H % KV == 0 and pool_keys.stride(3) == pool_values.stride(3) == 1 and window > 0
    q = q if q.stride(2) == 1 else q.contiguous()
    positions, slots = positions.contiguous(), slots.contiguous()
    out = torch.empty(T, H * D, dtype=q.dtype, device=q.device)
    parts = -(-window // SPLIT_N)
    if parts > 1:  # each part's (top, total, acc) per (token, head), for `_merge`
        top = torch.empty(parts, T, H, dtype=torch.float32, device=q.device)
        total = torch.empty_like(top)
        acc = torch.empty(parts, T, H, D, dtype=torch.float32, device=q.device)
    else:  # the whole walk writes `out` itself: no parts to keep
        top = total = acc = out
    rows = max(16, triton.next_power_of_2(H // KV * S))
    _attend[(B, KV, parts)](q, pool_keys, pool_values, positions, slots, out, top, total, acc,
                            q.stride(0), q.stride(1), pool_keys.stride(0), pool_keys.stride(1), pool_keys.stride(2),
                            pool_values.stride(0), pool_values.stride(1), pool_values.stride(2), out.stride(0),
                            scale, T, H, S=S, G=H // KV, D=D, BLOCK_M=rows, BLOCK_N=BLOCK_N, SPLIT_N=SPLIT_N,
                            SPLIT=parts > 1, FLOAT_DOTS=INTERPRETED,
                            PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=4, num_stages=2)
    if parts > 1:
        _merge[(B, KV)](positions, out, top, total, acc, out.stride(0), T, H, S=S, G=H // KV, D=D, BLOCK_M=rows,
                        SPLIT_N=SPLIT_N, num_warps=4)
    return out


@pool_attention.register_fake
def _(q, pool_keys, pool_values, positions, slots, scale, window):
    H, T, D = q.shape
    return q.new_empty(T, H * D)
