"""The record of one speculation round: what every consumer of a round reads.

The γ controller learns from it, the round span and the metrics are written from it, and the
client's RoundStats is converted from it. Network time is derived here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass


def network_s(wall_s: float, compute_s: float) -> float:
    """A hop's network time: the wall time the caller saw minus the compute the service reported."""
    return max(wall_s - compute_s, 0.0)


def overhead_s(r) -> float:
    """A round's wall time outside the compute on its critical path: a prefetched proposal was drafted
    beside the last round's verify. `r`: a RoundRecord or a RoundStats message (same field names)."""
    return r.wall_s - r.target_compute_s - (0.0 if r.prefetched else r.draft_compute_s)


MAX_EXTRA_STEPS = 16  # target-only steps one verify call may add after its verdict (`specdec.engine.continuation`)


@dataclass(frozen=True)
class PassLoad:
    """The load one round met on a service: live sessions there, and the shared forward passes
    that served the round, averaged (sessions per pass and tokens per pass); and, summed over the
    round's steps, the seconds those passes ran and the seconds the steps waited for them to begin
    (the rest of the service's compute time is its own work: sampling, bookkeeping, handing over)."""

    sessions: int = 1
    rows: float = 1.0
    tokens: float = 0.0  # 0: unknown
    forward_s: float = 0.0
    wait_s: float = 0.0


@dataclass(frozen=True)
class RoundRecord:
    """What one round measured. Built once, by keyword, when the round is over."""

    gamma: int = 0  # draft tokens asked for (0 = target-only step)
    drafted: int = 0  # draft tokens the target verified
    accepted: int = 0
    emitted: int = 0  # tokens committed by this round (after any truncation at stop/length)
    wall_s: float = 0.0
    draft_wall_s: float = 0.0  # the draft hop as the orchestrator saw it …
    draft_compute_s: float = 0.0  # … and as the draft service reported it
    target_wall_s: float = 0.0
    target_compute_s: float = 0.0
    draft_steady: bool = True  # False when the draft also caught up on target-only tokens this round
    draft_load: PassLoad = PassLoad()
    target_load: PassLoad = PassLoad()
    proposer: str = ""  # who drafted: "model" or "ngram" ("" when nothing was proposed)
    overlapped: bool = False  # the draft drafted a branch while the target verified this one (or fed ahead: `Drafting`)
    prefetched: bool = False  # this round's proposal is the branch drafted during the last verify (a hit)
    target_passes: int = 1  # the verify and the target-only steps the target took after it in the same call
    predicted: bool = False  # the proposal came from the client's prediction of the output
    # The draft hop opened its session this round (its stream, grammar and caches): no sample of the network
    draft_opened: bool = False

    @property
    def rtt_draft_s(self) -> float:
        return network_s(self.draft_wall_s, self.draft_compute_s)

    @property
    def rtt_target_s(self) -> float:
        return network_s(self.target_wall_s, self.target_compute_s)


@dataclass(frozen=True)
class Estimates:
    """The γ controller's estimates after a round: α, and c = t_draft_step / t_target_step."""

    alpha: float = 0.0
    cost_ratio: float = 0.0


ALPHA_MAX = 0.999  # the largest α an estimate gives: below 1, so that E(α, γ) stays finite and γ bounded


@dataclass
class AcceptanceEstimate:
    """α as the MLE of a truncated geometric: accepted / (accepted + rounds that hit a rejection).

    A Beta-like prior of `prior_weight` pseudo-tokens at `prior_alpha` keeps early rounds sane.
    """

    prior_alpha: float = 0.7
    prior_weight: float = 4.0
    accepted: int = 0
    rejections: int = 0

    def observe(self, drafted: int, accepted: int) -> None:
        self.accepted += accepted
        self.rejections += int(accepted < drafted)

    @classmethod
    def from_rounds(cls, rounds) -> "AcceptanceEstimate | None":
        """The prior-free MLE over rounds with `drafted` and `accepted`; None if none drafted."""
        estimate = cls(prior_weight=0.0)
        for r in rounds:
            if r.drafted > 0:
                estimate.observe(r.drafted, r.accepted)
        return estimate if estimate.accepted + estimate.rejections else None

    @property
    def observed(self) -> int:
        return self.accepted + self.rejections

    @property
    def measured(self) -> float:
        """α from this estimate's own rounds alone (the prior-free MLE); 0 before any."""
        return min(self.accepted / self.observed, ALPHA_MAX) if self.observed else 0.0

    @property
    def alpha(self) -> float:
        successes = self.accepted + self.prior_alpha * self.prior_weight
        trials = self.accepted + self.rejections + self.prior_weight
        return min(successes / trials, ALPHA_MAX)
