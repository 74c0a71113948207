"""Causal attention whose result for a query does not depend on what else is computed with it.

A query at position p gets bit-identical output whether it is decoded alone (S = 1), verified
with γ others (S = γ + 1), or prefilled in a chunk of any size. That makes greedy speculative
output equal target-only output by construction, not only up to rounding. Three rules give it:
- keys are processed in fixed blocks of `BLOCK`, so every matmul over the key axis has the same
  reduction length whatever the number of keys;
- query rows are padded to at least `MIN_ROWS`: below that, CPU matmuls take a differently
  rounded path (measured: 1–3 rows differ from ≥ 4 rows by about 1e-6);
- invisible keys (the future, and blocks past the cache's end) get probability exactly 0, and a
  row's max and sums only ever gain exact zeros from them;
- the products over a block go through MKL in its strict mode (`specdec.engine.cpu.features`), which keeps a
  row's bits whatever the other rows on AVX2 and AVX-512; below AVX2 it has none, and `fixed_order_matmul`
  adds each entry's products in order instead;
- the blocks' partial sums are added in one fixed pairwise tree (`block_sum`), never by a reduction
  over the block axis: torch orders those additions by the shape of the rest of the tensor (measured:
  five blocks summed differently for a 6-token verify than for one decoded token, so past 256 cached
  positions the two gave different bits).

Grouped-query attention folds the query heads that share a KV head into the row axis
(q: [kv_heads, groups·S, D]), so repeated KV heads are never materialised.
"""

from __future__ import annotations

import torch

from specdec.engine.cpu.features import rows_need_fixed_order

BLOCK = 64  # keys per block
MIN_ROWS = 4


def visibility(start: int, tokens: int, groups: int, keys: int, device: torch.device) -> torch.Tensor:
    """mask: [rows, keys] bool, True where folded query row (g, s) may see the key.

    Row g·tokens + s is query position start + s of group g; it sees keys [0, start + s].
    Rows are padded to MIN_ROWS (padding rows see key 0 only, and are discarded).
    """
    last = (start + torch.arange(tokens, device=device)).repeat(groups)  # [G·S]
    if last.numel() < MIN_ROWS:
        last = torch.cat([last, last.new_zeros(MIN_ROWS - last.numel())])
    return torch.arange(keys, device=device)[None, :] <= last[:, None]


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor,
           scale: float) -> torch.Tensor:
    """Softmax(q·kᵀ·scale)·v over visible keys, computed block by block.

    query: [KV, M, D]; keys, values: [KV, N·BLOCK, D] (finite everywhere); visible: [M', N·BLOCK]
    with M' = max(M, MIN_ROWS). Returns [KV, M, D] float32.
    """
    kv, rows, dim = query.shape
    padded = visible.shape[0]
    if padded > rows:
        query = torch.cat([query, query.new_zeros(kv, padded - rows, dim)], dim=1)
    blocks = keys.shape[1] // BLOCK
    k = keys.float().view(kv, blocks, BLOCK, dim)
    v = values.float().view(kv, blocks, BLOCK, dim)
    matmul = fixed_order_matmul if query.device.type == "cpu" and rows_need_fixed_order() else torch.matmul
    scores = matmul(query.float()[:, None], k.transpose(-1, -2)) * scale  # [KV, N, M', BLOCK]
    hidden = ~visible.view(padded, blocks, BLOCK).transpose(0, 1)  # [N, M', BLOCK]
    scores = scores.masked_fill(hidden, float("-inf"))
    probs = (scores - scores.amax(dim=(1, 3), keepdim=True)).exp()  # [KV, N, M', BLOCK]
    total = block_sum(probs.sum(dim=-1, keepdim=True))  # [KV, M', 1]
    out = block_sum(matmul(probs, v)) / total  # [KV, M', D]
    return out[:, :rows]


def fixed_order_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a: [..., M, K] @ b: [..., K, N] with each entry's K products added in order, by elementwise operations
    only, so that a row's bits never depend on the other rows. For CPUs where MKL's products do (below AVX2:
    `specdec.engine.cpu.features.rows_need_fixed_order`); K slices of work instead of one call."""
    out = a[..., :, :1] * b[..., :1, :]
    for i in range(1, a.shape[-1]):
        out = out + a[..., :, i:i + 1] * b[..., i:i + 1, :]
    return out


def block_sum(parts: torch.Tensor) -> torch.Tensor:
    """parts: [KV, N, ...] -> [KV, ...]: the N blocks added pairwise in a fixed tree, after padding N with zero
    blocks to a power of two. Elementwise additions only, so each entry's sum is the same sequence of
    additions whatever the other dimensions, on any device; and a block of exact zeros changes no bit of a
    tree (x + 0 = x), so blocks past a query's last key (more blocks for a longer verify) change nothing."""
    blocks = parts.shape[1]
    size = 1 << (blocks - 1).bit_length()
    if size > blocks:
        parts = torch.cat([parts, parts.new_zeros(parts.shape[0], size - blocks, *parts.shape[2:])], dim=1)
    while parts.shape[1] > 1:
        parts = parts[:, 0::2] + parts[:, 1::2]
    return parts[:, 0]
