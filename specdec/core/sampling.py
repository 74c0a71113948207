"""The logits -> probabilities filters shared by draft and target, and positions' random draws (a request's
parameters, checked, are `specdec.core.params`).

p (target) and q (draft) must be produced by the *same* filter for the rejection
sampler to be lossless, so both services call `probs_from_logits` from here.
"""

from __future__ import annotations

import hashlib

import torch

from specdec.core.params import SamplingParams


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits: [N, V] -> probs: [N, V] float32 after temperature, top-k and top-p.

    Not for greedy (temperature 0): callers take the argmax instead.
    """
    return filtered_logits(logits, params).softmax(dim=-1)


def filtered_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits: [N, V] -> float32 logits / temperature, with the tokens top-k and top-p drop at -inf:
    the distribution a sampled token is drawn from, before its softmax. Not for greedy."""
    assert not params.greedy, "greedy decoding uses argmax, not probabilities"
    logits = logits.float() / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # [N, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [N, V]
        sorted_probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p; keeps the top-1 always.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def position_key(seed: int, position: int, stream: str) -> int:
    """The 64-bit key of (seed, position, stream): what every random draw of ours is keyed by."""
    return int.from_bytes(hashlib.blake2b(f"{seed}:{position}:{stream}".encode(), digest_size=8).digest(), "little")


def position_generator(seed: int, position: int, stream: str, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator keyed by (seed, position, stream).

    Keying randomness by position, not by call order, makes a retried round draw the
    same numbers and makes seeded runs reproducible whatever the round boundaries.
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(position_key(seed, position, stream) & ((1 << 63) - 1))
    return gen


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """probs: [V] (any non-negative weights) -> one token id drawn with `generator`: one float64 uniform, by inverse
    CDF (`torch.multinomial` took 2.4 ms a draw over a 151,936-token vocabulary, this 0.13)."""
    return inverse_cdf(probs, float(torch.rand((), dtype=torch.float64, generator=generator, device=probs.device)))


def inverse_cdf(weights: torch.Tensor, u: float) -> int:
    """weights: [V] non-negative -> the token whose interval of the cumulative weights holds u · their total (u in
    [0, 1)): an exact categorical draw for a uniform u; a zero weight is never chosen."""
    cdf = weights.double().cumsum(0)  # [V]
    point = torch.tensor([u * float(cdf[-1])], dtype=torch.float64, device=cdf.device)
    token = int(torch.searchsorted(cdf, point, right=True)[0])
    return token if token < cdf.shape[0] else int(weights.nonzero().max())  # u · total rounded up to the total
