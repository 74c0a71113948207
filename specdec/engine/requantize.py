"""A draft model's weights in a smaller block format (`--draft-weights`).

A draft's proposals may follow any law: the rejection sampler makes the output the target's whatever q is,
and greedy verification keeps the target's argmax. So a draft may read fewer bytes a step than its file
ships, and on a CPU, where a draft step is bound by the bytes it reads, that is what it costs.

What is requantized: the linears in GGML's 32-weight formats wider than Q4_0 (Q5_0, Q8_0, Q5_1, Q4_1). A
Q4_K_M file puts Q5_0 and Q8_0 where its 4-bit k-quant cannot go (rows of 896 weights are not whole 256-weight
super-blocks) and in its output layer, a Q5_K_M file Q5_1; the k-quants, Q6_K included, which the recipe gives
the tensors that matter most (half the down projections), stay as shipped. The packaged 0.5B draft then reads
0.80x the bytes a step (344 -> 274 MB), and its teacher-forced greedy agreement with the target is the same within
a token (0.852 against 0.848 on the benchmark prompts; requantizing its Q6_K too cost 0.02-0.03;
docs/PERFORMANCE.md, "A draft in 4 bits").
The embedding is looked up, not read whole, and stays. The target is never requantized.
"""

from __future__ import annotations

import logging

import numpy as np
from torch import nn

from specdec.engine.cpu import blockquant
from specdec.engine.cpu.blockquant import BLOCK, NAMES, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BlockTensor
from specdec.engine.cpu.hugepages import empty_on_huge_pages
from specdec.engine.defaults import DRAFT_WEIGHTS

log = logging.getLogger(__name__)

FORMAT = {"q4_0": Q4_0}
REQUANTIZED = (Q5_0, Q8_0, Q5_1, Q4_1)  # the formats a draft's linears leave (see above)


def draft_format(setting: str, path: str) -> int | None:
    """The GGML type a draft's linears are requantized to on `path` for `--draft-weights setting`, or None
    (as shipped). Raises ValueError for an unknown setting."""
    if setting not in DRAFT_WEIGHTS:
        raise ValueError(f"--draft-weights must be one of {', '.join(DRAFT_WEIGHTS)}, got {setting!r}")
    if setting == "auto":
        setting = "q4_0" if path == "gguf-q8" else "as-shipped"
    return FORMAT.get(setting)


def quantize_q4_0(weight: np.ndarray) -> np.ndarray:
    """Float32 [N, K] (K a multiple of 32) -> Q4_0 bytes [N, K/32 · 18], GGML's rounding (gguf-py's)."""
    import gguf

    return gguf.quants.quantize(weight.astype(np.float32), gguf.GGMLQuantizationType.Q4_0)


def requantize(block: BlockTensor, qtype: int) -> BlockTensor:
    """`block`'s weights in `qtype`, from their dequantized values, if its format is one of REQUANTIZED and its
    rows are whole blocks of the new one; else `block` itself. The C kernel does it block by block, the same
    bytes as gguf-py's quantizer gives the dequantized rows (which runs where the kernel cannot): 0.2 s against
    4.4 s for the packaged draft's linears on a 2-core Zen 4 (0.9 s one value at a time), with no float32 copy."""
    if qtype != Q4_0:
        raise ValueError(f"requantizing to {NAMES.get(qtype, qtype)} is not supported")
    if block.qtype not in REQUANTIZED or block.cols % BLOCK[qtype][0]:
        return block
    if not blockquant.available():
        return BlockTensor.from_numpy(qtype, quantize_q4_0(block.dequantize().numpy()), block.cols)
    data = empty_on_huge_pages(block.rows, block.cols // BLOCK[qtype][0] * BLOCK[qtype][1])
    status = blockquant.library().bq_requantize_q4_0(block.qtype, block.data.data_ptr(), block.rows, block.cols,
                                                     data.data_ptr())
    assert status == 0, f"bq_requantize_q4_0 refused {NAMES[block.qtype]} [{block.rows}, {block.cols}]"
    return BlockTensor(qtype, data, block.cols)


def requantize_linears(model: nn.Module, qtype: int) -> tuple[int, int]:
    """Requantize every linear layer's block weights (`block_weight`, a packed GGUF model's) of `model` in
    place; the embedding stays. Returns the linears' weight bytes before and after."""
    before = after = 0
    for module in model.modules():
        block = getattr(module, "block_weight", None)
        if block is None or not isinstance(module, nn.Linear):
            continue
        new = requantize(block, qtype)
        before, after = before + block.data.numel(), after + new.data.numel()
        module.block_weight = new
    log.info("draft weights requantized to %s: the linears' %d MB are now %d MB", NAMES[qtype], before >> 20,
             after >> 20)
    return before, after
