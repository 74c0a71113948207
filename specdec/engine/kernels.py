"""Linear-layer kernels for the compute paths.

A compute path fixes the numerics of every matmul in a model:
- "fp32": float32 weights and activations. Two kernels compute it: MKL's sgemm (`F.linear`) and
  oneDNN with weights prepacked once at load. Which one is faster for multi-token forwards
  differs between CPUs, so `fastest_fp32_kernel` measures both on the model's own shapes.
- "bf16": bfloat16 weights and activations; fast only where the CPU has native bf16 dot products
  (avx512_bf16 / AMX) or on CUDA. Lossy against fp32.
- "int8": int8 weights (one scale per output channel) and int8 activations with one scale and
  zero point per *token* (row), quantized on the fly; oneDNN's u8·s8 GEMM accumulates in int32
  (8-bit weights with VNNI, 7-bit without: `Int8Kernel`).
  Lossy against fp32, but each row's result depends on that row alone: a token's logits are the
  same whether it is scored alone, in a γ+1-token verify or in a batch of sessions. Per-tensor
  activation scales (`torch.ao` dynamic quantization) would couple the rows and break the greedy
  identity between speculative and target-only decoding.

Every kernel maps x: [T, K] -> y: [T, N] (any leading dims are flattened), so the same module can
replace an `nn.Linear` inside a Hugging Face model (the baselines) or serve our own forward pass.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from specdec.engine.cpu.features import cpu_features

PATHS = ("fp32", "bf16", "int8")


class Kernel(nn.Module):
    """A linear map y = x·Wᵀ + b whose weights live in whatever layout its kernel wants.

    `min_rows`: inputs with fewer rows are zero-padded to this many. oneDNN computes a single row
    on a separate (gemv) path whose rounding differs from the one for two or more rows; with
    padding every row's result is the same whatever the row count, and 4 rows also measured
    faster than 1 on the prepacked layout.
    """

    in_features: int
    out_features: int
    min_rows: int = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [T, K]
        rows = x.shape[0]
        if rows < self.min_rows:
            x = torch.cat([x, x.new_zeros(self.min_rows - rows, x.shape[1])])
        y = self.matmul(x)[:rows]  # [T, N]
        return y.view(*shape[:-1], self.out_features)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers())


class DenseKernel(Kernel):
    """`F.linear` on plain weights: MKL sgemm for fp32, oneDNN for bf16, cuBLAS on CUDA."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.min_rows = 2 if weight.dtype == torch.bfloat16 and weight.device.type == "cpu" else 1
        self.register_buffer("weight", weight.contiguous())
        self.register_buffer("bias", bias)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class OneDnnFp32Kernel(Kernel):
    """fp32 through oneDNN with the weight reordered once into its blocked layout.

    The layout is chosen for 16-row inputs: measured on a Zen 4, a 5-token forward of the 1.5B
    target then costs 0.7x a 1-token one instead of 1.3x with the layout for 1 row.
    """

    min_rows = 4

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(weight.float().contiguous(), 16))
        self.register_buffer("bias", None if bias is None else bias.float())

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


class Int8Kernel(Kernel):
    """W8A8: symmetric per-channel int weights, asymmetric per-token 8-bit unsigned activations.

    y[t, n] = sx[t]·sw[n]·Σ_k (xq[t, k] − zp[t])·wq[n, k] + b[n],  xq ∈ [0, 255], |wq| ≤ wmax
    oneDNN computes sw[n]·Σ xq·wq exactly in int32; the zero-point term uses the precomputed
    sw[n]·Σ_k wq[n, k]. Two variants, each that exact integer arithmetic:
    - "onednn-int8-vnni": 8-bit weights (wmax 127). Needs VNNI (vpdpbusd), whose u8·s8 products
      accumulate in int32.
    - "onednn-int8-w7a8": 7-bit weights (wmax 63), for every other x86 CPU. There oneDNN sums u8·s8
      pairs in int16 with saturation (vpmaddubsw): 2·255·127 overflows it, 2·255·63 does not.
      The activations keep the VNNI variant's grid. Measured on the packaged 1.5B target
      (teacher-forced greedy agreement with fp32): 0.957 with 7-bit weights, 0.953 with 7-bit
      activations instead, 0.969 for the VNNI variant (on a VNNI machine).
    `weight_bits` defaults to what `cpu_features()` allows; 8 without VNNI is refused, because that
    kernel would compute wrong numbers.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, weight_bits: int | None = None):
        super().__init__()
        vnni = cpu_features().vnni
        weight_bits = weight_bits or (8 if vnni else 7)
        if weight_bits not in (7, 8) or (weight_bits == 8 and not vnni):
            raise ValueError(f"int8 with {weight_bits}-bit weights is not exact on {cpu_features().describe()}: "
                             "8 bits need VNNI, 7 bits run everywhere")
        self.name = "onednn-int8-vnni" if weight_bits == 8 else "onednn-int8-w7a8"
        self.wmax = 2 ** (weight_bits - 1) - 1
        w = weight.float()
        self.out_features, self.in_features = w.shape
        scale = (w.abs().amax(dim=1) / self.wmax).clamp(min=1e-12)  # [N]
        wq = (w / scale[:, None]).round().clamp(-self.wmax, self.wmax).to(torch.int8)  # [N, K]
        self.register_buffer("packed", torch.ops.onednn.qlinear_prepack(wq, [1, self.in_features]))
        self.register_buffer("scale", scale)
        self.register_buffer("zero_points", torch.zeros(self.out_features, dtype=torch.int64))
        self.register_buffer("scaled_sums", wq.sum(dim=1).float() * scale)  # [N]
        self.register_buffer("bias", None if bias is None else bias.float())

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        low = x.amin(dim=1, keepdim=True).clamp(max=0.0)  # [T, 1]
        high = x.amax(dim=1, keepdim=True).clamp(min=0.0)
        sx = ((high - low) / 255).clamp(min=1e-12)
        zp = (-low / sx).round()
        xq = (x / sx + zp).round_().clamp_(0, 255).to(torch.uint8)  # [T, K]
        y = torch.ops.onednn.qlinear_pointwise(xq, 1.0, 0, self.packed, self.scale, self.zero_points, None,
                                               1.0, 0, torch.float32, "none", [], "")  # [T, N]
        y = (y - zp * self.scaled_sums) * sx
        return y if self.bias is None else y + self.bias

    def weight_bytes(self) -> int:
        return self.packed.numel() + 4 * 3 * self.out_features


def make_kernel(path: str, weight: torch.Tensor, bias: torch.Tensor | None, fp32_kernel: str = "dense") -> Kernel:
    """The kernel module for `path` over a weight [N, K] (and bias [N])."""
    weight = weight.detach()
    bias = None if bias is None else bias.detach()
    if path == "int8":
        if weight.device.type != "cpu":
            raise ValueError("the int8 path is for CPUs; use bf16 on CUDA")
        return Int8Kernel(weight, bias)
    if path == "bf16":
        return DenseKernel(weight.to(torch.bfloat16), None if bias is None else bias.to(torch.bfloat16))
    if fp32_kernel == "onednn" and weight.device.type == "cpu" and weight.dtype == torch.float32:
        return OneDnnFp32Kernel(weight, bias)
    return DenseKernel(weight, bias)


def time_kernel(kernels: list[Kernel], tokens: int, repeats: int = 3) -> float:
    """Seconds for one pass of x [tokens, K] through every kernel in `kernels` (best of `repeats`)."""
    device = next(kernels[0].buffers()).device
    inputs = {k.in_features: torch.randn(tokens, k.in_features, device=device) for k in kernels}
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first pass warms up
            began = time.perf_counter()
            for kernel in kernels:
                kernel(inputs[kernel.in_features])
            best = min(best, time.perf_counter() - began)
    return best


def fastest_fp32_kernel(weights: list[torch.Tensor], max_tokens: int) -> tuple[str, dict[str, float]]:
    """Measure MKL sgemm against prepacked oneDNN on `weights` for 1..max_tokens rows.

    Returns the name of the faster kernel and each kernel's summed time over the row counts a
    speculative round uses, so that multi-token forwards weigh as much as single steps.
    `weights` should exceed the CPU's last-level cache (several layers' worth), as a forward does.
    """
    totals = {}
    for name in ("dense", "onednn"):
        kernels = [make_kernel("fp32", w, None, name) for w in weights]
        totals[name] = sum(time_kernel(kernels, s) for s in range(1, max_tokens + 1))
        del kernels
    return min(totals, key=totals.get), totals
