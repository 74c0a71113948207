"""A draft's linears requantized to Q4_0 at load (`--draft-weights`): the rule, the weights it gives, and
losslessness through the services with a draft whose every linear was Q5_0 or Q8_0 (as the packaged 0.5B
draft's 896-wide ones are)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from conftest import tiny_options
from test_draft_vocab import assert_greedy_speculation_is_target_only
from specdec.core.params import SamplingParams
from test_gguf_path import random_blocks
from test_lossless_e2e import SAMPLES, assert_follows, first_tokens

from orchestrator.clients import draft_client, target_client
from specdec.core.sampling import probs_from_logits
from specdec.engine.cpu import blockquant
from specdec.engine.cpu.blockquant import BLOCK, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q6_K, Q8_0, BlockTensor
from specdec.engine.models import load_model
from specdec.engine.requantize import draft_format, requantize
from specdec.engine.runner import Step
from specdec.launch.stack import EmbeddedStack

# 224-wide rows: every linear in Q5_0 or Q8_0; the draft is the target perturbed
WIDE_TARGET, WIDE_DRAFT = "tiny:seed=0,hidden=224,gguf=1", "tiny:seed=0,hidden=224,gguf=1,perturb=0.05"


def test_the_rule_requantizes_on_the_integer_path_unless_told():
    assert draft_format("auto", "gguf-q8") == Q4_0 and draft_format("q4_0", "gguf") == Q4_0
    assert draft_format("auto", "gguf") is None and draft_format("auto", "fp32") is None
    assert draft_format("as-shipped", "gguf-q8") is None
    with pytest.raises(ValueError, match="--draft-weights"):
        draft_format("q2_k", "gguf-q8")


def edge_blocks(qtype: int, raw: np.ndarray) -> np.ndarray:
    """`raw` with its first blocks made the quantizer's edge cases: all ±0 under a negative scale and under a
    positive one (whose Q4_0 scale is then −0 or +0 by the first value), every code the same, every code the
    format's largest, and two largest magnitudes of opposite signs (the first decides the sign of d)."""
    size = BLOCK[qtype][1]
    blocks = raw.reshape(raw.shape[0], -1, size)
    negative = np.array([-0.01], dtype=np.float16).view(np.uint8)
    middle, largest = (16, 31) if qtype == Q5_0 else (0, 127)  # the codes of 0 and of the largest value
    tie = [1, middle, 31] if qtype == Q5_0 else [-100, 5, 100]  # Q5_0: −15 and +15
    cases = [[middle] * 32, [middle] * 32, [3] * 32, [largest] * 32, tie + [middle + 1] * 29]
    for index, codes in enumerate(cases):
        block = blocks[0, index]
        block[:2] = negative if index != 1 else np.array([0.02], dtype=np.float16).view(np.uint8)
        if qtype == Q8_0:
            block[2:] = np.array(codes, dtype=np.int8).view(np.uint8)
        else:  # Q5_0: 4 bytes of fifth bits, then 16 of nibbles
            high = sum(((c >> 4) & 1) << v for v, c in enumerate(codes))  # value v's fifth bit: bit v
            block[2:6] = np.array([high], dtype=np.uint32).view(np.uint8)
            block[6:] = [(codes[l] & 15) | ((codes[l + 16] & 15) << 4) for l in range(16)]
    return blocks.reshape(raw.shape)


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "gguf-py"])
@pytest.mark.parametrize("qtype", [Q5_0, Q8_0, Q5_1, Q4_1])
def test_the_wide_32_weight_formats_become_ggmls_q4_0_of_their_values(qtype, kernel, monkeypatch):
    """Q5_0, Q8_0, Q5_1 and Q4_1 blocks become the Q4_0 blocks gguf-py's quantizer gives their exact values, by the
    C kernel and by gguf-py where there is none, edge cases included (Q5_0's and Q8_0's); the kernel then computes
    with those blocks' values."""
    if not kernel:
        monkeypatch.setattr(blockquant, "available", lambda: False)
    raw = random_blocks(qtype, 12, 896, seed=qtype)
    block = BlockTensor.from_numpy(qtype, edge_blocks(qtype, raw) if qtype in (Q5_0, Q8_0) else raw, 896)
    new = requantize(block, Q4_0)
    want = gguf.quants.quantize(block.dequantize().numpy(), gguf.GGMLQuantizationType.Q4_0)
    assert new.qtype == Q4_0 and new.cols == 896 and np.array_equal(new.data.numpy(), want)
    values = gguf.quants.dequantize(want, gguf.GGMLQuantizationType.Q4_0).reshape(12, 896)
    assert torch.equal(new.dequantize(), torch.from_numpy(np.asarray(values, dtype=np.float32)))
    assert new.data.numel() == block.data.numel() * 18 // BLOCK[qtype][1]


@pytest.mark.parametrize("qtype", [Q4_K, Q6_K, Q4_0])
def test_the_k_quants_and_q4_0_stay_as_shipped(qtype):
    block = BlockTensor.from_numpy(qtype, random_blocks(qtype, 4, 512, seed=qtype), 512)
    assert requantize(block, Q4_0) is block


def test_a_requantized_draft_reads_q4_0():
    """Every linear of the wide draft (its output layer included) is Q4_0 by default on gguf-q8, its kernel
    says so, and it reads 18/22 to 18/34 of the bytes. (How close it stays to its file on real weights is
    measured, not tested here: random tiny models amplify any rounding.)"""
    shipped, requantized = (load_model(WIDE_DRAFT, "cpu", draft_weights=w) for w in ("as-shipped", "auto"))
    assert shipped.choice.kernel.endswith("Q5_0+Q8_0") and requantized.choice.kernel.endswith("-Q4_0")
    read = [sum(k.weight_bytes() for k in m.runner.linear_kernels()) for m in (shipped, requantized)]
    assert 18 / 34 * read[0] <= read[1] <= 18 / 22 * read[0]


def test_lossless_with_a_requantized_draft():
    """Through the services with the Q4_0 draft (of a target in Q5_0 and Q8_0, which stays so): the first
    tokens follow the target's law, and greedy speculative output equals target-only."""
    prompt = [40, 41, 42, 43]
    params = SamplingParams(temperature=1.0, top_k=8)
    target = load_model(WIDE_TARGET, "cpu").runner
    p = probs_from_logits(target.forward([Step(target.new_cache(), prompt)])[0], params)[0]  # [V]
    with EmbeddedStack(tiny_options(WIDE_DRAFT, WIDE_TARGET)) as stack:
        kernels = [client.info().kernel for client in (draft_client(stack.draft_address),
                                                       target_client(stack.target_address))]
        assert kernels[0].endswith("-Q4_0") and kernels[1].endswith("Q5_0+Q8_0"), "the target stays as shipped"
        drawn = first_tokens(stack.endpoint, prompt, range(SAMPLES), 8, temperature=1.0, top_k=8)
        assert_follows(drawn, p)
        assert 0 < sum(r.accepted for _, r in drawn) < SAMPLES
        assert_greedy_speculation_is_target_only(stack.endpoint)
