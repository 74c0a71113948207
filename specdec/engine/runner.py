"""Our forward pass over a Llama-family decoder: ragged steps of many sessions in one pass.

`ModelRunner.forward(steps)` scores, for each step, a session's new tokens after its cached
prefix. The tokens of all steps are flattened into one sequence (no padding): the linear layers,
which hold nearly all the FLOPs and bytes, run once over every row, and attention runs per step
over that session's own `KVCache`. A single session is the batch of one.

Attention (`specdec.engine.attention`) gives each query the same bits whatever it is computed with, and
the kernels give each row the same bits whatever the row count, so a token's logits do not depend
on whether it was decoded alone, verified among γ drafts or batched with other sessions.

The model's own modules supply embeddings, norms, rotary embeddings and the activation; its linear
layers are rebuilt as fused kernels for the chosen compute path (`specdec.engine.kernels`), and the
originals are released. On the gguf-q8 path the steps between the kernels (norms, rotary embeddings,
attention, SiLU gating) run in C instead (`specdec.engine.cpu.layer_ops`), row-invariant the same way.
Supported: models laid out like Llama / Qwen2 / Mistral / Qwen3 (`self_attn.{q,k,v,o}_proj`,
`mlp.{gate,up,down}_proj`), full attention only.
"""

from __future__ import annotations

import inspect
import itertools
import logging
from dataclasses import dataclass

import torch
from torch import nn

from specdec.engine.attention import BLOCK, attend, visibility
from specdec.engine.cpu.blockquant import BlockEmbedding
from specdec.engine.cpu.layer_ops import CACHE_DTYPE, FusedLayers, unsupported_reason
from specdec.engine.cpu.q8dot import PACKED_PATHS, block_kernel
from specdec.engine.cpu.q8dot import library as q8_library
from specdec.engine.kernels import Kernel, make_kernel
from specdec.engine.kvcache import KVCache

log = logging.getLogger(__name__)

UNSCORED = -1e4  # the logit of a token id the output layer does not score (`ModelRunner.limit_vocabulary`)


class UnsupportedModel(ValueError):
    """The model's architecture is not one the runner implements."""


@dataclass
class Step:
    """One session's part of a forward pass."""

    cache: KVCache
    tokens: list[int]  # fed after the cache's `length` positions
    logits: int = 1  # how many trailing positions need logits


class Collectives:
    """Tensor-parallel communication; the identity for a single worker."""

    world = 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def agree(self, holds: bool) -> bool:
        """Whether `holds` on every rank; every rank asks at the same point."""
        return holds

    def ranks_here(self) -> int:
        """The ranks on this machine (sharing its memory), this one among them; every rank asks at once."""
        return 1

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


@dataclass
class _Layer:
    input_norm: nn.Module
    qkv: Kernel
    q_norm: nn.Module | None
    k_norm: nn.Module | None
    out: Kernel
    post_norm: nn.Module
    gate_up: Kernel
    down: Kernel
    act: nn.Module


def _fused(path: str, linears: list[nn.Linear], fp32_kernel: str) -> Kernel:
    """One kernel for linears that read the same input (q, k, v; gate, up): their outputs side by side."""
    biases = [lin.bias for lin in linears]
    bias = None
    given = [b for b in biases if b is not None]
    if given:
        bias = torch.cat([b.detach() if b is not None else given[0].new_zeros(lin.out_features)
                          for b, lin in zip(biases, linears)])
    if path in PACKED_PATHS:
        return block_kernel(path, [lin.block_weight for lin in linears], bias)
    weight = torch.cat([lin.weight.detach() for lin in linears])
    return make_kernel(path, weight, bias, fp32_kernel)


def _release(*linears: nn.Linear) -> None:
    """Drop a rebuilt linear's original weights; the kernel holds what the forward needs."""
    for lin in linears:
        lin.weight = nn.Parameter(torch.empty(0, dtype=lin.weight.dtype, device=lin.weight.device),
                                  requires_grad=False)
        lin.bias = None


def check_supported(model: nn.Module) -> None:
    config = model.config
    decoder = getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if layers is None or not hasattr(decoder, "rotary_emb") or not hasattr(decoder, "norm"):
        raise UnsupportedModel(f"{type(model).__name__}: specdec runs Llama-family decoders "
                               "(model.layers, model.norm, model.rotary_emb)")
    attn, mlp = layers[0].self_attn, layers[0].mlp
    missing = [name for name, owner in (("q_proj", attn), ("k_proj", attn), ("v_proj", attn), ("o_proj", attn),
                                        ("gate_proj", mlp), ("up_proj", mlp), ("down_proj", mlp))
               if not hasattr(owner, name)]
    if missing:
        raise UnsupportedModel(f"{type(model).__name__}: no {', '.join(missing)} in its decoder layers")
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
        raise UnsupportedModel(f"{type(model).__name__}: sliding-window layers are not supported")
    if getattr(config, "attn_logit_softcapping", None) or getattr(config, "final_logit_softcapping", None):
        raise UnsupportedModel(f"{type(model).__name__}: logit soft-capping is not supported")
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedModel(f"{type(model).__name__}: rotary embeddings over part of each head are not supported")
    if not hasattr(inspect.getmodule(type(model)), "apply_rotary_pos_emb"):
        raise UnsupportedModel(f"{type(model).__name__}: its module defines no apply_rotary_pos_emb")


class ModelRunner:
    """Owns a model's compute path and runs ragged multi-session forward passes.

    path: "fp32", "bf16", "int8" (see `specdec.engine.kernels`), "gguf" (`specdec.engine.cpu.blockquant`) or "gguf-q8"
    (`specdec.engine.cpu.q8dot`); on the last two every linear layer and the embedding carry a `block_weight`.
    fp32_kernel: "dense" or "onednn".
    `collectives` joins tensor-parallel shards (`specdec.engine.tp`); the default is one worker.
    """

    def __init__(self, model: nn.Module, path: str = "fp32", fp32_kernel: str = "dense",
                 collectives: Collectives | None = None):
        check_supported(model)
        model.eval()
        decoder = model.model
        config = model.config
        self.path = path
        self.collectives = collectives or Collectives()
        if path == "bf16":
            model.to(torch.bfloat16)
        if path in PACKED_PATHS:  # weights in their GGUF blocks (`specdec.engine.cpu.blockquant`, `.q8dot`)
            self.act_dtype, self.device = torch.float32, torch.device("cpu")
            self.embed = BlockEmbedding(decoder.embed_tokens.block_weight)
        else:
            self.act_dtype, self.device = decoder.embed_tokens.weight.dtype, decoder.embed_tokens.weight.device
            self.embed = decoder.embed_tokens
        self.norm = decoder.norm
        self.rotary = decoder.rotary_emb
        self.apply_rotary = inspect.getmodule(type(model)).apply_rotary_pos_emb
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        attn0 = decoder.layers[0].self_attn
        self.heads = attn0.q_proj.out_features // self.head_dim  # this shard's heads under tensor parallelism
        self.kv_heads = attn0.k_proj.out_features // self.head_dim
        self.scale = getattr(attn0, "scaling", self.head_dim ** -0.5)
        self.max_context = config.max_position_embeddings
        self.layers: list[_Layer] = []
        with torch.no_grad():
            for layer in decoder.layers:
                attn, mlp = layer.self_attn, layer.mlp
                self.layers.append(_Layer(
                    input_norm=layer.input_layernorm,
                    qkv=_fused(path, [attn.q_proj, attn.k_proj, attn.v_proj], fp32_kernel),
                    q_norm=getattr(attn, "q_norm", None), k_norm=getattr(attn, "k_norm", None),
                    out=_fused(path, [attn.o_proj], fp32_kernel),
                    post_norm=layer.post_attention_layernorm,
                    gate_up=_fused(path, [mlp.gate_proj, mlp.up_proj], fp32_kernel),
                    down=_fused(path, [mlp.down_proj], fp32_kernel), act=mlp.act_fn))
                _release(attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj,
                         mlp.down_proj)
            head = model.get_output_embeddings()
            self.lm_head = _fused(path, [head], fp32_kernel)
            if head.weight is not getattr(self.embed, "weight", None):
                _release(head)
        self.head_subset: tuple[Kernel, list[tuple[int, int]]] | None = None  # `limit_vocabulary`
        self.fused = None  # the gguf-q8 path's layers with their float steps in C (`specdec.engine.cpu.layer_ops`)
        if path == "gguf-q8":
            reason = unsupported_reason(self)
            if reason is None:
                self.fused = FusedLayers(self, q8_library())
            else:
                log.info("%s: its layers' float steps run as torch ops", reason)

    # -- caches --------------------------------------------------------------------------
    def new_cache(self) -> KVCache:
        """An empty cache: in the activations' dtype, or the C attention's (`CACHE_DTYPE`) on its layers. A
        tensor-parallel shard's ranks check its growth together (`KVCache._check_memory`)."""
        dtype = CACHE_DTYPE if self.fused is not None else self.act_dtype
        return KVCache(len(self.layers), self.kv_heads, self.head_dim, dtype, self.device, self.max_context,
                       shards=self.collectives if self.collectives.world > 1 else None)

    def copy_prefix(self, source: KVCache, target: KVCache, length: int) -> None:
        """Give `target` (empty) the first `length` positions of `source`'s cache."""
        target.reserve(length)
        target.keys[:, :, :length] = source.keys[:, :, :length]
        target.values[:, :, :length] = source.values[:, :, :length]
        target.length = length

    def linear_kernels(self) -> list[Kernel]:
        """Every linear kernel a pass runs through: each layer's four, then the output layer."""
        head = self.lm_head if self.head_subset is None else self.head_subset[0]
        return [*(k for layer in self.layers for k in (layer.qkv, layer.out, layer.gate_up, layer.down)), head]

    def limit_vocabulary(self, ranges: list[tuple[int, int]]) -> bool:
        """From now on score only the token ids in `ranges` ([begin, end) each, ascending); every other
        id gets the logit UNSCORED, so its probability is 0 (or the same tiny share as every other such
        id, if nothing scored is allowed). For a draft model: the output layer is the largest single read
        of a small model with a large vocabulary, and a proposal's law may be any law, so the output stays
        lossless. Returns False (and changes nothing) where the output layer cannot be cut without a copy
        (only the gguf-q8 path's can)."""
        subset = getattr(self.lm_head, "row_subset", lambda ranges: None)(ranges)
        if subset is None:
            return False
        self.head_subset = (subset, ranges)
        return True

    def scored_tokens(self) -> int | None:
        """How many token ids the output layer scores after `limit_vocabulary`; None: every id."""
        return None if self.head_subset is None else self.head_subset[0].out_features

    def _head(self, normed: torch.Tensor) -> torch.Tensor:
        """The output layer's logits [rows, V] for normed hidden states [rows, hidden]."""
        if self.head_subset is None:
            return self.lm_head(normed)
        kernel, ranges = self.head_subset
        scored = kernel(normed)  # [rows, scored ids]
        logits = scored.new_full((normed.shape[0], self.lm_head.out_features), UNSCORED)
        offset = 0
        for begin, end in ranges:
            logits[:, begin:end] = scored[:, offset:offset + end - begin]
            offset += end - begin
        return logits

    def weight_bytes(self) -> int:
        small = sum(t.numel() * t.element_size() for m in (self.embed, self.norm)
                    for t in itertools.chain(m.parameters(), m.buffers()))
        norms = sum(p.numel() * p.element_size() for layer in self.layers
                    for m in (layer.input_norm, layer.post_norm) for p in m.parameters())
        return sum(k.weight_bytes() for k in self.linear_kernels()) + small + norms

    # -- the forward pass ------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, steps: list[Step]) -> list[torch.Tensor]:
        """Feed every step's tokens; returns each step's logits [step.logits, V] float32.

        Each cache grows by its step's tokens. Steps must use distinct caches.
        """
        lengths = [len(s.tokens) for s in steps]
        assert all(n > 0 for n in lengths) and all(0 <= s.logits <= n for s, n in zip(steps, lengths))
        for step, n in zip(steps, lengths):
            step.cache.reserve(step.cache.length + n)
        ids = torch.tensor([t for s in steps for t in s.tokens], device=self.device)  # [T]
        positions = torch.cat([torch.arange(s.cache.length, s.cache.length + n) for s, n in zip(steps, lengths)])
        positions = positions.to(self.device)[None]  # [1, T]
        h = self.embed(ids)[None].to(self.act_dtype)  # [1, T, hidden]
        cos, sin = self.rotary(h, positions)
        if self.fused is not None:
            h = self.fused.layers(h[0], cos[0], sin[0], steps)[None]
        else:
            spans = self._spans(steps, lengths)
            for index, layer in enumerate(self.layers):
                h = h + self._attention(index, layer, h, cos, sin, spans)
                h = h + self._mlp(layer, h)
        for step, n in zip(steps, lengths):
            step.cache.length += n
        rows = torch.tensor([end - k for (_, end), s in zip(_offsets(lengths), steps) for k in range(s.logits, 0, -1)],
                            dtype=torch.long, device=self.device)
        normed = self.fused.final(h[0, rows]) if self.fused is not None else self.norm(h[0, rows])
        logits = self.collectives.gather_vocab(self._head(normed).float())  # [Σ logits, V]
        return list(logits.split([s.logits for s in steps]))

    def _spans(self, steps: list[Step], lengths: list[int]) -> list[tuple[int, int, int, KVCache, torch.Tensor]]:
        """Per step: its rows [begin, end) in the flattened batch, its first position, its cache and
        the visibility of its keys (`specdec.engine.attention.visibility`), shared by every layer."""
        groups = self.heads // self.kv_heads
        spans = []
        for (begin, end), step, n in zip(_offsets(lengths), steps, lengths):
            start = step.cache.length
            keys = -(-(start + n) // BLOCK) * BLOCK
            spans.append((begin, end, start, step.cache, visibility(start, n, groups, keys, self.device)))
        return spans

    def _mlp(self, layer: _Layer, h: torch.Tensor) -> torch.Tensor:
        """The MLP's contribution to the residual stream h [1, T, hidden]: [1, T, hidden]."""
        gate, up = layer.gate_up(layer.post_norm(h)[0]).chunk(2, dim=-1)  # [T, intermediate] each
        return self.collectives.all_reduce(layer.down(layer.act(gate) * up))[None]

    def _project(self, layer: _Layer, h: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries and keys with their norms and rotary embeddings, and values, of h [1, T, hidden]:
        q [1, H, T, D], k [1, KV, T, D], v [T, KV, D]."""
        D, H, KV = self.head_dim, self.heads, self.kv_heads
        T = h.shape[1]
        qkv = layer.qkv(layer.input_norm(h)[0])  # [T, (H + 2·KV)·D]
        q, k, v = qkv.split([H * D, KV * D, KV * D], dim=-1)
        q, k = q.view(T, H, D), k.view(T, KV, D)
        if layer.q_norm is not None:
            q, k = layer.q_norm(q), layer.k_norm(k)
        q, k = self.apply_rotary(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
        return q, k, v.view(T, KV, D)

    def _attention(self, index: int, layer: _Layer, h: torch.Tensor, cos, sin, spans) -> torch.Tensor:
        D, H, KV = self.head_dim, self.heads, self.kv_heads
        T = h.shape[1]
        q, k, v = self._project(layer, h, cos, sin)  # [1, H|KV, T, D], v [T, KV, D]
        v = v.transpose(0, 1)  # [KV, T, D]
        out = torch.empty(T, H, D, dtype=torch.float32, device=h.device)
        groups = H // KV
        for begin, end, start, cache, visible in spans:
            S = end - begin
            cache.keys[index, :, start:start + S] = k[0, :, begin:end]
            cache.values[index, :, start:start + S] = v[:, begin:end]
            width = visible.shape[1]
            query = q[0, :, begin:end].reshape(KV, groups * S, D)  # heads sharing a KV head, folded
            attended = attend(query, cache.keys[index, :, :width], cache.values[index, :, :width], visible,
                              self.scale)  # [KV, G·S, D]
            out[begin:end] = attended.reshape(H, S, D).transpose(0, 1)
        return self.collectives.all_reduce(layer.out(out.view(T, H * D).to(h.dtype)))[None]


def _offsets(lengths: list[int]) -> list[tuple[int, int]]:
    spans, begin = [], 0
    for n in lengths:
        spans.append((begin, begin + n))
        begin += n
    return spans
