"""IQ3_S tensors (IQ3_M and IQ3_S files', and an IQ2_M file's bigger ones) rewritten once at load as Q6_K blocks of
the same values, bit for bit, so that both GGUF kernels read them.

IQ3_S gives each weight d·(1 + 2·sc)·(±g): a float16 d per 256 weights, a 4-bit sc per 32 and a grid value g in
{1, 3, ..., 15} (four at a time from a table of 512 rows), its sign from a bit mask; GGML and gguf-py dequantize it as
(d·(1 + 2·sc))·g·sign. Q6_K gives (d'·sc')·(q − 32), a float16 d' per 256, an int8 sc' per 16 and q in 0..63: so
d' = d, sc' = 1 + 2·sc and q − 32 = ±g. Each product has at most 20 significant bits (float16's 11, 5 and 4), so both
give the same float32 value. The Q6_K blocks take 210 bytes a super-block where IQ3_S takes 110 (float32: 1,024).

IQ3_XXS (d·(2·ls + 1)/4·(±g), g in {4, 12, ..., 52, 62}) would need d' = d/2, which is no float16 for half of the
scales below 2⁻¹³, and those are nearly all of them: 99.7% of the IQ3_S scales of the packaged target's IQ3_M copy
are below 2⁻¹¹, and IQ3_XXS's, multiplying grid values up to 62 where IQ3_S's reach 15, come out about a quarter as
large. It stays float32.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from specdec.engine.cpu import blockquant
from specdec.engine.cpu.blockquant import pack_q6_k

IQ3_S = 21  # GGML's type
BYTES = 110  # a super-block of 256 weights: d, 64 low index bytes, 8 of high bits, 32 of signs, 4 of scales
SUPERBLOCKS_AT_ONCE = 8192  # a numpy step's (bounds the load's scratch memory to tens of MiB)


@lru_cache(maxsize=None)
def _codes() -> np.ndarray:
    """Q6_K's codes of every grid row under every 4 sign bits, 4 bytes in a uint32: at 16·row + signs, the row's
    values, negated where their sign bit is set (bit j, value j), plus 32."""
    import gguf

    gguf.quants.IQ3_S.init_grid()
    grid = gguf.quants.IQ3_S.grid.reshape(-1, 1, 4).astype(np.int16)  # [512, 1, 4]
    signs = 1 - 2 * ((np.arange(16)[:, None] >> np.arange(4)) & 1)  # [16, 4]
    return np.ascontiguousarray((grid * signs + 32).astype(np.uint8).reshape(-1, 4).view("<u4")[:, 0])


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """Bytes [n, k] as their [n, 2k] nibbles, low first."""
    return np.stack([packed & 15, packed >> 4], axis=-1).reshape(packed.shape[0], -1)


def _q6_k_blocks(blocks: np.ndarray) -> np.ndarray:
    """IQ3_S blocks [n, 110] as Q6_K blocks [n, 210]."""
    low, high_bits, sign_bits, scales = blocks[:, 2:66], blocks[:, 66:74], blocks[:, 74:106], blocks[:, 106:110]
    high = ((high_bits[..., None] >> np.arange(8, dtype=np.uint8)) & 1).reshape(-1, 64)  # index 8b + i: byte b, bit i
    rows = low.astype(np.int32) | (high.astype(np.int32) << 8)  # [n, 64]: a grid row each 4 weights
    codes = _codes()[rows * 16 + _nibbles(sign_bits)].view(np.uint8)  # sign byte k: weights 8k..8k+7
    sc = (1 + 2 * _nibbles(scales)).astype(np.int8)  # [n, 8]: per 32 weights, a byte's low nibble, then its high
    return pack_q6_k(codes, np.repeat(sc, 2, axis=1), blocks[:, :2].copy().view(np.float16))


def as_q6_k(raw: np.ndarray, in_c: bool = True) -> np.ndarray:
    """An IQ3_S tensor's rows [rows, row bytes] as Q6_K rows of the same values: by the C kernel (`csrc/iq3_s.h`;
    the packaged target's IQ3_M copy's 138 IQ3_S tensors in 0.49 s against 3.3 s in numpy, the file in the page
    cache), or in numpy where it cannot run (or with `in_c` False)."""
    blocks = np.ascontiguousarray(raw).reshape(-1, BYTES)
    out = np.empty((blocks.shape[0], 210), dtype=np.uint8)
    if in_c and blockquant.available():
        blockquant.library().bq_iq3_s_as_q6_k(blocks.ctypes.data, blocks.shape[0], _codes().ctypes.data,
                                              out.ctypes.data)
    else:
        for start in range(0, blocks.shape[0], SUPERBLOCKS_AT_ONCE):
            out[start:start + SUPERBLOCKS_AT_ONCE] = _q6_k_blocks(blocks[start:start + SUPERBLOCKS_AT_ONCE])
    return out.reshape(raw.shape[0], -1)
