"""Per-round records and the summary statistics of one generation."""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.controller import AcceptanceEstimate


@dataclass(frozen=True)
class RoundRecord:
    gamma: int  # draft tokens asked for (0 = target-only step)
    drafted: int
    accepted: int
    emitted: int  # tokens committed by this round (after any truncation at stop/length)
    wall_s: float
    draft_wall_s: float
    draft_compute_s: float
    target_wall_s: float
    target_compute_s: float
    alpha_estimate: float = 0.0  # the controller's α after this round
    cost_ratio_estimate: float = 0.0  # the controller's c = t_draft_step / t_target_step after this round

    @property
    def rtt_draft_s(self) -> float:
        return max(self.draft_wall_s - self.draft_compute_s, 0.0)

    @property
    def rtt_target_s(self) -> float:
        return max(self.target_wall_s - self.target_compute_s, 0.0)


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    rounds: list[RoundRecord] = field(default_factory=list)
    finish_reason: str = ""
    total_s: float = 0.0

    def summary(self) -> dict:
        spec = [r for r in self.rounds if r.drafted > 0]
        drafted = sum(r.drafted for r in spec)
        accepted = sum(r.accepted for r in spec)
        emitted = sum(r.emitted for r in self.rounds)
        estimate = AcceptanceEstimate.from_rounds(spec)
        n = len(self.rounds)
        overhead = sum(r.wall_s - r.draft_compute_s - r.target_compute_s for r in self.rounds)
        return {
            "rounds": n,
            "draft_tokens": drafted,
            "accepted_tokens": accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "alpha": estimate.alpha if estimate else 0.0,
            "mean_accepted_length": sum(r.emitted for r in spec) / len(spec) if spec else 0.0,
            "generated_tokens": emitted,
            "tokens_per_second": emitted / self.total_s if self.total_s > 0 else 0.0,
            "gamma_per_round": [r.gamma for r in self.rounds],
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "total_s": self.total_s,
            "draft_compute_s": sum(r.draft_compute_s for r in self.rounds),
            "target_compute_s": sum(r.target_compute_s for r in self.rounds),
            "overhead_per_round_s": overhead / n if n else 0.0,
        }
