"""Weights kept in their GGML block formats, and the kernels that compute with them.

The "gguf" compute path: each weight is expanded in registers to exactly the float32 value gguf's
dequantizer gives it, multiplied by float32 activations and summed in float32 (`csrc/blockquant.c`).
Its results are the float32 path's on the same dequantized weights, up to summation order, and
each row's result is the same whatever it is computed with (row invariance).

Formats: Q4_K, Q6_K, Q8_0, Q5_0 (what the packaged GGUFs hold), Q5_K (with Q6_K, a Q5_K_M file's), Q3_K (with
Q4_K, Q5_K and Q6_K, a Q3_K_M file's), Q4_0 (many other published GGUFs, and what a draft is requantized to:
`specdec.engine.requantize`), IQ4_XS and IQ4_NL (an IQ4_XS file's: 4-bit indices into a table of 16 values, IQ4_NL
where a width is not a multiple of 256), Q5_1 and Q4_1 (a Q5_K_M file's where a width is not a multiple of 256, and
older files), Q2_K (with Q3_K, Q4_K and Q6_K, a Q2_K file's), F16 and BF16 (unquantized files: each value widened
to float32 in registers, exactly) and F32 (for tensors of any other type, dequantized once at load). IQ3_S
tensors arrive here as Q6_K blocks of the same values (`specdec.engine.cpu.iq3_s`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch import nn

from specdec.engine.cpu import native
from specdec.engine.cpu.features import cpu_features
from specdec.engine.cpu.hugepages import empty_on_huge_pages
from specdec.engine.kernels import Kernel

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K = 0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13  # GGML's
Q6_K, IQ4_NL, IQ4_XS, BF16 = 14, 20, 23, 30
NAMES = {F32: "F32", Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q5_1: "Q5_1", Q8_0: "Q8_0", Q2_K: "Q2_K", Q3_K: "Q3_K",
         Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K", IQ4_NL: "IQ4_NL", IQ4_XS: "IQ4_XS", F16: "F16", BF16: "BF16"}
BLOCK = {F32: (16, 64), Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22), Q5_1: (32, 24), Q8_0: (32, 34),
         IQ4_NL: (32, 18), Q2_K: (256, 84), Q3_K: (256, 110), Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210),
         IQ4_XS: (256, 136), F16: (16, 32), BF16: (16, 32)}  # weights, bytes a block
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def library():
    """The kernel library for this CPU's level (built on first use; `specdec.engine.cpu.native`)."""
    return native.load(native.march_for(cpu_features().level))


@lru_cache(maxsize=None)
def available() -> bool:
    """Whether the gguf kernel can run here (an x86 CPU and a C compiler, or a prebuilt library)."""
    return native.loadable(library)


@dataclass(frozen=True)
class BlockTensor:
    """A weight [rows, cols] stored row by row in one block format: data is uint8 [rows, row bytes]."""

    qtype: int
    data: torch.Tensor
    cols: int

    def __post_init__(self):
        per, size = BLOCK[self.qtype]
        if self.cols % per or self.data.dtype != torch.uint8 or self.data.shape[1] != self.cols // per * size:
            raise ValueError(f"{NAMES[self.qtype]} rows of {self.cols} weights need {self.cols // per * size} "
                             f"bytes each in whole {per}-weight blocks; got {tuple(self.data.shape)}")

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    @classmethod
    def from_numpy(cls, qtype: int, raw: np.ndarray, cols: int) -> "BlockTensor":
        """The rows of `raw` (a GGUF file's mapping, or an array) over the same bytes, not copied: a kernel copies
        what it keeps once, into advised memory (`stack_rows`, or gguf-q8's repack), and an embedding reads its
        rows from the file's pages. A copy here cost a second pass over fresh memory at every load."""
        raw = np.ascontiguousarray(raw).view(np.uint8).reshape(raw.shape[0], -1)
        return cls(qtype, torch.from_numpy(raw), cols)

    def resident(self) -> "BlockTensor":
        """A copy in advised memory of its own (`empty_on_huge_pages`): what an embedding keeps, so that no view
        holds a file's mapping (and its pages in the process's resident set) after the load."""
        data = empty_on_huge_pages(*self.data.shape)
        data.copy_(self.data)
        return BlockTensor(self.qtype, data, self.cols)

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> "BlockTensor":
        """Float32 weights as the F32 'format' (16 weights a block)."""
        w = weight.detach().float().contiguous()
        return cls(F32, w.view(torch.uint8).reshape(w.shape[0], -1).clone(), w.shape[1])

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Float32 [len(rows), cols]: the exact weights the kernel computes with."""
        ids = torch.arange(self.rows) if rows is None else rows.to(torch.int64).contiguous()
        if self.qtype == F32:
            return self.data[ids].view(torch.float32).clone()
        if not available():  # no kernel here (no compiler, not x86): gguf-py's numpy dequantizer, same values
            import gguf

            values = gguf.quants.dequantize(self.data[ids].numpy(), gguf.GGMLQuantizationType(self.qtype))
            return torch.from_numpy(np.array(values, dtype=np.float32)).reshape(ids.numel(), self.cols)
        out = torch.empty(ids.numel(), self.cols, dtype=torch.float32)
        library().bq_dequantize_rows(self.qtype, self.data.data_ptr(), self.cols, ids.data_ptr(), ids.numel(),
                                     out.data_ptr())
        return out


def format_runs(parts: list[BlockTensor]) -> list[list[BlockTensor]]:
    """Consecutive parts that share a format and width: each run can be one part (rows are independent)."""
    return [list(run) for _, run in itertools.groupby(parts, key=lambda part: (part.qtype, part.cols))]


def stack_rows(parts: list[BlockTensor]) -> list[BlockTensor]:
    """Each run of `format_runs` as one part, copied once into advised memory (`empty_on_huge_pages`): the
    weights a kernel keeps, never a file's mapping."""
    merged = []
    for run in format_runs(parts):
        data = empty_on_huge_pages(sum(part.rows for part in run), run[0].data.shape[1])
        merged.append(BlockTensor(run[0].qtype, torch.cat([part.data for part in run], out=data), run[0].cols))
    return merged


class BlockQuantKernel(Kernel):
    """y = x·Wᵀ + b with W given as row blocks (e.g. q, k, v of one layer), each in its own format."""

    def __init__(self, parts: list[BlockTensor], bias: torch.Tensor | None = None):
        super().__init__()
        self.parts = stack_rows(parts)
        self.in_features = parts[0].cols
        if any(p.cols != self.in_features for p in parts):
            raise ValueError("every part of a fused block kernel must have the same input width")
        self.out_features = sum(p.rows for p in self.parts)
        for index, part in enumerate(self.parts):
            self.register_buffer(f"part{index}", part.data)
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        self.name = "gguf-" + "+".join(dict.fromkeys(NAMES[p.qtype] for p in self.parts))
        self.lib = library()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float().contiguous()  # [T, K]
        rows = x.shape[0]
        y = torch.empty(rows, self.out_features, dtype=torch.float32)  # [T, N]
        threads, offset = torch.get_num_threads(), 0
        for part in self.parts:
            status = self.lib.bq_matmul(part.qtype, part.data.data_ptr(), part.rows, part.cols, x.data_ptr(), rows,
                                        y.data_ptr() + 4 * offset, self.out_features, threads)
            assert status == 0, f"bq_matmul refused {NAMES[part.qtype]} [{part.rows}, {part.cols}]"
            offset += part.rows
        return y if self.bias is None else y + self.bias


class BlockEmbedding(nn.Module):
    """An embedding table kept in its block format; a lookup dequantizes only the rows it needs."""

    def __init__(self, table: BlockTensor):
        super().__init__()
        self.table = table.resident()
        self.register_buffer("data", self.table.data)
        self.embedding_dim = table.cols

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = self.table.dequantize(ids.reshape(-1))  # [T, hidden]
        return flat.view(*ids.shape, self.embedding_dim)


# -- quantizers (tests and tiny models; the packaged models arrive quantized) -----------------------
def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(*values.shape[:-1], -1)


def _codes_with_mins(w: np.ndarray, top: int, scale_top: int):
    """Min/max codes per group of w [blocks, groups, size] (w ≈ d·sc·q − dmin·m, q ≤ top, sc and m ≤ scale_top):
    d and dmin [blocks, 1] (float16 values), sc and m [blocks, groups], q [blocks, groups, size]."""
    low, high = np.minimum(w.min(-1), 0), np.maximum(w.max(-1), 0)
    scale, minimum = (high - low) / top, -low  # per group: w ≈ scale·q − minimum
    d = (scale.max(-1, keepdims=True) / scale_top).astype(np.float16).astype(np.float32)
    dmin = (minimum.max(-1, keepdims=True) / scale_top).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(np.divide(scale, d, out=np.zeros_like(scale), where=d > 0)), 0, scale_top).astype(np.uint8)
    m = np.clip(np.round(np.divide(minimum, dmin, out=np.zeros_like(minimum), where=dmin > 0)), 0,
                scale_top).astype(np.uint8)
    step, offset = d * sc, dmin * m
    q = np.clip(np.round(np.divide(w + offset[..., None], step[..., None], out=np.zeros_like(w),
                                   where=step[..., None] > 0)), 0, top).astype(np.uint8)
    return d, dmin, sc, m, q


def quantize_q4_k(weight: np.ndarray, bits: int = 4) -> np.ndarray:
    """A plain Q4_K quantizer (min/max per 32 weights; llama.cpp's searches harder), [N, K] -> bytes; with
    `bits` 5, Q5_K (the same scales, and each quant's fifth bit in qh)."""
    d, dmin, sc, m, q = _codes_with_mins(weight.astype(np.float32).reshape(-1, 8, 32), 2**bits - 1, 63)
    packed = np.zeros((q.shape[0], 12), dtype=np.uint8)  # 6-bit scales and mins, GGML's packing
    packed[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    q = q.reshape(-1, 4, 2, 32)  # 64 weights a chunk: the first 32 in low nibbles, the next in high
    qs = ((q[:, :, 0] & 15) | ((q[:, :, 1] & 15) << 4)).reshape(-1, 128)
    fifth = [] if bits == 4 else [(q >> 4).reshape(-1, 8, 32).transpose(0, 2, 1) @ (1 << np.arange(8, dtype=np.uint8))]
    blocks = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), packed, *fifth, qs], axis=1)
    return blocks.reshape(weight.shape[0], -1)


def quantize_q2_k(weight: np.ndarray) -> np.ndarray:
    """A plain Q2_K quantizer (min/max per 16 weights; llama.cpp's searches harder), [N, K] -> bytes."""
    d, dmin, sc, m, q = _codes_with_mins(weight.astype(np.float32).reshape(-1, 16, 16), 3, 15)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]  # weight 128c + 32r + l: bits 2r of l
    qs = (q.reshape(-1, 2, 4, 32) << shifts).sum(2, dtype=np.uint8).reshape(-1, 64)
    blocks = np.concatenate([sc | (m << 4), qs, _f16_bytes(d), _f16_bytes(dmin)], axis=1)
    return blocks.reshape(weight.shape[0], -1)


def quantize_q6_k(weight: np.ndarray) -> np.ndarray:
    """A plain Q6_K quantizer (absmax per 16 weights), [N, K] -> bytes."""
    w = weight.astype(np.float32).reshape(-1, 16, 16)  # [blocks, groups, 16]
    scale = np.abs(w).max(-1) / 31
    d = (scale.max(-1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(np.divide(scale, d, out=np.zeros_like(scale), where=d > 0)), -128, 127).astype(np.int8)
    step = d * sc
    q = np.clip(np.round(np.divide(w, step[..., None], out=np.zeros_like(w), where=step[..., None] != 0)) + 32,
                0, 63).astype(np.uint8)
    return pack_q6_k(q.reshape(-1, 256), sc, d.astype(np.float16)).reshape(weight.shape[0], -1)


def pack_q6_k(q: np.ndarray, sc: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Q6_K blocks [blocks, 210] of codes q [blocks, 256] (0..63, value d·sc·(q − 32)), int8 scales sc [blocks, 16]
    (one per 16 weights) and float16 d [blocks, 1], in GGML's layout."""
    q = q.reshape(-1, 2, 4, 32)  # [blocks, halves, quarter, 32]
    ql = np.concatenate([q[:, :, 0] & 15 | ((q[:, :, 2] & 15) << 4), q[:, :, 1] & 15 | ((q[:, :, 3] & 15) << 4)],
                        axis=2).reshape(-1, 128)
    qh = (q[:, :, 0] >> 4 | (q[:, :, 1] >> 4) << 2 | (q[:, :, 2] >> 4) << 4 | (q[:, :, 3] >> 4) << 6).reshape(-1, 64)
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), d.view(np.uint8)], axis=1)


def quantize_q3_k(weight: np.ndarray) -> np.ndarray:
    """A plain Q3_K quantizer (per 16 weights the one of largest magnitude at code −4, as GGML's reference does
    without its search), [N, K] -> bytes."""
    w = weight.astype(np.float32).reshape(-1, 16, 16)  # [blocks, groups, 16]
    pick = np.take_along_axis(w, np.abs(w).argmax(-1)[..., None], -1)[..., 0]  # the largest magnitude, signed
    scale = pick / -4
    top = np.take_along_axis(scale, np.abs(scale).argmax(-1)[:, None], -1)  # [blocks, 1]
    d = (top / -32).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(np.divide(scale, d, out=np.zeros_like(scale), where=d != 0)), -32, 31)
    step = d * sc
    q = (np.clip(np.round(np.divide(w, step[..., None], out=np.zeros_like(w), where=step[..., None] != 0)), -4, 3)
         + 4).astype(np.uint8).reshape(-1, 256)
    hmask = ((q >> 2).reshape(-1, 8, 32) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(1, dtype=np.uint8)
    qs = ((q & 3).reshape(-1, 2, 4, 32) << np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]).sum(
        2, dtype=np.uint8).reshape(-1, 64)
    code = (sc + 32).astype(np.uint8)  # [blocks, 16], 0..63
    low, high = code & 15, code >> 4
    scales = np.concatenate([low[:, :8] | (low[:, 8:] << 4),
                             (high.reshape(-1, 4, 4) << np.array([0, 2, 4, 6], dtype=np.uint8)[None, :, None]).sum(
                                 1, dtype=np.uint8)], axis=1)
    return np.concatenate([hmask, qs, scales, _f16_bytes(d)], axis=1).reshape(weight.shape[0], -1)


def quantize_iq4(weight: np.ndarray, per_256: bool) -> np.ndarray:
    """A plain IQ4_NL quantizer, or IQ4_XS with `per_256` (per 32 weights the one of largest magnitude at the
    table's −127, each weight at its nearest table value; GGML's searches harder), [N, K] -> bytes."""
    w = weight.astype(np.float32).reshape(-1, 32)  # [blocks of 32, 32]
    scale = np.take_along_axis(w, np.abs(w).argmax(-1)[:, None], -1)[:, 0] / -127
    if per_256:  # d per 256 weights, the block scales as 6-bit codes ls: d·(ls − 32)
        scale = scale.reshape(-1, 8)
        top = np.take_along_axis(scale, np.abs(scale).argmax(-1)[:, None], -1)  # [super-blocks, 1]
        d = (top / -32).astype(np.float16).astype(np.float32)
        ratio = np.round(np.divide(scale, d, out=np.zeros_like(scale), where=d != 0))
        ls = (np.clip(ratio, -32, 31) + 32).astype(np.uint8)
        step = (d * (ls.astype(np.float32) - 32)).reshape(-1)
    else:
        d = scale.astype(np.float16).astype(np.float32)[:, None]
        step = d[:, 0]
    ratio = np.divide(w, step[:, None], out=np.zeros_like(w), where=step[:, None] != 0)
    index = np.abs(ratio[..., None] - IQ4_VALUES).argmin(-1).astype(np.uint8)  # [blocks of 32, 32]
    qs = (index[:, :16] | (index[:, 16:] << 4))  # [blocks of 32, 16]: Q4_0's nibble order
    if not per_256:
        return np.concatenate([_f16_bytes(d), qs], axis=1).reshape(weight.shape[0], -1)
    high = (ls.astype(np.uint16) >> 4 << (2 * np.arange(8, dtype=np.uint16))).sum(-1, dtype=np.uint16)
    low = (ls & 15).reshape(-1, 4, 2)
    return np.concatenate([_f16_bytes(d), high[:, None].view(np.uint8), low[..., 0] | (low[..., 1] << 4),
                           qs.reshape(-1, 128)], axis=1).reshape(weight.shape[0], -1)


def quantize(weight: torch.Tensor, qtype: int) -> BlockTensor:
    """`weight` [N, K] in `qtype` (K a whole number of blocks)."""
    w = weight.detach().float().cpu().numpy()
    if qtype == F32:
        return BlockTensor.from_float(weight)
    if qtype in (Q4_K, Q5_K):
        raw = quantize_q4_k(w, bits=4 if qtype == Q4_K else 5)
    elif qtype == Q6_K:
        raw = quantize_q6_k(w)
    elif qtype == Q3_K:
        raw = quantize_q3_k(w)
    elif qtype == Q2_K:
        raw = quantize_q2_k(w)
    elif qtype in (IQ4_NL, IQ4_XS):
        raw = quantize_iq4(w, per_256=qtype == IQ4_XS)
    else:
        import gguf

        raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType(qtype))
    return BlockTensor.from_numpy(qtype, raw, w.shape[1])
