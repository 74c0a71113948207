"""Sampling parameters and the logits -> probabilities filters shared by draft and target.

p (target) and q (draft) must be produced by the *same* filter for the rejection
sampler to be lossless, so both services call `probs_from_logits` from here.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch

from specdec.core.errors import InvalidArgument
from specdec.core.processing import check_processing

MIN_TEMPERATURE = 1e-4
MAX_CACHE_SALT = 256
MAX_CHOICES = 8  # n per request: each choice holds a session on every service


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 means no top-k; top_p 1.0 means no top-p. The penalties, the bias
    and `min_tokens` are processed per position before them (`specdec.core.processing`); `prompt_tokens` says
    where the prompt ends in the committed tokens, for the processing that counts the output only.
    `min_tokens`: the output's first min_tokens tokens are none of `ending_ids` (the ids that would end it).
    `coupled`: a sampled token is a function of (seed, position, the target's distribution) alone, so that
    speculation (γ, proposer, batch) never changes the output; else the rejection sampler, whose acceptance
    is optimal but whose sample depends on the round boundaries."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias), by token
    prompt_tokens: int = 0
    grammar: str = ""  # an llguidance grammar the output follows (`specdec.engine.constraint`); "" = none
    cache_salt: str = ""  # sessions share cached prompt KV only with sessions of the same salt
    min_tokens: int = 0
    ending_ids: tuple[int, ...] = ()  # kept out of the output's first min_tokens positions
    coupled: bool = False  # sampled tokens by the coupled sampler (`specdec.core.coupling`): the same whatever γ

    def __post_init__(self):  # a record read back from JSON gives lists
        object.__setattr__(self, "logit_bias", tuple(sorted((int(t), float(v)) for t, v in self.logit_bias)))
        object.__setattr__(self, "ending_ids", tuple(sorted({int(t) for t in self.ending_ids})))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def processes(self) -> bool:
        """Whether any penalty or bias applies (else the logits go to the filters as they are)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias)

    def validate(self) -> "SamplingParams":
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidArgument(f"temperature must be a finite number >= 0, got {self.temperature}")
        if 0 < self.temperature < MIN_TEMPERATURE:  # logits / T would overflow float32
            raise InvalidArgument(f"temperature must be 0 (greedy) or >= {MIN_TEMPERATURE}, got {self.temperature}")
        if self.top_k < 0:
            raise InvalidArgument(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0) or math.isnan(self.top_p):
            raise InvalidArgument(f"top_p must be in (0, 1], got {self.top_p}")
        if not (0 <= self.seed < 2**64):
            raise InvalidArgument(f"seed must fit in 64 bits, got {self.seed}")
        check_processing(self.presence_penalty, self.frequency_penalty, self.repetition_penalty, self.logit_bias)
        if self.prompt_tokens < 0:
            raise InvalidArgument(f"prompt_tokens must be >= 0, got {self.prompt_tokens}")
        if self.min_tokens < 0 or any(t < 0 for t in self.ending_ids):
            raise InvalidArgument(f"min_tokens and the ids it keeps out must be >= 0, got {self.min_tokens}, "
                                  f"{self.ending_ids[:3]}")
        if len(self.cache_salt) > MAX_CACHE_SALT:
            raise InvalidArgument(f"cache_salt must be at most {MAX_CACHE_SALT} characters, got {len(self.cache_salt)}")
        return self


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
