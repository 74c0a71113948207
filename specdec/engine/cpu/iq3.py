"""IQ3_XXS and IQ3_S tensors (IQ3_XXS, IQ3_XS and IQ3_M files, and an IQ2_M file's IQ3_S ones) rewritten once at load
as Q6_K blocks of the same values, bit for bit, so that both GGUF kernels read them.

Both formats give each weight d·s·(±g): a float16 d per 256 weights, an integer factor s per 32 and a grid value g
(four at a time from a table of 256 or 512 rows), its sign from a bit mask. GGML and gguf-py dequantize
- IQ3_XXS as ((d·(0.5 + ls))·0.5)·g·sign, g in {4, 12, ..., 52, 62}: d·(2·ls + 1)/4 · g,
- IQ3_S as (d·(1 + 2·sc))·g·sign, g in {1, 3, ..., 15},
and Q6_K as (d'·sc')·(q − 32) with a float16 d' per 256, int8 sc' per 16 and q in 0..63. So IQ3_S is Q6_K with
d' = d, sc' = 1 + 2·sc and q − 32 = ±g, and IQ3_XXS with d' = d/2, sc' = 2·ls + 1 and q − 32 = ±g/2 (every g is
even). Each product has at most 21 significant bits (float16's 11, a factor of 5, g's 5), so every order of the
steps gives the same float32 value. The one condition: d/2 must be a float16, which it is unless d is among the
smallest float16 numbers with its last bit set; a tensor with such a block is left to float32 (`as_q6_k` → None).

The Q6_K blocks take 210 bytes a super-block where IQ3_XXS takes 98 and IQ3_S 110 (float32: 1,024).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from specdec.engine.cpu.blockquant import pack_q6_k

IQ3_XXS, IQ3_S = 18, 21  # GGML's types
NAMES = {IQ3_XXS: "IQ3_XXS", IQ3_S: "IQ3_S"}
BYTES = {IQ3_XXS: 98, IQ3_S: 110}  # a super-block of 256 weights
ROWS_AT_ONCE = 8192  # super-blocks a numpy step (bounds the load's scratch memory to tens of MiB)


@lru_cache(maxsize=None)
def _codes(qtype: int) -> np.ndarray:
    """Q6_K's codes of every grid row under every 4 sign bits, 4 bytes in a uint32: at 16·row + signs, row's values
    (halved for IQ3_XXS), negated where their sign bit is set, plus 32."""
    import gguf

    cls = gguf.quants.IQ3_XXS if qtype == IQ3_XXS else gguf.quants.IQ3_S
    cls.init_grid()
    grid = cls.grid.reshape(-1, 1, 4).astype(np.int16) // (2 if qtype == IQ3_XXS else 1)  # [rows, 1, 4]
    signs = 1 - 2 * ((np.arange(16)[:, None] >> np.arange(4)) & 1)  # [16, 4]: bit j, value j
    return (grid * signs + 32).astype(np.uint8).reshape(-1, 4).view("<u4")[:, 0]


def _nibbles(sign_bytes: np.ndarray) -> np.ndarray:
    """Sign bytes [n, k] (bit j: value j of 8 negative) as [n, 2k] nibbles, one a grid row of 4."""
    return np.stack([sign_bytes & 15, sign_bytes >> 4], axis=-1).reshape(sign_bytes.shape[0], -1)


def _iq3_xxs(blocks: np.ndarray):
    """d' (float16 [n, 1]), sc' (int8 [n, 8], one per 32 weights) and the codes (uint8 [n, 256]) of IQ3_XXS blocks
    [n, 98]; d' None where some d/2 is no float16."""
    import gguf

    d = blocks[:, :2].copy().view(np.float16)
    half = (d.astype(np.float32) * np.float32(0.5)).astype(np.float16)
    exact = bool((half.astype(np.float32) * np.float32(2) == d.astype(np.float32)).all())
    aux = blocks[:, 66:98].copy().view("<u4")  # [n, 8]: 4 seven-bit sign indices, then ls in the top 4 bits
    ksigns = np.frombuffer(gguf.quants.IQ2_XXS.ksigns, dtype=np.uint8)
    signs = ksigns[(aux[..., None] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & 0x7F].reshape(-1, 32)
    rows = blocks[:, 2:66].astype(np.int32)  # [n, 64]: 2 grid rows a sign byte
    codes = _codes(IQ3_XXS)[rows * 16 + _nibbles(signs)]
    return (half if exact else None), (2 * (aux >> 28) + 1).astype(np.int8), codes.view(np.uint8)


def _iq3_s(blocks: np.ndarray):
    """d (float16 [n, 1]), sc' (int8 [n, 8]) and the codes (uint8 [n, 256]) of IQ3_S blocks [n, 110]."""
    d = blocks[:, :2].copy().view(np.float16)
    low, high_bits, sign_bits, scales = blocks[:, 2:66], blocks[:, 66:74], blocks[:, 74:106], blocks[:, 106:110]
    high = ((high_bits[..., None] >> np.arange(8, dtype=np.uint8)) & 1).reshape(-1, 64)  # index 8b + i: byte b, bit i
    rows = low.astype(np.int32) | (high.astype(np.int32) << 8)  # [n, 64]
    codes = _codes(IQ3_S)[rows * 16 + _nibbles(sign_bits)]
    sc = _nibbles(scales)  # per 32: a byte's low nibble, then its high
    return d, (1 + 2 * sc).astype(np.int8), codes.view(np.uint8)


def as_q6_k(qtype: int, raw: np.ndarray) -> np.ndarray | None:
    """An IQ3_XXS or IQ3_S tensor's rows [rows, row bytes] as Q6_K rows of the same values (None: an IQ3_XXS block's
    d/2 is no float16, see above)."""
    rows = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(-1, BYTES[qtype])
    out = np.empty((blocks.shape[0], 210), dtype=np.uint8)
    decode = _iq3_xxs if qtype == IQ3_XXS else _iq3_s
    for start in range(0, blocks.shape[0], ROWS_AT_ONCE):
        d, sc, codes = decode(blocks[start:start + ROWS_AT_ONCE])
        if d is None:
            return None
        out[start:start + ROWS_AT_ONCE] = pack_q6_k(codes, np.repeat(sc, 2, axis=1), d)
    return out.reshape(rows, -1)
