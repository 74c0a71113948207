"""Cost model and γ controller (DESIGN.md, "Cost model with the network").

Round time  T(γ) = rtt_draft + γ·t_d + rtt_target + t_v(γ),   t_v(γ) = a + b·(γ+1)
            T(0) = rtt_target + t_v(0)                        (no draft round trip)
Tokens per round E(γ) = (1 - α^(γ+1)) / (1 - α).
The controller picks γ* = argmax_γ E(γ)/T(γ) over {0..γ_max}, re-deciding every round.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


def expected_tokens(alpha: float, gamma: int) -> float:
    """E(γ): expected tokens emitted by one round with acceptance rate α."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def theorem_speedup(alpha: float, gamma: int, c: float) -> float:
    """Leviathan et al. Theorem 3.8: E(γ) / (γ·c + 1), network ignored."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


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
    def alpha(self) -> float:
        successes = self.accepted + self.prior_alpha * self.prior_weight
        trials = self.accepted + self.rejections + self.prior_weight
        return min(successes / trials, 0.999)


class Ewma:
    """Exponentially weighted mean. A `provisional` initial value (a prior) gives way to the first sample."""

    def __init__(self, weight: float = 0.2, initial: float | None = None, provisional: bool = False):
        self.weight = weight
        self.value = initial
        self.provisional = provisional

    def update(self, sample: float) -> float:
        if self.value is None or self.provisional:
            self.value, self.provisional = sample, False
        else:
            self.value = (1 - self.weight) * self.value + self.weight * sample
        return self.value


@dataclass(frozen=True)
class RoundTiming:
    """What one round measured. Wall times are seen by the orchestrator; compute by the services."""

    gamma: int
    accepted: int
    draft_wall_s: float
    draft_compute_s: float
    target_wall_s: float
    target_compute_s: float
    draft_steady: bool = True  # False when the draft also caught up on target-only tokens this round


class GammaController:
    """Chooses γ each round from the online α estimate and the measured costs."""

    def __init__(self, gamma_max: int, initial_gamma: int = 3, prior_alpha: float = 0.7,
                 probe_every: int = 16, verify_slope_prior: float = 0.25, explore_every: int = 8,
                 explore_margin: float = 0.5):
        self.gamma_max = gamma_max
        self.initial_gamma = min(initial_gamma, gamma_max)
        self.acceptance = AcceptanceEstimate(prior_alpha=prior_alpha)
        self.probe_every = probe_every
        self.verify_slope_prior = verify_slope_prior
        self.explore_every, self.explore_margin = explore_every, explore_margin
        self.draft_step = Ewma()  # t_d, seconds per draft token
        # Network time is measured every round with little noise: follow it quickly.
        self.rtt_draft = Ewma(0.5)
        self.rtt_target = Ewma(0.5)
        self._verify_by_tokens: dict[int, Ewma] = {}  # γ+1 -> t_v
        self._rounds_without_draft = 0
        self._best, self._best_streak = -1, 0

    def observe(self, timing: RoundTiming) -> None:
        self.rtt_target.update(max(timing.target_wall_s - timing.target_compute_s, 0.0))
        self._verify_by_tokens.setdefault(timing.gamma + 1, Ewma()).update(timing.target_compute_s)
        if timing.gamma > 0:
            self.acceptance.observe(timing.gamma, timing.accepted)
            if timing.draft_steady or self.draft_step.value is None:
                self.draft_step.update(timing.draft_compute_s / timing.gamma)
            self.rtt_draft.update(max(timing.draft_wall_s - timing.draft_compute_s, 0.0))
            self._rounds_without_draft = 0
        else:
            self._rounds_without_draft += 1

    def verify_time(self, gamma: int) -> float:
        """t_v(γ): the measured time for γ+1 tokens where there is one, else an estimate.

        Measured values win because verify cost is not linear on every device (on 2 CPU cores
        the 1.5B target took 380 ms for 1 token, 386 ms for 2, 720 ms for 4). Below the measured
        sizes the estimate scales the smallest one by the prior slope; above, a least-squares line
        a + b·(γ+1), never below a smaller measured size. Always positive.
        """
        n = gamma + 1
        measured = self._verify_by_tokens.get(n)
        if measured is not None and measured.value is not None:
            return measured.value
        points = sorted((m, e.value) for m, e in self._verify_by_tokens.items() if e.value is not None)
        n0, t0 = points[0]
        if len(points) == 1 or n < n0:
            s = self.verify_slope_prior  # t = a + b·n with b = s·a
            return t0 * (1 + s * n) / (1 + s * n0)
        mean_n = sum(m for m, _ in points) / len(points)
        mean_t = sum(t for _, t in points) / len(points)
        var = sum((m - mean_n) ** 2 for m, _ in points)
        b = max(sum((m - mean_n) * (t - mean_t) for m, t in points) / var, 0.0)
        floor = max(t for m, t in points if m < n)
        return max(mean_t + b * (n - mean_n), floor)

    def round_time(self, gamma: int) -> float:
        time = (self.rtt_target.value or 0.0) + self.verify_time(gamma)
        if gamma > 0:
            time += (self.rtt_draft.value or 0.0) + gamma * (self.draft_step.value or 0.0)
        return time

    def _costs_measured(self) -> bool:
        return self.draft_step.value is not None and bool(self._verify_by_tokens)

    def cost_ratio(self) -> float:
        """c = t_draft_step / t_target_step (0 until both are measured)."""
        if not self._costs_measured():
            return 0.0
        return self.draft_step.value / self.verify_time(0)

    def confidence_threshold(self) -> float:
        """The draft's early-stop threshold.

        One more draft token costs a draft step plus the marginal verify time. It pays back one
        target-only round only if every token before it is accepted too, which the draft's
        running confidence estimates. So stop once that confidence is below cost / T(0).
        """
        if not self._costs_measured():
            return 0.0
        marginal_verify = max(self.verify_time(self.gamma_max) - self.verify_time(0), 0.0) / self.gamma_max
        cost = self.draft_step.value + marginal_verify
        return min(max(cost / self.round_time(0), 0.0), 0.9)

    def choose(self, max_useful: int | None = None) -> int:
        """γ for the next round; `max_useful` caps it (e.g. tokens left to generate minus one)."""
        cap = self.gamma_max if max_useful is None else max(0, min(self.gamma_max, max_useful))
        if not self._costs_measured():
            return min(self.initial_gamma, cap)
        if self._rounds_without_draft >= self.probe_every:
            return min(1, cap)  # probe: refresh α and draft cost now and then
        alpha = self.acceptance.alpha
        rate = {g: expected_tokens(alpha, g) / self.round_time(g) for g in range(cap + 1)}
        best = max(rate, key=rate.get)
        self._best_streak = self._best_streak + 1 if best == self._best else 0
        self._best = best
        if best > 0 and self._best_streak >= self.explore_every:
            # A verify time measured once (say in a slow minute) and never again can pin γ below its
            # optimum. Now and then, try the next larger γ if its estimate is close, to re-measure it.
            self._best_streak = 0
            if best < cap and rate[best + 1] >= (1 - self.explore_margin) * rate[best]:
                return best + 1
        return best


class SharedPrior:
    """What sessions of one model pair learn, handed on to the next session.

    A new session starts from the measured costs and α of earlier ones instead of exploring from
    scratch; a finished session folds its estimates back in. The prior keeps its own averages, so
    a session's controller keeps its own smoothing. Thread-safe.
    """

    COSTS = ("draft_step", "rtt_draft", "rtt_target")

    def __init__(self, gamma_max: int, prior_weight: float = 8.0, weight: float = 0.3):
        self.gamma_max = gamma_max
        self._costs = {name: Ewma(weight) for name in self.COSTS}
        self._verify_by_tokens: dict[int, Ewma] = {}
        self._alpha = Ewma(weight)
        self._weight = weight
        self._prior_weight = prior_weight
        self._lock = threading.Lock()

    def new_controller(self) -> GammaController:
        controller = GammaController(self.gamma_max)
        with self._lock:
            # Seeds are provisional: this session's first measurement of each cost replaces its seed,
            # so that a value measured once in a slow minute cannot pin later sessions.
            for name, shared in self._costs.items():
                seeded = getattr(controller, name)
                seeded.value, seeded.provisional = shared.value, shared.value is not None
            for n, shared in self._verify_by_tokens.items():
                controller._verify_by_tokens[n] = Ewma(initial=shared.value, provisional=True)
            alpha = self._alpha.value
        if alpha is not None:
            controller.acceptance = AcceptanceEstimate(alpha, self._prior_weight)
        return controller

    def absorb(self, session: GammaController) -> None:
        with self._lock:
            for name, shared in self._costs.items():
                value = getattr(session, name).value
                if value is not None:
                    shared.update(value)
            for n, ewma in session._verify_by_tokens.items():
                if ewma.value is not None:
                    self._verify_by_tokens.setdefault(n, Ewma(self._weight)).update(ewma.value)
            observed = session.acceptance.accepted + session.acceptance.rejections
            if observed >= 4:
                self._alpha.update(session.acceptance.alpha)

    def snapshot(self) -> dict:
        """The prior as plain data (JSON-ready), to share between orchestrators."""
        with self._lock:
            return {"costs": {name: e.value for name, e in self._costs.items()},
                    "verify_by_tokens": {str(n): e.value for n, e in self._verify_by_tokens.items()},
                    "alpha": self._alpha.value}

    def load(self, snapshot: dict) -> None:
        """Adopt a snapshot (another orchestrator's latest view of the same model pair)."""
        with self._lock:
            for name, value in snapshot.get("costs", {}).items():
                if name in self._costs and value is not None:
                    self._costs[name].value = float(value)
            for n, value in snapshot.get("verify_by_tokens", {}).items():
                if value is not None:
                    self._verify_by_tokens.setdefault(int(n), Ewma(self._weight)).value = float(value)
            if snapshot.get("alpha") is not None:
                self._alpha.value = float(snapshot["alpha"])
