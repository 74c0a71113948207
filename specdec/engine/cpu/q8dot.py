"""The "gguf-q8" compute path: GGUF weight blocks against 8-bit activations, with integer dot products.

Definition (`csrc/q8dot.c` states every step): each activation row is quantized per 32 values
(dx = amax / 127, u = round-half-even(x · 127 / amax)); each 32-weight block's dot of its integer quants
with u is exact (Q6_K's, Q3_K's and Q2_K's two 16-weight halves weighed by their integer scales), scaled in float32
by (s·dx) (less m·(dx·Σu) for Q4_K's and Q5_K's mins, plus it for Q4_1's and Q5_1's, less dmin·(dx·M) for Q2_K's,
M its halves' mins against their Σu in integers), and fed to accumulator j mod 16 in order; the 16 accumulators
are summed by halves. Each output is that one sequence of operations whatever rows share the pass, so the path is
row-invariant, and it is the same on every CPU level: the AVX-512 VNNI, AVX-VNNI, AVX-512 (BW, without VNNI), AVX2,
SSE4.1 and portable builds give identical bits.

Formats: Q4_K, Q5_K, Q6_K, Q3_K, Q5_0, Q4_0, Q8_0, IQ4_XS, IQ4_NL (their integer quants IQ4's table values), Q5_1,
Q4_1, Q2_K, repacked at load (the same bytes, reordered so that each lane of a 4-byte integer dot stays inside one
32-weight block). A tensor in any other format runs on the exact gguf kernel (`specdec.engine.cpu.blockquant`),
float32 activations.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import torch

from specdec.engine.cpu import native
from specdec.engine.cpu.blockquant import (IQ4_NL, IQ4_XS, NAMES, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K,
                                          Q6_K, Q8_0, BlockQuantKernel, BlockTensor, format_runs)
from specdec.engine.cpu.features import cpu_features
from specdec.engine.cpu.hugepages import empty_on_huge_pages
from specdec.engine.kernels import Kernel

log = logging.getLogger(__name__)

FORMATS = (Q4_K, Q5_K, Q6_K, Q3_K, Q5_0, Q4_0, Q8_0, IQ4_XS, IQ4_NL, Q5_1, Q4_1, Q2_K)  # what the integer kernel takes


def library(variant: str | None = None):
    """The integer kernel built for `variant` (a `native.Q8_VARIANTS` key; default: this CPU's)."""
    return native.load(variant or machine_variant(), native.Q8DOT)


def dot_peak(threads: int, variant: str | None = None, seconds: float = 0.2) -> float:
    """Multiply-adds per second of `variant`'s integer dot product at its best, on `threads` threads at once:
    cached activation rows against a register-resident weight super-block, nothing else (`q8_dot_peak`;
    about `seconds` a try, best of 3). The compute floor of a pass is its multiply-adds over this."""
    lib, rounds = library(variant), 1000
    while True:  # grow the rounds until a try takes a tenth of `seconds`, then scale to `seconds`
        began = time.perf_counter()
        lib.q8_dot_peak(threads, rounds)
        elapsed = time.perf_counter() - began
        if elapsed > seconds / 10:
            break
        rounds *= 4
    rounds = max(1, int(rounds * seconds / elapsed))
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        macs = lib.q8_dot_peak(threads, rounds)
        best = min(best, time.perf_counter() - began)
    return macs / best


def fastest(variants: tuple[str, ...], peak: Callable[[str], float]) -> str:
    """Of `variants`, the one with the highest `peak`; a lone variant is taken without timing it."""
    if len(variants) == 1:
        return variants[0]
    peaks = {variant: peak(variant) for variant in variants}
    log.info("gguf-q8 builds' integer dot peaks here: %s",
             ", ".join(f"{variant} {rate / 1e9:.0f} G multiply-adds/s" for variant, rate in peaks.items()))
    return max(variants, key=peaks.__getitem__)


@lru_cache(maxsize=None)
def machine_variant() -> str:
    """This CPU's build: its level's (`native.q8_variants_for`), and where a level has two, the one whose
    integer dot runs faster here, timed once a process (about 0.1 s each; they compute the same bits)."""
    threads = torch.get_num_threads()
    return fastest(native.q8_variants_for(cpu_features()), lambda variant: dot_peak(threads, variant, seconds=0.02))


ONE_ROW_PAIRS_GAIN = 0.97  # one-row passes go in pairs only where the best of them takes at most this of the other


def set_one_row_pairs(on: bool, lib=None) -> bool:
    """Set whether this process's one-row passes go over two weight rows at once (`q8_set_one_row_pairs` in `lib`,
    by default this CPU's build; in the 256-bit builds, passes of a few rows too). The bits are the same either
    way. Returns the setting now: False where the build has no pairs."""
    return bool((lib or library()).q8_set_one_row_pairs(int(on)))


def choose_one_row_pairs(one_token_pass: Callable[[], float], lib=None, repeats: int = 4) -> bool:
    """Whether this process's one-row passes go over two weight rows at once (`q8_set_one_row_pairs` in `lib`, by
    default this CPU's build): timed here on `one_token_pass` (seconds of a model's one-token forward), both
    settings alternating `repeats` times; pairs only where their best is ONE_ROW_PAIRS_GAIN of the other's or less.
    The bits are the same either way. Returns the setting taken (False where the build has no pairs)."""
    lib = lib or library()
    if not set_one_row_pairs(True, lib):
        return False
    best = {False: float("inf"), True: float("inf")}
    for _ in range(repeats):
        for pairs in (False, True):
            set_one_row_pairs(pairs, lib)
            best[pairs] = min(best[pairs], one_token_pass())
    taken = best[True] <= ONE_ROW_PAIRS_GAIN * best[False]
    set_one_row_pairs(taken, lib)
    log.info("gguf-q8: one-token passes over two weight rows at once %.1f ms, one at a time %.1f ms: %s",
             best[True] * 1e3, best[False] * 1e3, "in pairs" if taken else "one at a time")
    return taken


ONE_ROW_PAIRS = "pairs"  # in a gguf-q8 kernel's name, after its build, where its process takes one-row pairs


def states_one_row_pairs(kernel: str) -> bool:
    """Whether a gguf-q8 `kernel` name says its process takes one-row pairs, e.g. "gguf-q8-avx512-vnni-pairs-
    Q4_K+Q6_K" (`specdec.engine.compute.runner_kernel_name`)."""
    return f"-{ONE_ROW_PAIRS}-" in kernel


def use_one_row_pairs_of(kernel: str) -> bool:
    """Take in this process the one-row setting a gguf-q8 `kernel` name states: a baseline on the same kernels as
    a service's, `specdec.tools.bench.baseline`. Returns the setting now."""
    return set_one_row_pairs(states_one_row_pairs(kernel))


@lru_cache(maxsize=None)
def available() -> bool:
    """Whether the integer kernel can run here (a C compiler, or a prebuilt library)."""
    return native.loadable(library)


@dataclass(frozen=True, eq=False)  # eq=False: compared by identity, as tensors are
class RepackedTensor:
    """Rows of GGUF blocks in the integer kernel's super-block layout (the same bytes, reordered): data is
    uint8 [rows, q8_row_bytes(qtype, cols)]."""

    qtype: int
    cols: int
    data: torch.Tensor

    @classmethod
    def of(cls, parts: list[BlockTensor], lib) -> RepackedTensor:
        """`parts` (one format and width) repacked by `lib`, their rows one after another in advised memory: each
        read once where it lies (a file's mapping), no stacked copy between (rows repack on their own)."""
        qtype, cols = parts[0].qtype, parts[0].cols
        assert all((part.qtype, part.cols) == (qtype, cols) for part in parts)
        data = empty_on_huge_pages(sum(part.rows for part in parts), lib.q8_row_bytes(qtype, cols))
        first = 0
        for part in parts:
            status = lib.q8_repack(qtype, part.data.data_ptr(), part.rows, cols, data[first].data_ptr())
            assert status == 0, f"q8_repack refused {NAMES[qtype]} [{part.rows}, {cols}]"
            first += part.rows
        return cls(qtype, cols, data)

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    def slice(self, begin: int, end: int) -> RepackedTensor:
        """Rows [begin, end), sharing this tensor's bytes."""
        return RepackedTensor(self.qtype, self.cols, self.data[begin:end])


class Q8Kernel(Kernel):
    """y = x·Wᵀ + b on the gguf-q8 path, W given as row blocks (e.g. q, k, v of one layer) in their formats."""

    def __init__(self, parts: list[BlockTensor] | list[RepackedTensor], bias: torch.Tensor | None = None,
                 variant: str | None = None):
        super().__init__()
        self.variant, self.lib = variant, library(variant)
        self.in_features = parts[0].cols
        if any(p.cols != self.in_features for p in parts):
            raise ValueError("every part of a fused block kernel must have the same input width")
        self.parts: list[RepackedTensor | BlockQuantKernel] = []
        repacked_already = all(isinstance(p, RepackedTensor) for p in parts)
        runs = [[part] for part in parts] if repacked_already else format_runs(parts)
        for index, run in enumerate(runs):
            if repacked_already or run[0].qtype in FORMATS:
                repacked = run[0] if repacked_already else RepackedTensor.of(run, self.lib)
                self.register_buffer(f"part{index}", repacked.data)
                self.parts.append(repacked)
            else:  # float32 weights (or a format without integer kernel): the exact kernel, float activations
                exact = BlockQuantKernel(run)
                self.add_module(f"part{index}", exact)  # its weights counted in weight_bytes
                self.parts.append(exact)
        widths = [p.rows if isinstance(p, RepackedTensor) else p.out_features for p in self.parts]
        self.offsets = list(itertools.accumulate(widths, initial=0))[:-1]  # each part's first output column
        self.out_features = sum(widths)
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        # Each integer part's q8_matmul arguments that never change: (type, weights, rows, cols, first output
        # column, bias), for `integer_matmul` and the one-call layer loop (`decoder`). The pointers stay valid:
        # the buffers are this module's, and nothing moves them.
        self.integer_calls = [(part.qtype, part.data.data_ptr(), part.rows, part.cols, offset,
                               None if self.bias is None else self.bias.data_ptr() + 4 * offset)
                              for part, offset in zip(self.parts, self.offsets) if isinstance(part, RepackedTensor)]
        self.fully_integer = len(self.integer_calls) == len(self.parts)
        self.act_bytes = self.lib.q8_act_bytes(self.in_features)  # a row's activation blocks
        formats = dict.fromkeys(NAMES[p.qtype] if isinstance(p, RepackedTensor) else p.name.removeprefix("gguf-")
                                for p in self.parts)
        self.name = "gguf-q8-" + "+".join(formats)

    def row_subset(self, ranges: list[tuple[int, int]]) -> Q8Kernel | None:
        """The kernel of this one's output rows [begin, end) for each range, side by side, on the same
        repacked bytes (no copy); None unless every row is on the integer kernel in one part."""
        if len(self.parts) != 1 or not isinstance(self.parts[0], RepackedTensor):
            return None
        bias = None if self.bias is None else torch.cat([self.bias[a:b] for a, b in ranges])
        return Q8Kernel([self.parts[0].slice(a, b) for a, b in ranges], bias, self.variant)

    def integer_matmul(self, x: int, rows: int, y: int, act: int, threads: int) -> None:
        """y = x · Wᵀ + b by address: x [rows, K] and y [rows, N] float32 contiguous, act scratch of rows ·
        `act_bytes` bytes; the integer parts only (all of them when `fully_integer`). No allocation, no
        tensor: what a decoder layer's loop calls (`specdec.engine.cpu.layer_ops`)."""
        self.lib.q8_quantize(x, rows, self.in_features, act)
        for qtype, weights, n, k, offset, bias in self.integer_calls:
            status = self.lib.q8_matmul(qtype, weights, n, k, act, rows, y + 4 * offset, self.out_features, bias,
                                        threads)
            if status == -2:
                raise MemoryError(f"q8_matmul: no memory for the accumulators of {rows} rows x {n}")
            assert status == 0, f"q8_matmul refused {NAMES[qtype]} [{n}, {k}]"

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or not x.is_contiguous():
            x = x.float().contiguous()  # [T, K]
        rows = x.shape[0]
        y = torch.empty(rows, self.out_features, dtype=torch.float32)  # [T, N]
        if self.integer_calls:
            act = torch.empty(rows, self.act_bytes, dtype=torch.uint8)
            self.integer_matmul(x.data_ptr(), rows, y.data_ptr(), act.data_ptr(), torch.get_num_threads())
        for part, offset in zip(self.parts, self.offsets):
            if not isinstance(part, RepackedTensor):  # the exact kernel, and the bias added as the others' is
                part_y = part.matmul(x)
                if self.bias is not None:
                    part_y = part_y + self.bias[offset:offset + part.out_features]
                y[:, offset:offset + part.out_features] = part_y
        return y


PACKED_PATHS = ("gguf", "gguf-q8")  # the paths that compute with a GGUF model's own weight blocks


def block_kernel(path: str, parts: list[BlockTensor], bias: torch.Tensor | None = None) -> Kernel:
    """The kernel of a packed path over `parts`: integer dots on "gguf-q8", exact float32 on "gguf"."""
    return Q8Kernel(parts, bias) if path == "gguf-q8" else BlockQuantKernel(parts, bias)
