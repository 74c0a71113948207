"""`StaticRunner`: `ModelRunner`'s model and kernels, run at fixed shapes over a preallocated KV pool.

Every pass is cut into segments of at most `rows` tokens (γ_max + 1): a draft step or a verify block
is one segment, a prompt several consecutive ones. Segments are packed into pieces of shape
[sessions, rows] with sessions ∈ `SESSION_BUCKETS`, padded with zero tokens and with scratch
segments. Consecutive segments of one prompt may share a piece: every segment's keys and values are
written before any row attends, so a later segment sees an earlier one's.

A token's logits therefore come from one kernel sequence whatever γ, the batch, the prompt's
chunking or the other sessions: a one-token step and a γ+1 verify run the same kernels, and rows
never mix inside a kernel (each output row is its own dot products, each query row its own softmax).
On CUDA each bucket is a CUDA graph captured at start-up (`graphs.GraphBank`) and replayed: one
launch per piece instead of hundreds. A piece's inputs (ids, positions, slots) go to the device as one host
tensor, one copy; the rows its steps keep come out in one copy too, before the next piece runs (two pieces of
a pass may replay one graph, whose output the second replay overwrites). On CUDA by default
(SPECDEC_STATIC_COMPILE=0 turns it off, =1 on elsewhere), one decoder layer runs through torch.compile, which
fuses its norms, rotary embeddings, pool writes, activations and residual adds: every layer calls the same
compiled code (its weights and pool tensors are arguments), with the segment count its one dynamic size, so
one compilation serves every layer and every bucket. Compiled, the smallest bucket is two segments, so that no piece is the size-1 case a
compiler specialises apart. On CPU the same code runs eagerly (compiled too when asked, which is how CI
tests the compiled layer's invariance).

Attention reads the first L positions of each segment's slot, masked to key position ≤ query position,
where L is the piece's context bucket: the smallest of 256, 512, 1024, ... (and the whole slot) that holds
its furthest position. A piece of short sessions reads a short window instead of the whole slot (measured on
an H200, attention over all 4,105 positions was 72% of the target's compiled step). The bucket is each CUDA
graph's second size, and a row's result does not depend on it: past a row's own position every key is
masked, and the kernel (the memory-efficient one, pinned on CUDA; the heads that share a KV head folded
into its query rows) adds nothing for a block of masked keys, exactly, so a longer window gives the same
bits (tested beside a neighbour in a longer bucket). CPU attention's bits do depend on the window (measured:
17 of 33 positions below 256 changed beside a neighbour in the 512 window, with the flash and the math kernel
alike), so on CPU every piece attends over the longest window: slower there, and the same bits. Padding rows
write past their session's length, where the next real token overwrites them before anything reads them.

On CUDA the attention is by default `specdec.engine.cuda.pool_attention` (Triton; SPECDEC_STATIC_ATTENTION=sdpa
keeps the memory-efficient kernel): it reads each segment's slot in place, in blocks of absolute positions, up
to the segment's furthest row (a window past 256 keys in parts of 256, merged in order), so neither the window
nor the neighbours change a row's bits, and the gathered copies of the window's keys and values are gone. On an
H200 it made the target's replayed step 12% shorter and the draft's 27% (docs/PERFORMANCE.md, "H200, 2026-11-30").
"""

from __future__ import annotations

import logging
import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from specdec.engine.kernels import DenseKernel
from specdec.engine.measure import synchronize
from specdec.engine.runner import Collectives, ModelRunner, Step
from specdec.engine.static.graphs import GraphBank
from specdec.engine.static.pool import KVPool, SlotCache

log = logging.getLogger(__name__)

SESSION_BUCKETS = (2, 4, 8)  # segments per piece (and 1 when not compiled)
DEFAULT_CONTEXT = 4096  # positions per slot unless the model's context is shorter
SMALLEST_WINDOW = 256  # keys the shortest context bucket attends over; every window is a multiple


def context_buckets(length: int) -> list[int]:
    """Key windows a piece may attend over: 256, 512, ... below `length`, then `length` itself."""
    buckets, window = [], SMALLEST_WINDOW
    while window < length:
        buckets.append(window)
        window *= 2
    return [*buckets, length]


@dataclass
class _Segment:
    step: int  # index of its step in the pass
    slot: int
    start: int  # position of its first token
    tokens: list[int]
    keep: int  # how many of its last rows' logits its step returns


class StaticRunner(ModelRunner):
    """slots: sessions the pool holds; context: positions per session (capped at the model's);
    rows: tokens per segment (γ_max + 1, so a verify is one segment); graphs: capture CUDA graphs (default: on CUDA);
    compile: run each layer through torch.compile (default: SPECDEC_STATIC_COMPILE, else on CUDA only);
    attention: "pool" (`specdec.engine.cuda.pool_attention`, Triton) or "sdpa" (default: SPECDEC_STATIC_ATTENTION,
    else "pool" on CUDA where Triton runs it)."""

    def __init__(self, model: nn.Module, path: str = "bf16", collectives: Collectives | None = None,
                 slots: int = 64, context: int = DEFAULT_CONTEXT, rows: int = 9,
                 fp32_kernel: str = "dense", graphs: bool | None = None, compile: bool | None = None,
                 attention: str | None = None):
        super().__init__(model, path, fp32_kernel=fp32_kernel, collectives=collectives)
        self.max_context = min(self.max_context, context)
        self.rows = rows
        self.windows = context_buckets(-(-(self.max_context + self.rows) // SMALLEST_WINDOW) * SMALLEST_WINDOW)
        # One position past the longest window, never attended: compiled, a window as long as the pool would be
        # a contiguous view where the others are not, and the compiler would specialise the window's length.
        self.pool = KVPool(len(self.layers), slots, self.windows[-1] + 1, self.kv_heads, self.head_dim,
                           self.act_dtype, self.device)
        self._key_positions = {w: torch.arange(w, device=self.device) for w in self.windows}
        self.attention = self._attention_kernel(attention)
        self.attention_backends = self._pinned_attention_backends() if self.attention == "sdpa" else None
        use_graphs = self.device.type == "cuda" if graphs is None else graphs
        if compile is None:  # on CUDA by default: on an H200 it made the target's replayed step 1.8x faster
            compile = os.environ.get("SPECDEC_STATIC_COMPILE", "1" if self.device.type == "cuda" else "0") == "1"
        if compile and not all(isinstance(k, DenseKernel) for k in self.linear_kernels()):
            log.warning("the %s path's kernels cannot be compiled: the static runner's layers run eagerly", path)
            compile = False
        # Measured on an H100, the whole piece compiled made the target's step 2.5x slower: the pool was then
        # one tensor, and each write into a layer's view of it became a copy of the whole pool; and it took
        # 100-190 s to start, recompiling per bucket. The pool is now a tensor per layer (written in place),
        # and one layer is compiled, once (tests/test_static_runner.py).
        self.compiled = compile
        self.layer_step = torch.compile(self._layer_step) if compile else self._layer_step
        self.graphs = GraphBank(self._piece, self.device) if use_graphs else None
        self.vocab = self.embed.num_embeddings

    @property
    def session_buckets(self) -> tuple[int, ...]:
        """Segments per piece. Compiled, a bucket of one would be specialised apart; eager, cuBLAS gave the same
        row bits for 1..72 rows at these shapes (tested on the GPU: tests/test_cuda.py)."""
        return SESSION_BUCKETS if self.compiled else (1, *SESSION_BUCKETS)

    def _attention_kernel(self, asked: str | None) -> str:
        """"pool" or "sdpa": as asked, else SPECDEC_STATIC_ATTENTION, else "pool" on CUDA where Triton compiles
        and runs it on this model's shapes (tried once here), else "sdpa"."""
        asked = asked or os.environ.get("SPECDEC_STATIC_ATTENTION")
        if asked not in (None, "pool", "sdpa"):
            raise ValueError(f"the static runner's attention is 'pool' or 'sdpa', not {asked!r}")
        if asked == "sdpa" or (asked is None and self.device.type != "cuda"):
            return "sdpa"
        try:
            from specdec.engine.cuda.pool_attention import pool_attention
            keys = torch.zeros(2, SMALLEST_WINDOW, self.kv_heads, self.head_dim, dtype=self.act_dtype,
                               device=self.device)
            pool_attention(torch.zeros(self.heads, self.rows, self.head_dim, dtype=self.act_dtype, device=self.device),
                           keys, keys, torch.arange(self.rows, device=self.device)[None],
                           torch.ones(1, dtype=torch.long, device=self.device), self.scale, SMALLEST_WINDOW)
        except Exception as error:  # no Triton, or its compiler refused: the kernel every build has
            if asked == "pool":
                raise
            log.warning("the pool attention kernel is unavailable (%s): scaled_dot_product_attention", error)
            return "sdpa"
        log.info("attention over the KV pool: Triton, %d query rows a program", self.heads // self.kv_heads * self.rows)
        return "pool"

    def _pinned_attention_backends(self) -> list[SDPBackend] | None:
        """On CUDA, one attention kernel for every window (another backend's heuristics may choose kernels by
        length): the memory-efficient one, if it takes this model's shapes; None: the default dispatch."""
        if self.device.type != "cuda":
            return None
        backends = [SDPBackend.EFFICIENT_ATTENTION]
        rows = self.heads // self.kv_heads * self.rows
        q = torch.zeros(1, self.kv_heads, rows, self.head_dim, dtype=self.act_dtype, device=self.device)
        k = torch.zeros(1, self.kv_heads, SMALLEST_WINDOW, self.head_dim, dtype=self.act_dtype, device=self.device)
        mask = torch.ones(1, 1, rows, SMALLEST_WINDOW, dtype=torch.bool, device=self.device)
        try:
            with sdpa_kernel(backends):
                F.scaled_dot_product_attention(q, k, k, attn_mask=mask)
        except RuntimeError as error:
            log.warning("memory-efficient attention refused this model's shapes (%s): the default dispatch, "
                        "whose kernel may differ between key windows", error)
            return None
        return backends

    # -- caches --------------------------------------------------------------------------
    def new_cache(self) -> SlotCache:
        return self.pool.allocate(self.max_context)

    def copy_prefix(self, source: SlotCache, target: SlotCache, length: int) -> None:
        """Give `target` (empty) the first `length` positions of `source`'s slot."""
        target.reserve(length)
        for pool in (*self.pool.keys, *self.pool.values):
            pool[target.slot, :length] = pool[source.slot, :length]
        target.length = length

    def shapes(self) -> list[tuple[int, int, int]]:
        """Every piece shape a pass can use: (segments, rows, keys attended)."""
        return [(b, self.rows, window) for b in self.session_buckets for window in self.windows]

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every shape's graph now (on scratch rows), so no request pays for a capture. Where the
        compiled layers fail there (the compiler runs in a capture's warm-up), the runner falls back to its
        eager layers rather than failing the service."""
        if self.graphs is None:
            return
        try:
            self._capture_every_shape()
        except Exception:
            if not self.compiled:
                raise
            log.exception("the compiled layers failed at start-up: the static runner's layers run eagerly")
            self.compiled, self.layer_step = False, self._layer_step
            self.graphs = GraphBank(self._piece, self.device)
            self._capture_every_shape()

    def _capture_every_shape(self) -> None:
        for sessions, _, window in self.shapes():
            self.graphs.capture(self._inputs([], sessions), self._key_positions[window])
        synchronize(self.device)
        log.info("captured %d CUDA graphs: %s", len(self.graphs), self.shapes())

    # -- the forward pass ------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, steps: list[Step]) -> list[torch.Tensor]:
        """As `ModelRunner.forward`: each step's logits [step.logits, V] float32; caches grow."""
        lengths = [len(s.tokens) for s in steps]
        assert all(n > 0 for n in lengths) and all(0 <= s.logits <= n for s, n in zip(steps, lengths))
        assert len({id(s.cache) for s in steps}) == len(steps), "steps must use distinct caches"
        for step, n in zip(steps, lengths):
            step.cache.reserve(step.cache.length + n)
        segments = []
        for i, (step, n) in enumerate(zip(steps, lengths)):
            for begin in range(0, n, self.rows):
                end = min(begin + self.rows, n)  # the step keeps its last `logits` rows: those past n - logits
                segments.append(_Segment(i, step.cache.slot, step.cache.length + begin, step.tokens[begin:end],
                                         keep=max(0, min(end - begin, end - (n - step.logits)))))
        parts: list[list[torch.Tensor]] = [[] for _ in steps]  # per step, its kept rows, a piece at a time
        largest = self.session_buckets[-1]
        for begin in range(0, len(segments), largest):
            piece = segments[begin:begin + largest]
            logits = self._run(piece)  # [B, rows, V]
            kept = [(segment, logits[b, len(segment.tokens) - segment.keep:len(segment.tokens)])
                    for b, segment in enumerate(piece) if segment.keep]
            if not kept:
                continue
            # One copy a piece, made before the next piece runs: on CUDA two pieces of one pass may replay the
            # same graph, whose output the second replay overwrites.
            joined, at = torch.cat([rows for _, rows in kept]), 0
            for segment, _ in kept:
                parts[segment.step].append(joined[at:at + segment.keep])
                at += segment.keep
        for step, n in zip(steps, lengths):
            step.cache.length += n
        return [p[0] if len(p) == 1 else torch.cat(p) if p else torch.empty(0, self.vocab, device=self.device)
                for p in parts]

    def _inputs(self, piece: list[_Segment], sessions: int) -> torch.Tensor:
        """Each segment's ids, positions and slot as one row [sessions, 2·rows + 1] on the host (one copy to
        the device a piece); scratch rows past the piece."""
        R = self.rows
        packed = [[*s.tokens, *[0] * (R - len(s.tokens)), *range(s.start, s.start + R), s.slot] for s in piece]
        packed += [[*[0] * R, *range(R), self.pool.scratch]] * (sessions - len(piece))
        return torch.tensor(packed, dtype=torch.long)

    def _run(self, piece: list[_Segment]) -> torch.Tensor:
        """One piece padded to its buckets: logits [bucket, rows, V] float32 (on CUDA the graph's own
        output, valid until that graph's next replay)."""
        sessions = next(b for b in self.session_buckets if b >= len(piece))
        furthest = max(segment.start for segment in piece) + self.rows  # padding rows write up to here
        window = next(w for w in self.windows if w >= furthest) if self.device.type == "cuda" else self.windows[-1]
        packed, keys = self._inputs(piece, sessions), self._key_positions[window]
        if self.graphs is not None:  # the graph copies the host's rows into its own input
            return self.graphs.run(packed, keys)
        return self._piece(packed.to(self.device, non_blocking=True), keys)

    def _piece(self, packed: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """packed: [B, 2·S + 1], each segment's ids [S], positions [S] and slot; keys: [L] key positions ->
        logits [B, S, V] float32. Static shapes, no host sync."""
        S = self.rows
        ids, positions, slots = (packed[:, :S].contiguous(), packed[:, S:2 * S].contiguous(),
                                 packed[:, 2 * S].contiguous())
        B, window = ids.shape[0], keys.shape[0]
        h = self.embed(ids.reshape(-1))[None].to(self.act_dtype)  # [1, B·S, hidden]
        cos, sin = self.rotary(h, positions.reshape(1, -1))
        visible = None  # the pool kernel masks each row by its position itself
        if self.attention == "sdpa":
            groups = self.heads // self.kv_heads
            visible = keys[None, None, :] <= positions[:, :, None]  # [B, S, L]
            visible = visible[:, None].expand(B, groups, S, keys.shape[0]).reshape(B, 1, groups * S, -1)  # folded
        if self.compiled:  # the segment count and the window are the dynamic sizes; the pool's and weights' stay
            for t in (h, cos, sin):
                torch._dynamo.mark_dynamic(t, 1)
            for t in (positions, slots):
                torch._dynamo.mark_dynamic(t, 0)
            if visible is not None:
                torch._dynamo.mark_dynamic(visible, 0)
                torch._dynamo.mark_dynamic(visible, 3)
        for layer, pool_keys, pool_values in zip(self.layers, self.pool.keys, self.pool.values, strict=True):
            h = self.layer_step(layer, h, cos, sin, positions, slots, visible, pool_keys, pool_values, window)
        logits = self.collectives.gather_vocab(self.lm_head(self.norm(h[0])).float())  # [B·S, V]
        return logits.view(B, S, -1)

    def _layer_step(self, layer, h: torch.Tensor, cos, sin, positions: torch.Tensor, slots: torch.Tensor,
                    visible: torch.Tensor | None, pool_keys: torch.Tensor, pool_values: torch.Tensor,
                    window: int) -> torch.Tensor:
        """One decoder layer: h [1, B·S, hidden] -> [1, B·S, hidden]; writes the segments' keys and values
        into this layer's pool tensors [slots + 1, L, KV, D]; every position is below `window`."""
        h = h + self._attention(layer, h, cos, sin, positions, slots, visible, pool_keys, pool_values, window)
        return h + self._mlp(layer, h)

    def _attention(self, layer, h: torch.Tensor, cos, sin, positions: torch.Tensor, slots: torch.Tensor,
                   visible: torch.Tensor | None, pool_keys: torch.Tensor, pool_values: torch.Tensor,
                   window: int) -> torch.Tensor:
        """visible: the sdpa kernel's mask [B, 1, G·S, L] (None: the pool kernel, which masks by position)."""
        D, H, KV = self.head_dim, self.heads, self.kv_heads
        B, S = positions.shape
        q, k, v = self._project(layer, h, cos, sin)  # [1, H|KV, B·S, D], v [B·S, KV, D]
        k = k[0].view(KV, B, S, D).permute(1, 2, 0, 3)  # [B, S, KV, D]
        where = (slots[:, None].expand(B, S), positions)
        pool_keys.index_put_(where, k.to(pool_keys.dtype))
        pool_values.index_put_(where, v.view(B, S, KV, D).to(pool_values.dtype))
        if visible is None:
            out = torch.ops.specdec.pool_attention(q[0], pool_keys, pool_values, positions, slots, self.scale, window)
            return self.collectives.all_reduce(layer.out(out.to(h.dtype)))[None]  # out [B·S, H·D]
        G, L = H // KV, visible.shape[-1]
        q = q[0].view(KV, G, B, S, D).permute(2, 0, 1, 3, 4).reshape(B, KV, G * S, D)  # a KV head's queries folded
        keys = pool_keys.narrow(1, 0, L)[slots].transpose(1, 2)  # [B, KV, L, D]: the window's keys alone
        values = pool_values.narrow(1, 0, L)[slots].transpose(1, 2)
        if self.compiled:  # one copy, fused into the gather: Inductor's AVX2 code fed the strided window to
            keys, values = keys.contiguous(), values.contiguous()  # CPU attention as NaN (its AVX-512 code did not)
        with sdpa_kernel(self.attention_backends) if self.attention_backends else nullcontext():
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, scale=self.scale)  # [B, KV, GS, D]
        out = out.view(B, KV, G, S, D).permute(0, 3, 1, 2, 4).reshape(B * S, H * D)  # head h = kv·G + g
        return self.collectives.all_reduce(layer.out(out.to(h.dtype)))[None]
