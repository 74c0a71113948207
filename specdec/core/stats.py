"""The summary statistics of one generation, from its round records (`specdec.core.rounds`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from specdec.core.rounds import AcceptanceEstimate, RoundRecord, overhead_s


class FinishReason(str, Enum):
    NONE = ""  # still going (falsy)
    STOP = "stop"  # EOS or a stop string
    LENGTH = "length"  # max_new_tokens reached
    CONTEXT = "context"  # the model's context is full
    CANCELLED = "cancelled"

    def __bool__(self) -> bool:
        return self is not FinishReason.NONE


@dataclass(frozen=True)
class GenerationSummary:
    rounds: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float
    alpha: float
    mean_accepted_length: float
    generated_tokens: int
    tokens_per_second: float
    gamma_per_round: list[int]
    finish_reason: FinishReason
    prompt_tokens: int
    total_s: float
    draft_compute_s: float
    target_compute_s: float
    overhead_per_round_s: float  # wall time of a round outside both services' compute
    draft_replica: str
    session_id: str
    overlap_branches: int = 0  # rounds verified beside a branch of the draft's (or its feed ahead), but the last …
    overlap_hits: int = 0  # … of which the verdict matched: their round paid no draft time
    cached_prompt_tokens: int = 0  # prompt tokens the target took from a cache instead of computing them
    draft_cached_tokens: int = 0  # committed tokens the draft replica took from a cache instead of computing them
    prediction_accepted: int = 0  # tokens proposed from the client's prediction that the target accepted …
    prediction_rejected: int = 0  # … and that it did not


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    session_id: str = ""
    rounds: list[RoundRecord] = field(default_factory=list)
    finish_reason: FinishReason = FinishReason.NONE
    total_s: float = 0.0
    draft_replica: str = ""  # the replica that served the last speculative round
    cached_prompt_tokens: int = 0
    draft_cached_tokens: int = 0

    def summary(self) -> GenerationSummary:
        spec = [r for r in self.rounds if r.drafted > 0]
        drafted = sum(r.drafted for r in spec)
        accepted = sum(r.accepted for r in spec)
        emitted = sum(r.emitted for r in self.rounds)
        estimate = AcceptanceEstimate.from_rounds(spec)
        n = len(self.rounds)
        overhead = sum(overhead_s(r) for r in self.rounds)
        return GenerationSummary(
            rounds=n, draft_tokens=drafted, accepted_tokens=accepted,
            acceptance_rate=accepted / drafted if drafted else 0.0,
            alpha=estimate.alpha if estimate else 0.0,
            mean_accepted_length=sum(r.emitted for r in spec) / len(spec) if spec else 0.0,
            generated_tokens=emitted, tokens_per_second=emitted / self.total_s if self.total_s > 0 else 0.0,
            gamma_per_round=[r.gamma for r in self.rounds], finish_reason=self.finish_reason,
            prompt_tokens=self.prompt_tokens, total_s=self.total_s,
            draft_compute_s=sum(r.draft_compute_s for r in self.rounds),
            target_compute_s=sum(r.target_compute_s for r in self.rounds),
            overhead_per_round_s=overhead / n if n else 0.0, draft_replica=self.draft_replica,
            session_id=self.session_id, overlap_branches=sum(r.overlapped for r in self.rounds[:-1]),
            overlap_hits=sum(r.prefetched for r in self.rounds), cached_prompt_tokens=self.cached_prompt_tokens,
            draft_cached_tokens=self.draft_cached_tokens,
            prediction_accepted=sum(r.accepted for r in spec if r.predicted),
            prediction_rejected=sum(r.drafted - r.accepted for r in spec if r.predicted))
