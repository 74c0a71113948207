"""The gguf-q8 path: GGUF blocks against 8-bit activations, with integer dot products.

Its kernel is checked bit for bit against a plain transcription of its definition (below, from the
raw GGUF bytes, sharing no code with the kernel), on every build this CPU can run (AVX-512 VNNI,
AVX-VNNI, AVX-512 without VNNI, AVX2, SSE4.1, portable C); its rows against themselves computed alone;
and the model on it against the exact gguf path.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import GGUF_TARGET
from test_gguf_path import assert_rows_invariant, random_blocks

from specdec.engine.cpu import native, q8dot
from specdec.engine.cpu.blockquant import (BLOCK, F32, IQ4_NL, IQ4_XS, NAMES, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1,
                                           Q5_K, Q6_K, Q8_0, BlockTensor, quantize)
from specdec.engine.cpu.features import cpu_features
from specdec.engine.cpu.q8dot import Q8Kernel, dot_peak, fastest, machine_variant
from specdec.engine.models import load_model
from specdec.engine.runner import Step

FORMATS = [Q4_K, Q5_K, Q6_K, Q3_K, Q5_0, Q4_0, Q8_0, IQ4_XS, IQ4_NL, Q5_1, Q4_1, Q2_K]
VARIANTS = [pytest.param(v, marks=pytest.mark.skipif(not native.runnable(v), reason=f"this CPU cannot run {v}"))
            for v in native.Q8_VARIANTS]


# -- the definition, transcribed -------------------------------------------------------------------
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113])  # GGML's


def _iq4_values(qs: np.ndarray, n: int, cols: int) -> np.ndarray:
    """IQ4's 16 index bytes of each 32-weight block (l in the low nibble of byte l, 16 + l in its high one) as the
    table's values [N, K]."""
    qs = qs.reshape(n, -1, 16).astype(np.int64)
    return KVALUES_IQ4NL[np.concatenate([qs & 15, qs >> 4], axis=-1)].reshape(n, cols)


def _half(raw: np.ndarray, offset: int) -> np.ndarray:
    return raw[..., offset:offset + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def integer_weights(qtype: int, raw: np.ndarray, cols: int):
    """From GGUF bytes [N, row bytes]: quants q [N, K] (offset removed), every 32-weight block's float scale s
    and min m [N, K/32] (m only for Q4_K, Q5_K and Q2_K (its dmin); Q4_1's and Q5_1's m negated, their min term
    being added), the integer scale of every 16-weight half [N, K/16] of Q6_K, Q3_K and Q2_K, and Q2_K's integer min
    of each half [N, K/16] (else None), all as the definition has them."""
    n = raw.shape[0]
    if qtype == Q2_K:  # weight 128c + 32r + l: bits 2r of qs[32c + l], its 16's scale and min in scales[8c + 2r + l/16]
        b = raw.reshape(n, -1, 84)
        scales = b[..., :16].astype(np.int64).reshape(n, -1)
        q = (b[..., 16:80].reshape(n, -1, 2, 1, 32).astype(np.int32) >> (2 * np.arange(4)).reshape(4, 1)) & 3
        s, m = np.repeat(_half(b, 80), 8, axis=-1), np.repeat(_half(b, 82), 8, axis=-1)
        return q.reshape(n, cols), s, m, scales & 15, scales >> 4
    if qtype in (Q4_K, Q5_K):
        b = raw.reshape(n, -1, BLOCK[qtype][1])
        d, dmin, packed = _half(b, 0), _half(b, 2), b[..., 4:16].astype(np.int32)
        sc, mn = np.empty(b.shape[:2] + (8,), np.int32), np.empty(b.shape[:2] + (8,), np.int32)
        sc[..., :4], mn[..., :4] = packed[..., 0:4] & 63, packed[..., 4:8] & 63
        sc[..., 4:] = (packed[..., 8:12] & 15) | ((packed[..., 0:4] >> 6) << 4)
        mn[..., 4:] = (packed[..., 8:12] >> 4) | ((packed[..., 4:8] >> 6) << 4)
        qs = b[..., -128:].reshape(n, -1, 4, 32).astype(np.int32)
        q = np.stack([qs & 15, qs >> 4], axis=3)  # chunk j: 32 low nibbles, then 32 high
        if qtype == Q5_K:  # bit 2j of qh[l]: the fifth of chunk j's low nibble l, bit 2j + 1 of its high one's
            qh = b[..., 16:48].astype(np.int32)[:, :, None, None, :]
            q = q | (((qh >> np.arange(8).reshape(4, 2, 1)) & 1) << 4)
        q = q.reshape(n, cols)
        s = (d[..., None] * sc.astype(np.float32)).reshape(n, -1)
        m = (dmin[..., None] * mn.astype(np.float32)).reshape(n, -1)
        return q, s, m, None, None
    if qtype == Q6_K:
        b = raw.reshape(n, -1, 210)
        ql, qh = b[..., :128].reshape(n, -1, 2, 64).astype(np.int32), b[..., 128:192].reshape(n, -1, 2, 32).astype(np.int32)
        low = np.stack([ql[..., :32] & 15, ql[..., 32:] & 15, ql[..., :32] >> 4, ql[..., 32:] >> 4], axis=3)
        high = np.stack([(qh >> shift) & 3 for shift in (0, 2, 4, 6)], axis=3)
        q = (low | (high << 4)).reshape(n, cols) - 32
        s = np.repeat(_half(b, 208), 8, axis=-1)  # d, for each of the super-block's 8 blocks
        return q, s, None, b[..., 192:208].view(np.int8).astype(np.int64).reshape(n, -1), None
    if qtype == Q3_K:  # weight 128c + 32r + l: bits 2r of qs[32c + l], bit 4c + r of hmask[l] its third
        b = raw.reshape(n, -1, 110)
        hmask, packed = b[..., :32].astype(np.int32), b[..., 96:108].astype(np.int32)
        low = (b[..., 32:96].reshape(n, -1, 2, 1, 32).astype(np.int32) >> (2 * np.arange(4)).reshape(4, 1)) & 3
        third = (hmask[:, :, None, None, :] >> (4 * np.arange(2).reshape(2, 1, 1) + np.arange(4).reshape(4, 1))) & 1
        q = (low | (third << 2)).reshape(n, cols) - 4
        j = np.arange(16)  # scale j: low four bits in byte j % 8 at 4·(j / 8), high two in byte 8 + j % 4 at 2·(j / 4)
        sc = ((packed[..., j % 8] >> (4 * (j // 8))) & 15) | (((packed[..., 8 + j % 4] >> (2 * (j // 4))) & 3) << 4)
        return q, np.repeat(_half(b, 108), 8, axis=-1), None, (sc - 32).astype(np.int64).reshape(n, -1), None
    b = raw.reshape(n, -1, BLOCK[qtype][1])
    d = _half(b, 0)
    if qtype == IQ4_XS:  # block j of 32: its indices at qs + 16j, its scale d·(ls − 32), ls 6 bits: low four in
        # scales_l[j / 2] at 4·(j % 2), high two in scales_h (16 bits) at 2j
        j = np.arange(8)
        high = b[..., 2].astype(np.int64) | (b[..., 3].astype(np.int64) << 8)
        ls = ((b[..., 4 + j // 2] >> (4 * (j % 2))) & 15) | (((high[..., None] >> (2 * j)) & 3) << 4)
        s = (d[..., None] * (ls - 32).astype(np.float32)).reshape(n, -1)
        return _iq4_values(b[..., 8:], n, cols), s, None, None, None
    if qtype in (Q4_1, Q5_1):  # d, m, (Q5_1: qh as Q5_0's), then Q4_0's nibbles: d·q + m
        nibbles = b[..., -16:].astype(np.int32)
        q = np.concatenate([nibbles & 15, nibbles >> 4], axis=-1)
        if qtype == Q5_1:
            q = q | (np.unpackbits(b[..., 4:8], axis=-1, bitorder="little").astype(np.int32) << 4)
        return q.reshape(n, cols), d.reshape(n, -1), -_half(b, 2).reshape(n, -1), None, None
    if qtype == IQ4_NL:
        q = _iq4_values(b[..., 2:], n, cols)
    elif qtype == Q4_0:
        nibbles = b[..., 2:18].astype(np.int32)
        q = np.concatenate([nibbles & 15, nibbles >> 4], axis=-1).reshape(n, cols) - 8
    elif qtype == Q5_0:
        bits = np.unpackbits(b[..., 2:6], axis=-1, bitorder="little").astype(np.int32)  # [.., 32]
        nibbles = b[..., 6:22].astype(np.int32)
        q = np.concatenate([nibbles & 15, nibbles >> 4], axis=-1) | (bits << 4)
        q = q.reshape(n, cols) - 16
    else:
        q = b[..., 2:34].view(np.int8).astype(np.int32).reshape(n, cols)
    return q, d.reshape(n, -1), None, None, None


def reference(qtype: int, raw: np.ndarray, cols: int, x: torch.Tensor) -> torch.Tensor:
    """y [S, N] by the definition: every float step rounded to float32, in the stated order."""
    q, s, m, half_scales, half_mins = integer_weights(qtype, raw, cols)
    rows = x.shape[0]
    blocks = x.float().view(rows, -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    dx = amax / 127
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    u = (blocks * inv).round().clamp(-127, 127).view(rows, -1, 2, 16).to(torch.int64)  # [S, K/32, half, 16]
    dx = dx[..., 0]  # [S, K/32]
    q16 = torch.from_numpy(q).view(q.shape[0], -1, 2, 16).to(torch.int64)  # [N, K/32, half, 16]
    halves = torch.einsum("sjhk,njhk->snjh", u, q16)  # exact integer sums of the 16-weight halves
    if half_scales is not None:  # Q6_K, Q3_K and Q2_K: each half times its integer scale
        halves = halves * torch.from_numpy(half_scales).view(q.shape[0], -1, 2)[None]
    sums = halves.sum(-1).float()  # [S, N, K/32], exact: |I| < 2^24
    terms = (torch.from_numpy(s)[None] * dx[:, None]) * sums
    if half_mins is not None:  # Q2_K: M = m₁·Σ₁u + m₂·Σ₂u in integers, then less dmin·(dx·M)
        mins = torch.einsum("sjh,njh->snj", u.sum(-1), torch.from_numpy(half_mins).view(q.shape[0], -1, 2))
        terms = terms - torch.from_numpy(m)[None] * (dx[:, None] * mins.float())
    elif m is not None:
        dx_sum = dx * u.sum((-1, -2)).float()  # [S, K/32]
        terms = terms - torch.from_numpy(m)[None] * dx_sum[:, None]
    lanes = torch.zeros(rows, q.shape[0], 16)
    for j in range(terms.shape[-1]):
        lanes[..., j % 16] = lanes[..., j % 16] + terms[..., j]
    for width in (8, 4, 2, 1):  # by halves: (a[i] + a[i + width])
        lanes = lanes[..., :width] + lanes[..., width:2 * width]
    return lanes[..., 0]


def activations(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """Rows of every scale, with an all-zero group, exact ties at .5 and a lone large value."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=generator) * torch.logspace(-3, 2, rows)[:, None]
    x[0, :32] = 0.0
    x[-1, 32:64] = torch.cat([torch.tensor([127.0]), torch.arange(31) - 14.5])  # scale 1: u on .5 ties
    x[-1, 100] = 1e4
    return x


# -- the kernel --------------------------------------------------------------------------------------
BIT_FOR_BIT_CASES = [(Q4_K, 512, 8), (Q6_K, 768, 8), (Q5_0, 896, 8), (Q8_0, 896, 8), (Q4_K, 768, 8), (Q6_K, 512, 8),
                     (Q5_0, 160, 8), (Q8_0, 544, 8), (Q5_0, 672, 8), (Q8_0, 1248, 8),
                     (Q5_0, 2688, 16), (Q8_0, 2656, 16), (Q4_K, 2816, 16), (Q6_K, 2816, 16),
                     (Q4_0, 896, 8), (Q4_0, 160, 8), (Q4_0, 1248, 8), (Q4_0, 2688, 16),
                     (Q4_K, 7168, 8), (Q6_K, 7168, 8), (Q4_K, 7168, 16), (Q6_K, 7168, 16), (Q8_0, 7200, 16),
                     (Q5_K, 512, 8), (Q5_K, 768, 8), (Q5_K, 2816, 16), (Q5_K, 7168, 16),
                     (Q3_K, 512, 8), (Q3_K, 768, 8), (Q3_K, 2816, 16), (Q3_K, 7168, 16),
                     (IQ4_XS, 512, 8), (IQ4_XS, 768, 8), (IQ4_XS, 2816, 16), (IQ4_XS, 7168, 16),
                     (IQ4_NL, 896, 8), (IQ4_NL, 160, 8), (IQ4_NL, 1248, 8), (IQ4_NL, 2688, 16), (IQ4_NL, 7200, 16),
                     (Q5_1, 896, 8), (Q5_1, 160, 8), (Q5_1, 2688, 16), (Q4_1, 896, 8), (Q4_1, 1248, 8),
                     (Q4_1, 2656, 16), (Q5_1, 7200, 16), (Q2_K, 512, 8), (Q2_K, 768, 8), (Q2_K, 2816, 16),
                     (Q2_K, 7168, 16)]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("qtype,cols,rows", BIT_FOR_BIT_CASES,
                         ids=[f"{NAMES[qtype]}-{cols}x{rows}" for qtype, cols, rows in BIT_FOR_BIT_CASES])
def test_kernel_computes_its_definition_bit_for_bit(variant, qtype, cols, rows):
    """Every build, every format, against the transcription: the same bits, whatever the level. Rows of an odd
    number of super-blocks (768, 2816, and the 32-weight formats' 160 to 2688) end in a half unit with
    AVX-512; the 32-weight formats' rows end in a partial super-block of 4, 1, 5, 7 and 3 blocks (896 and 2688,
    544, 672, 1248, 2656, 7200) or are one block short of a single one (160); 13-16 rows of 2688, 2656, 2816,
    7168 and 7200, and 8 of 7168, go in chunks of units (asked of the kernel), the partial or half one in the last;
    with AVX2 and AVX-VNNI, which chunk only from 128 KiB of activations, 13-16 rows of 7168 and 7200 alone. With VNNI,
    passes of 2-14 rows go over two weight columns at once (the two halves of each worker's 18 or 19 of the 37),
    an odd last one alone, in groups of 4-7 from 8 rows, and so do the chunked ones (Q8_0's up to 7 rows), over
    whole rows (16 rows: 5-6); their units go chunk by chunk at 5-7 rows (Q6_K's accumulators in memory at 6-7),
    and at 3-4 unless the activations outgrow 32 KiB (3-4 rows of 7168: whole units); Q8_0 as q + 128 less
    128 · Σu, and IQ4's values the same way. AVX-512 without VNNI pairs 2-4 rows but Q8_0's and IQ4's (signed: |q|
    with its sign on the activations), and the chunked ones in groups of 4. With AVX2 a unit goes chunk by chunk
    against 2-8 rows (2-5 for Q5_0 and Q6_K; the signed codes, Q8_0's and IQ4's, one chunk at a time), with AVX-VNNI
    against 2-8 (2-5 for Q6_K), whole from there. Every row count from 1 to 14 is checked, and 16."""
    raw = random_blocks(qtype, 37, cols, seed=qtype)
    if qtype == Q8_0:  # every int8 code, −128 included
        codes = raw.reshape(37, -1, 34)[..., 2:]
        codes[...] = np.resize(np.arange(256, dtype=np.uint8), codes.shape)
    x = activations(rows, cols)
    kernel = Q8Kernel([BlockTensor.from_numpy(qtype, raw, cols)], variant=variant)
    whole_rows = kernel.lib.q8_chunk_units(cols, 1)
    chunked = cols >= 7168 and rows == 16 if variant in ("avx2", "avx-vnni") else cols >= 7168 or rows == 16
    assert (kernel.lib.q8_chunk_units(cols, rows) < whole_rows) == chunked
    want = reference(qtype, raw, cols, x)
    assert torch.equal(kernel(x), want)
    parts = [slice(0, 2), slice(3, 6), slice(2, 6), slice(0, 1), slice(1, 6), slice(2, 8), slice(0, 7)]
    if rows == 16:  # 8-14 rows in two groups with VNNI
        parts += [slice(0, 9), slice(4, 14), slice(0, 11), slice(2, 14), slice(0, 13), slice(1, 15)]
    for part in parts:
        assert torch.equal(kernel(x[part]), want[part])


ONE_ROW_CASES = [(Q4_K, 512), (Q4_K, 768), (Q6_K, 768), (Q6_K, 2816), (Q5_0, 896), (Q5_0, 160), (Q4_0, 1248),
                 (Q8_0, 544), (Q5_K, 768), (Q3_K, 768), (Q3_K, 2816), (IQ4_XS, 768), (IQ4_XS, 2816), (IQ4_NL, 1248),
                 (Q5_1, 896), (Q4_1, 160), (Q2_K, 768), (Q2_K, 2816)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_passes_with_one_row_pairs_compute_the_definition(variant):
    """With the one-row setting on (`q8_set_one_row_pairs`, which a process takes where its CPU runs one-row
    passes over two weight rows at once faster), passes of 1-6 rows give the definition's bits in every format,
    rows ending in a half unit (768, 2816) or a partial super-block too, over 37 columns (an odd one alone): in
    the 256-bit builds the setting also pairs passes of a few rows, their accumulators in memory between units
    (AVX-VNNI: 2-5 rows, Q6_K's 2-3; AVX2: Q4_K's, Q4_0's and the signed codes' (Q8_0, IQ4) 2-4, Q5_0's and Q6_K's
    2, the signed ones as |q| with its sign on the activations), and 6 rows stay single.
    The AVX-512, AVX-VNNI and AVX2 builds can pair, the others keep it off."""
    with one_row_pairs(variant) as taken:
        assert taken == can_pair(variant)
        for qtype, cols in ONE_ROW_CASES:
            raw = random_blocks(qtype, 37, cols, seed=qtype)
            x = activations(7, cols)
            kernel = Q8Kernel([BlockTensor.from_numpy(qtype, raw, cols)], variant=variant)
            want = reference(qtype, raw, cols, x)
            for row in range(3):
                assert torch.equal(kernel(x[row:row + 1]), want[row:row + 1]), (NAMES[qtype], cols, row)
            for rows in range(2, 7):
                assert torch.equal(kernel(x[1:1 + rows]), want[1:1 + rows]), (NAMES[qtype], cols, rows)


WIDE_PAIR_CASES = [(Q4_K, 7168), (Q4_0, 2688), (Q4_1, 4640), (Q6_K, 7168), (Q8_0, 7200)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_wide_passes_with_one_row_pairs_compute_the_definition(variant):
    """With the one-row setting on, passes of 1-16 rows whose activations outgrow the L1 give the definition's bits.
    At AVX2, Q4_K's, Q4_0's and Q4_1's go over two weight rows in groups of up to 5 activation rows once a pass's
    activations pass 48 KiB (`PAIR_GROUPS_FROM_BYTES`): 7,168 wide from 5 rows, 4,640 (a partial super-block) from
    7, 2,688 (a half unit last) from 12; Q6_K and Q8_0 pair in one group as before, and single from there."""
    with one_row_pairs(variant):
        for qtype, cols in WIDE_PAIR_CASES:
            raw = random_blocks(qtype, 37, cols, seed=qtype)
            x = activations(16, cols)
            kernel = Q8Kernel([BlockTensor.from_numpy(qtype, raw, cols)], variant=variant)
            want = reference(qtype, raw, cols, x)
            for rows in range(1, 17):
                assert torch.equal(kernel(x[16 - rows:]), want[16 - rows:]), (NAMES[qtype], cols, rows)


@contextlib.contextmanager
def one_row_pairs(variant: str, on: bool = True):
    """`variant`'s build with the one-row setting `on` (yields what the build took), set back off after."""
    lib = q8dot.library(variant)
    try:
        yield lib.q8_set_one_row_pairs(int(on))
    finally:
        lib.q8_set_one_row_pairs(0)


def can_pair(variant: str) -> bool:
    """Whether a build takes one-row pairs: AVX-512's (64-byte chunks), AVX-VNNI's and AVX2's (chunk by chunk)."""
    return variant.startswith("avx512") or variant in ("avx-vnni", "avx2")


class FakePairs:
    """A kernel library's pairing switch, for `choose_one_row_pairs`: whether its build can pair, and its state."""

    def __init__(self, can_pair: bool = True):
        self.can_pair, self.on = can_pair, 0

    def q8_set_one_row_pairs(self, on: int) -> int:
        self.on = int(bool(on) and self.can_pair)
        return self.on


def test_a_kernel_name_carries_the_one_row_setting_to_a_baseline():
    """A gguf-q8 kernel's name states whether its process takes one-row pairs, and a baseline's process that reads
    it takes the same (where this CPU's build can pair: a build without pairs stays off)."""
    pairs = can_pair(q8dot.library().q8_level().decode())
    try:
        assert q8dot.use_one_row_pairs_of("gguf-q8-x-pairs-Q4_K+Q6_K") is pairs
        assert q8dot.use_one_row_pairs_of("gguf-q8-x-Q4_K+Q6_K") is False
        assert q8dot.use_one_row_pairs_of("gguf-q8-x-pairs-Q4_K+Q6_K") is pairs
    finally:
        q8dot.library().q8_set_one_row_pairs(0)


@pytest.mark.parametrize("paired_ms, taken", [(30.0, True), (38.7, True), (39.0, False), (45.0, False)])
def test_one_row_pairs_are_taken_where_they_time_faster(paired_ms, taken):
    """Timed alternating on the model's one-token pass, pairs are taken only at ONE_ROW_PAIRS_GAIN (0.97) of the
    single rows' best time or less, the switch left as decided; a build without pairs is not timed."""
    lib, seen = FakePairs(), []

    def one_token_pass():
        seen.append(lib.on)
        return (paired_ms if lib.on else 40.0 + len(seen) % 3) / 1e3

    assert q8dot.choose_one_row_pairs(one_token_pass, lib, repeats=3) is taken and lib.on == taken
    assert seen == [0, 1] * 3
    no_pairs = FakePairs(can_pair=False)
    assert q8dot.choose_one_row_pairs(lambda: pytest.fail("not timed"), no_pairs) is False and no_pairs.on == 0


QUANT_BYTES = {Q4_K: slice(16, 144), Q5_K: slice(16, 176), Q6_K: slice(0, 192), Q3_K: slice(0, 96), Q5_0: slice(2, 22),
               Q4_0: slice(2, 18), Q8_0: slice(2, 34), IQ4_XS: slice(8, 136), IQ4_NL: slice(2, 18), Q5_1: slice(4, 24),
               Q4_1: slice(4, 20), Q2_K: slice(16, 80)}
LARGEST_CODE = {Q8_0: 0x80, IQ4_XS: 0x00, IQ4_NL: 0x00}  # −128; IQ4's index 0 (−127) in both nibbles; else 0xFF


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("qtype", FORMATS, ids=NAMES.get)
def test_largest_products_do_not_overflow(variant, qtype):
    """Every quant at its largest code (Q8_0: −128, IQ4: −127, as 128 and 127 with their sign on the activations; with
    VNNI every Q8_0 code and IQ4 value goes in as q + 128 and int32 sums, which these cannot overflow) against
    activations at ±127: the builds without VNNI sum u8·s8 pairs in int16 (`vpmaddubsw`, saturating), whose
    bound, 2·128·127, this reaches, and add the pair sums of several chunks in int16 before widening (8 for
    Q4_K and Q4_0, 4 for Q5_0, 2 for Q6_K, 1 for Q8_0): one more chunk for Q5_0, Q6_K or Q8_0 would overflow here;
    Q6_K's pair sums then weighed by its int8 scales (`vpmaddwd`), the largest of them included. With the one-row
    setting too, where the build pairs (AVX2's Q8_0 pairs as |q| and its sign, widened every chunk)."""
    raw = random_blocks(qtype, 8, 512, seed=7)
    blocks = raw.reshape(8, -1, BLOCK[qtype][1])
    blocks[..., QUANT_BYTES[qtype]] = LARGEST_CODE.get(qtype, 0xFF)
    if qtype == Q6_K:  # the int8 scales at their extremes, 127 and −128
        blocks[..., 192:208] = np.resize(np.array([0x7F, 0x80], np.uint8), 16)
    if qtype == Q3_K:  # the scales at their extremes, 31 and −32 (even and odd j)
        blocks[..., 96:108] = np.resize(np.array([0xFF, 0x00], np.uint8), 12)
    if qtype == Q2_K:  # every half's scale and min at 15
        blocks[..., 0:16] = 0xFF
    if qtype == IQ4_XS:  # the scale codes at their extremes, 63 and 0 (ls − 32: 31 and −32; even and odd j)
        blocks[..., 2:8] = [0x33, 0x33, 0x0F, 0x0F, 0x0F, 0x0F]
    x = torch.full((3, 512), 2.0)
    x[1] = -2.0
    x[2, ::2] = -2.0
    kernel = Q8Kernel([BlockTensor.from_numpy(qtype, raw, 512)], variant=variant)
    want = reference(qtype, raw, 512, x)
    for pairs in (False, True):
        with one_row_pairs(variant, pairs):
            assert torch.equal(kernel(x), want), pairs
            assert torch.equal(kernel(x[1:2]), want[1:2]), pairs


def test_each_row_is_the_same_whatever_it_is_computed_with():
    """1..14 rows, in formats side by side (and a float32 part, which runs on the exact kernel)."""
    parts = [BlockTensor.from_numpy(q, random_blocks(q, 16, 512, seed=q), 512) for q in FORMATS]
    parts.append(BlockTensor.from_float(torch.randn(8, 512)))
    kernel = Q8Kernel(parts, torch.randn(16 * len(FORMATS) + 8))
    assert kernel.name == "gguf-q8-Q4_K+Q5_K+Q6_K+Q3_K+Q5_0+Q4_0+Q8_0+IQ4_XS+IQ4_NL+Q5_1+Q4_1+Q2_K+F32"
    assert_rows_invariant(kernel, torch.randn(17, 512))


def test_products_track_the_exact_weights():
    """The path's error is the activations' 8-bit rounding: small against x·Wᵀ of the exact weights."""
    weight = torch.randn(64, 1024)
    for qtype in FORMATS:
        tensor = quantize(weight, qtype)
        x = torch.randn(4, 1024)
        exact = x @ tensor.dequantize().T
        error = (Q8Kernel([tensor])(x) - exact).norm() / exact.norm()
        assert error < 0.01, f"{NAMES[qtype]}: relative error {error:.4f}"


def test_formats_without_an_integer_kernel_run_exact():
    tensor = BlockTensor.from_float(torch.randn(8, 64))
    kernel = Q8Kernel([tensor])
    x = torch.randn(3, 64)
    torch.testing.assert_close(kernel(x), x @ tensor.dequantize().T, rtol=1e-5, atol=1e-5)
    assert tensor.qtype == F32 and kernel.name == "gguf-q8-F32"
    assert kernel.weight_bytes() == 8 * 64 * 4, "the exact part's weights count as the kernel's"


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_dot_peak_counts_the_multiply_adds_it_does(variant):
    """The compute floor's peak: every thread dots 8 rows with one weight unit (256 or 512 weights) a round."""
    lib = q8dot.library(variant)
    assert lib.q8_unit_weights() in (256, 512)
    assert lib.q8_dot_peak(2, 10) == 2 * 10 * 8 * lib.q8_unit_weights()
    assert dot_peak(1, variant, seconds=0.005) > 0


def test_the_machines_variant_is_its_level():
    features = cpu_features()
    candidates = native.q8_variants_for(features)
    assert candidates == (("avx512-vnni",) if features.has("avx512_vnni") else
                          ("avx-vnni",) if features.has("avx2") and features.vnni else
                          ("avx512", "avx2") if features.has("avx512") else
                          ("avx2",) if features.has("avx2") else ("sse4.1",))
    assert machine_variant() in candidates and q8dot.library().q8_level().decode() == machine_variant()


def test_of_two_builds_the_faster_one_here_is_taken():
    """Where a level has two builds (AVX-512 without VNNI: 512-bit multiplies that a Skylake-SP may run at a lower
    clock, or the AVX2 build), the one whose dot peak is higher; a lone build is taken untimed."""
    timed = []

    def peak(variant):
        timed.append(variant)
        return {"avx512": 2.0e11, "avx2": 3.0e11}[variant]

    assert fastest(("avx512", "avx2"), peak) == "avx2" and timed == ["avx512", "avx2"]
    assert fastest(("avx512", "avx2"), lambda variant: {"avx512": 8.6e11, "avx2": 3.5e11}[variant]) == "avx512"
    assert fastest(("avx2",), lambda variant: pytest.fail("a lone build is not timed")) == "avx2"


@pytest.mark.skipif(not native.runnable("avx512"), reason="this CPU has no AVX-512")
def test_a_cpu_capped_at_avx512_without_vnni_times_both_of_its_builds():
    """A process capped at `avx512` chooses between the avx512 and avx2 builds by their timing, and its kernel
    is the one it chose."""
    probe = ("from specdec.engine.cpu import native, q8dot; from specdec.engine.cpu.features import cpu_features; "
             "print(native.q8_variants_for(cpu_features()), q8dot.machine_variant(), "
             "q8dot.library().q8_level().decode())")
    run = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "SPECDEC_CPU_ISA": "avx512"},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    candidates, chosen, level = run.stdout.strip().rsplit(" ", 2)
    assert candidates == "('avx512', 'avx2')" and chosen in ("avx512", "avx2") and level == chosen


# -- the model on it ---------------------------------------------------------------------------------
def test_gguf_models_default_to_the_integer_path_and_track_the_exact_one():
    """A GGUF source runs on gguf-q8 by default (`--dtype gguf` keeps the exact path), names its build,
    and its logits and greedy choices track the exact path's."""
    q8 = load_model(GGUF_TARGET, "cpu")
    exact = load_model(GGUF_TARGET, "cpu", dtype="gguf")
    level = machine_variant()
    assert q8.choice.path == "gguf-q8" and q8.choice.kernel in (f"gguf-q8-{level}-Q4_K+Q6_K",
                                                                 f"gguf-q8-{level}-pairs-Q4_K+Q6_K")
    assert (exact.choice.path, exact.choice.kernel) == ("gguf", "gguf-Q4_K+Q6_K") and q8.choice.row_invariant
    tokens = [5, 17, 101, 3, 250, 42, 7, 9, 11, 13, 200, 31]
    logits = [m.runner.forward([Step(m.runner.new_cache(), tokens, logits=len(tokens))])[0] for m in (q8, exact)]
    assert torch.nn.functional.cosine_similarity(logits[0], logits[1], dim=-1).min() > 0.995
    assert (logits[0].argmax(-1) == logits[1].argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("exact", [False, True], ids=["gguf-q8", "gguf"])
def test_the_same_bits_from_any_thread_and_from_two_at_once(exact):
    """The kernels split columns over threads from whichever thread calls (libgomp on the initial one,
    a worker pool of ours elsewhere; a second caller meanwhile runs alone): never a different result."""
    import threading

    from specdec.engine.cpu.blockquant import BlockQuantKernel

    parts = [BlockTensor.from_numpy(q, random_blocks(q, 96, 512, seed=q), 512) for q in FORMATS]
    kernel = BlockQuantKernel(parts) if exact else Q8Kernel(parts)
    x = torch.randn(7, 512)
    want = kernel(x)
    results, errors = [], []

    def compute():
        try:
            results.extend(kernel(x) for _ in range(30))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=compute) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors and len(results) == 60
    assert all(torch.equal(got, want) for got in results)
