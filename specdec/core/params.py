"""What a request asks of decoding, checked: its sampling parameters, penalties and bias, and log-probabilities.

No tensors here: the orchestrator and the HTTP API check requests with this module and import no torch (the
tensor work is `specdec.core.sampling`, `.processing` and `.logprobs`, in the services).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specdec.core.errors import InvalidArgument

MAX_PENALTY = 2.0  # OpenAI's range for presence and frequency penalties: [-2, 2]
MAX_BIAS = 100.0  # and for a logit bias: [-100, 100]


def check_processing(presence: float, frequency: float, repetition: float,
                     bias: tuple[tuple[int, float], ...]) -> None:
    for name, value in (("presence_penalty", presence), ("frequency_penalty", frequency)):
        if not -MAX_PENALTY <= value <= MAX_PENALTY:
            raise InvalidArgument(f"{name} must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {value}")
    if not 0.0 < repetition <= 10.0 or repetition != repetition:
        raise InvalidArgument(f"repetition_penalty must be in (0, 10] (1 = off), got {repetition}")
    for token, value in bias:
        if token < 0:
            raise InvalidArgument(f"logit_bias names token {token}, which is negative")
        if not -MAX_BIAS <= value <= MAX_BIAS:
            raise InvalidArgument(f"logit_bias for token {token} must be in [-{MAX_BIAS:g}, {MAX_BIAS:g}], got {value}")


MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log-probability, its rank (1 + how many tokens are likelier; vLLM's `rank`), and the
    `top` most likely alternatives, most likely first, as (token id, log-probability)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int = 1


def check_top_logprobs(top: int) -> int:
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise InvalidArgument(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top}")
    return top


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
