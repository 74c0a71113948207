"""The gguf-q8 path's decoder layers with their float steps in C (`csrc/layer_ops.c` defines them).

Between the integer kernels a layer has RMS norms, rotary embeddings, KV-cache writes, attention and SiLU
gating: about sixty small torch ops, 7 of a 1.5B model's 34 ms step on 2 cores. Here they are five C calls
(one attention call per session), each row computed on its own in a fixed order, so the path stays
row-invariant: a token's logits are the same bits alone, verified among drafts or batched. Where every
linear is on the integer kernel, the whole loop of layers is one C call (`decoder`), the same steps in the
same order: the Python between them cost a 0.5B draft about 1 ms of its 9 ms step.

Used for models whose layers are the plain Llama / Qwen2 / Qwen3 / Mistral kind (`unsupported_reason` says
why not otherwise); anything else runs on the runner's torch ops.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import torch
from torch import nn

from specdec.engine.cpu.decoder import CompiledLayers

if TYPE_CHECKING:
    from specdec.engine.kernels import Kernel
    from specdec.engine.runner import ModelRunner, Step

# The C attention's KV cache: IEEE half precision, as llama.cpp's default F16 cache (the definition in
# csrc/layer_ops.c): half the bytes a decode step reads at depth, and half a session's memory.
CACHE_DTYPE = torch.float16
# w · x / rms(x), nothing else (`RMSNorm`: `specdec.engine.decoder_tree`'s)
RMS_NORMS = {"RMSNorm", "LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm"}
SILU = {"SiLU", "SiLUActivation"}


class _Norm:
    """An RMS norm's weight (float32, contiguous, and its address) and epsilon."""

    def __init__(self, module: nn.Module):
        self.weight = module.weight.detach().float().contiguous()
        self.ptr = self.weight.data_ptr()
        self.eps = float(module.variance_epsilon)


class _HeadNorms:
    """A layer's optional per-head norms (Qwen3's q_norm, k_norm) as the C attention takes them: each weight's
    address or None, and one epsilon (0 without norms; `unsupported_reason` refuses two different ones)."""

    def __init__(self, q_norm: nn.Module | None, k_norm: nn.Module | None):
        self.norms = [_Norm(m) if m is not None else None for m in (q_norm, k_norm)]  # keeps the weights alive
        self.q_ptr, self.k_ptr = (n.ptr if n is not None else None for n in self.norms)
        self.eps = self.norms[0].eps if self.norms[0] is not None else 0.0


def unsupported_reason(runner: ModelRunner) -> str | None:
    """Why the runner's layers cannot run on the C float steps, or None if they can."""
    norms = [runner.norm] + [m for layer in runner.layers
                             for m in (layer.input_norm, layer.post_norm, layer.q_norm, layer.k_norm) if m is not None]
    if any(type(m).__name__ not in RMS_NORMS or not hasattr(m, "variance_epsilon") for m in norms):
        return "its norms are not plain RMS norms"
    if any(type(layer.act).__name__ not in SILU for layer in runner.layers):
        return "its MLP activation is not SiLU"
    if runner.head_dim % 16 or runner.head_dim > 512:
        return f"head dimension {runner.head_dim} (the C attention takes multiples of 16 up to 512)"
    if runner.heads // runner.kv_heads > 32:
        return "more than 32 query heads per KV head"
    if any(layer.q_norm is not None and layer.q_norm.variance_epsilon != layer.k_norm.variance_epsilon
           for layer in runner.layers):
        return "its query and key norms have different epsilons (the C attention takes one)"
    if not hasattr(runner.rotary, "inv_freq"):
        return "its rotary embedding is not the standard one"
    return None


class _Scratch(threading.local):
    """A thread's buffers for the passes it runs, by name and width: a layer's intermediates are written
    over every layer and pass instead of allocated (a pass runs on one thread; passes never overlap a
    runner's, but the thread that runs them may change). Each grows to the most rows asked of it."""

    def __init__(self):
        self.buffers: dict[tuple, torch.Tensor] = {}

    def get(self, name: str, rows: int, width: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[rows, width], contiguous; its contents are whatever the last user left."""
        key = (name, width)
        buffer = self.buffers.get(key)
        if buffer is None or buffer.shape[0] < rows:
            buffer = self.buffers[key] = torch.empty(rows, width, dtype=dtype)
        return buffer[:rows]


class FusedLayers:
    """Runs a `ModelRunner`'s decoder layers and final norm with the C float steps of library `lib`."""

    def __init__(self, runner: ModelRunner, lib):
        self.runner, self.lib = runner, lib
        self.norms = [(_Norm(layer.input_norm), _Norm(layer.post_norm)) for layer in runner.layers]
        self.head_norms = [_HeadNorms(layer.q_norm, layer.k_norm) for layer in runner.layers]
        self.final_norm = _Norm(runner.norm)
        self.scratch = _Scratch()
        # The whole loop in one C call where every linear is on the integer kernel (`decoder`): same bits.
        self.compiled = CompiledLayers.of(self)

    def rms_norm(self, x: torch.Tensor, norm: _Norm, out: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, hidden] float32 contiguous → its norm [T, hidden] (into `out` if given)."""
        out = torch.empty_like(x) if out is None else out
        self.lib.lo_rms_norm(x.data_ptr(), x.shape[0], x.shape[1], norm.ptr, norm.eps, out.data_ptr())
        return out

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """gate_up [T, 2·I] (gate | up) → SiLU(gate) · up [T, I] (into `out` if given)."""
        rows, width = gate_up.shape
        out = torch.empty(rows, width // 2, dtype=torch.float32) if out is None else out
        self.lib.lo_silu_mul(gate_up.data_ptr(), rows, width // 2, out.data_ptr())
        return out

    def linear(self, kernel: Kernel, x: torch.Tensor, name: str) -> torch.Tensor:
        """kernel(x) for x [T, K] float32 contiguous: into this thread's buffer `name` when every part of the
        kernel is on the integer kernel (no allocation, one quantization), else the kernel's own call (also
        for the exact path's kernels, which the tests run these layers on)."""
        if not getattr(kernel, "fully_integer", False):
            return kernel.matmul(x)  # the kernels' own call: no module hooks
        rows = x.shape[0]
        y = self.scratch.get(name, rows, kernel.out_features)
        act = self.scratch.get("activation blocks", rows, kernel.act_bytes, torch.uint8)
        kernel.integer_matmul(x.data_ptr(), rows, y.data_ptr(), act.data_ptr(), torch.get_num_threads())
        return y

    def attention(self, index: int, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  steps: list[Step]) -> torch.Tensor:
        """Each step's attention in layer `index` over its cache (`CACHE_DTYPE`), which gains the step's keys
        and values. qkv [T, (H + 2·KV)·D]; cos, sin [T, D]. Returns [T, H·D], in this thread's scratch: valid
        until the next call."""
        r = self.runner
        H, KV, D = r.heads, r.kv_heads, r.head_dim
        out = self.scratch.get("attended", qkv.shape[0], H * D)
        head_norms = self.head_norms[index]
        threads, begin = torch.get_num_threads(), 0
        for step in steps:
            cache, n = step.cache, len(step.tokens)
            layer_bytes = cache.keys.element_size() * index * cache.keys.stride(0)
            status = self.lib.lo_attention(
                qkv.data_ptr() + 4 * begin * qkv.shape[1], n, H, KV, D,
                head_norms.q_ptr, head_norms.k_ptr, head_norms.eps,
                cos.data_ptr() + 4 * begin * D, sin.data_ptr() + 4 * begin * D,
                cache.keys.data_ptr() + layer_bytes, cache.values.data_ptr() + layer_bytes, cache.capacity,
                cache.length, r.scale, out.data_ptr() + 4 * begin * H * D, threads)
            if status == -2:
                raise MemoryError(f"lo_attention: no memory for the scores of {n} queries over {cache.length + n} keys")
            assert status == 0, f"lo_attention refused heads {H}/{KV}×{D} at {cache.length}+{n} of {cache.capacity}"
            begin += n
        return out

    def layers(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, steps: list[Step]) -> torch.Tensor:
        """Every decoder layer over the flattened rows h [T, hidden] (updated in place and returned);
        cos, sin [T, D] at the rows' positions. The caches' lengths are left to the caller. A layer's
        intermediates live in this thread's scratch buffers (`linear`), so a pass allocates little."""
        if self.compiled is not None:
            return self.compiled(h, cos, sin, steps)
        rows, hidden = h.shape
        normed = self.scratch.get("normed", rows, hidden)
        for index, (layer, (input_norm, post_norm)) in enumerate(zip(self.runner.layers, self.norms)):
            qkv = self.linear(layer.qkv, self.rms_norm(h, input_norm, normed), "qkv")
            h += self.linear(layer.out, self.attention(index, qkv, cos, sin, steps), "projected")
            gate_up = self.linear(layer.gate_up, self.rms_norm(h, post_norm, normed), "gate_up")
            gated = self.silu_mul(gate_up, self.scratch.get("gated", rows, gate_up.shape[1] // 2))
            h += self.linear(layer.down, gated, "projected")
        return h

    def final(self, h: torch.Tensor) -> torch.Tensor:
        return self.rms_norm(h.contiguous(), self.final_norm)
