"""The gguf-q8 path's decoder layers in one C call (`csrc/decoder.c`): what `FusedLayers.layers` runs when
every linear of every layer is on the integer kernel.

The call runs the same C functions on the same buffers as the layer-by-layer loop, so the same bits; it
saves the Python between them, about 1 ms of a 0.5B draft's 9 ms step on 2 cores. The layers' description
(formats, weights, norms) is built once; each pass adds its sessions' caches and its rows' buffers.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_float, c_int64, c_void_p
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from specdec.engine.cpu.layer_ops import FusedLayers
    from specdec.engine.runner import Step


class _Part(ctypes.Structure):
    _fields_ = [("type", c_int64), ("weights", c_void_p), ("rows", c_int64), ("cols", c_int64),
                ("offset", c_int64), ("bias", c_void_p)]


class _Linear(ctypes.Structure):
    _fields_ = [("parts", POINTER(_Part)), ("count", c_int64), ("out_features", c_int64)]


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", _Linear), ("out", _Linear), ("gate_up", _Linear), ("down", _Linear),
                ("input_norm", c_void_p), ("post_norm", c_void_p), ("q_norm", c_void_p), ("k_norm", c_void_p),
                ("input_eps", c_float), ("post_eps", c_float), ("head_eps", c_float)]


class _Step(ctypes.Structure):
    _fields_ = [("tokens", c_int64), ("start", c_int64), ("capacity", c_int64), ("layer_stride", c_int64),
                ("keys", c_void_p), ("values", c_void_p)]


class _Buffers(ctypes.Structure):
    _fields_ = [("normed", c_void_p), ("qkv", c_void_p), ("attended", c_void_p), ("projected", c_void_p),
                ("gate_up", c_void_p), ("gated", c_void_p), ("act", c_void_p)]


LINEARS = ("qkv", "out", "gate_up", "down")


class CompiledLayers:
    """Every layer of `fused.runner`, described once for `dec_layers`; None from `of` unless every linear is
    fully on the integer kernel."""

    def __init__(self, fused: FusedLayers):
        self.fused, self.lib = fused, fused.lib
        runner = fused.runner
        self._parts = []  # the part arrays the layer structures point into, kept alive with them
        self.layers = (_Layer * len(runner.layers))()
        for layer, entry, (input_norm, post_norm), head_norms in zip(
                runner.layers, self.layers, fused.norms, fused.head_norms):
            for name in LINEARS:
                setattr(entry, name, self._linear(getattr(layer, name)))
            entry.input_norm, entry.input_eps = input_norm.ptr, input_norm.eps
            entry.post_norm, entry.post_eps = post_norm.ptr, post_norm.eps
            entry.q_norm, entry.k_norm, entry.head_eps = head_norms.q_ptr, head_norms.k_ptr, head_norms.eps
        first = runner.layers[0]
        self.widths = {"qkv": first.qkv.out_features, "attended": runner.heads * runner.head_dim,
                       "gate_up": first.gate_up.out_features, "gated": first.gate_up.out_features // 2}
        self.act_bytes = max(getattr(layer, name).act_bytes for layer in runner.layers for name in LINEARS)

    @classmethod
    def of(cls, fused: FusedLayers) -> CompiledLayers | None:
        kernels = [getattr(layer, name) for layer in fused.runner.layers for name in LINEARS]
        return cls(fused) if all(getattr(k, "fully_integer", False) for k in kernels) else None

    def _linear(self, kernel) -> _Linear:
        parts = (_Part * len(kernel.integer_calls))(*(_Part(*call) for call in kernel.integer_calls))
        self._parts.append(parts)
        return _Linear(parts, len(parts), kernel.out_features)

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, steps: list[Step]) -> torch.Tensor:
        """`FusedLayers.layers`' contract: h [T, hidden] updated in place and returned; cos, sin [T, D]."""
        runner, scratch = self.fused.runner, self.fused.scratch
        rows, hidden = h.shape
        cos, sin = cos.contiguous(), sin.contiguous()
        sessions = (_Step * len(steps))(*(
            _Step(len(s.tokens), s.cache.length, s.cache.capacity, s.cache.keys.stride(0),
                  s.cache.keys.data_ptr(), s.cache.values.data_ptr()) for s in steps))
        buffers = _Buffers(*(scratch.get(name, rows, width).data_ptr() for name, width in (
            ("normed", hidden), ("qkv", self.widths["qkv"]), ("attended", self.widths["attended"]),
            ("projected", hidden), ("gate_up", self.widths["gate_up"]), ("gated", self.widths["gated"]))),
            scratch.get("activation blocks", rows, self.act_bytes, torch.uint8).data_ptr())
        status = self.lib.dec_layers(self.layers, len(self.layers), h.data_ptr(), rows, hidden, cos.data_ptr(),
                                     sin.data_ptr(), sessions, len(steps), runner.heads, runner.kv_heads,
                                     runner.head_dim, runner.scale, ctypes.byref(buffers), torch.get_num_threads())
        if status == -2:
            raise MemoryError("dec_layers: out of memory for attention scores or a kernel's accumulators")
        assert status == 0, f"dec_layers refused the pass ({status}): shapes or formats it does not take"
        return h
