"""What sessions learn, handed on to the next session: the draft model pair's prior and the lookups'."""

from __future__ import annotations

import threading

from specdec.core.rounds import AcceptanceEstimate
from specdec.planning.controller import GammaController
from specdec.planning.cost import CostProfile
from specdec.planning.estimates import Ewma, SizeScales

# Tokens a session must have measured for its α to move the prior by a whole step; one that measured fewer (a
# probe of one token) moves it by their share. Ignored outright, as they were, a session's probe left the next
# session with α untried, which measured it again whatever its catch-up cost (at AVX2: every 64-token
# generation, 0.97× target-only).
ALPHA_TOKENS = 4


REGIMES = ("greedy", "t<=0.5", "t<=1", "t>1")


def sampling_regime(temperature: float) -> str:
    """The α prior a session draws from and feeds, by its temperature: a draft's tokens are accepted less as the
    temperature rises (greedy: where the two models' likeliest tokens agree; sampled: where their distributions
    overlap), so one α for all priced code completions at a hot chat's α after a burst of chats."""
    if temperature == 0.0:
        return REGIMES[0]
    return REGIMES[1] if temperature <= 0.5 else REGIMES[2] if temperature <= 1.0 else REGIMES[3]


class LoadEstimates:
    """One service's load estimates (`GammaController.LOAD` Ewmas), shared by the sessions that measure it,
    and how many of those are live: when the last one leaves, the estimates turn provisional, so the next
    session's first measurement replaces them. Until then a provisional count of sessions is the live
    sessions': a burst's first rounds, chosen before any of them measured, must not be priced as a lone
    session's (measured: 8 users arriving after one drafted in their first round, and lost 4% of target-only's
    tokens/s), nor a lone session after a burst as the burst's (the draft's count is measured only in rounds
    that draft: after a request for 3 choices, seen in an orchestrator, every later session priced the draft's
    passes as 3 sessions'). On a service every session uses (`floored`: the target) they stay a floor on every
    sample: the first sessions of a burst to report find the others not yet opened there, and a report of 1–5 live
    sessions priced the burst's next rounds as a lone session's (measured on a Zen 4: all 8 users drafted
    γ = 1–4 in their first decode rounds, which took 0.1–1.2 s, and adaptive fell to 0.86–0.93× batched
    target-only). Thread-safe."""

    def __init__(self, ewmas: dict[str, Ewma], floored: tuple[str, ...] = ()):
        self.ewmas = ewmas
        self._floored = [ewmas[name] for name in floored]
        self._live = 0
        self._lock = threading.Lock()

    def join(self) -> None:
        with self._lock:
            self._live += 1
            for name, shared in self.ewmas.items():
                if name.endswith("_sessions") and shared.provisional and shared.value != self._live:
                    shared.seed(float(self._live))
            for shared in self._floored:
                shared.floor = float(self._live)
                if shared.value is not None and shared.value < self._live:
                    shared.value = float(self._live)

    def leave(self) -> None:
        with self._lock:
            self._live = max(self._live - 1, 0)
            for shared in self._floored:
                shared.floor = float(self._live)
            if self._live == 0:
                for shared in self.ewmas.values():
                    shared.provisional = shared.value is not None


class SharedPrior:
    """What sessions of one model pair learn, handed on to the next session, and the services' load,
    which they share while they run.

    A new session starts from the scales, network times and α of earlier ones (α of those of its sampling regime:
    `sampling_regime`) instead of from scratch, and with the last one's wait between probes (and, the first session
    to start after it ended, its steps toward it: `GammaController.probe_interval`, `steps_without_draft`, one for
    every regime; a session whose request fixes γ takes no steps, and leaves its own only if it drafted); a finished
    session folds its estimates back in. The prior keeps its own averages, so a session's controller keeps its own
    smoothing. The load estimates (live sessions, batch fills) are one set while sessions overlap, updated by every
    session's rounds: a session that stopped decoding target-only still sees how full
    target-only passes are from those that did not, instead of one stale sample of its own keeping it drafting
    (measured: 1 of 8 users drafted every round on a fill of 1/8 from its first round, and cost the 8 users 12% of
    their tokens/s). When the last session on a service ends (`LoadEstimates`) they turn provisional: a burst's load
    must not price a lone session's rounds. Every `new_controller` is to be matched by one `absorb`. Thread-safe (a
    lost update of a load estimate, from two sessions at once, is harmless).
    """

    def __init__(self, gamma_max: int, prior_weight: float = 8.0, weight: float = 0.3,
                 target_load_of: SharedPrior | None = None):
        """`target_load_of`: another proposer's prior on the same target, whose target load estimates
        this one's sessions share (their draft side stays their own)."""
        self.gamma_max = gamma_max
        self._learned = {name: Ewma(weight) for name in GammaController.LEARNED}
        self._target_sizes = SizeScales(weight)
        fresh = GammaController.fresh_load()
        target = {name: estimate for name, estimate in fresh.items() if name.startswith("target_")}
        self._target_load = target_load_of._target_load if target_load_of is not None else \
            LoadEstimates(target, floored=("target_sessions",))
        # A draft γ > 0 is priced as every session drafting alike, so the live sessions floor the draft's sessions
        # too: the first of a burst to draft met the draft alone, and priced at one session's passes, the draft's
        # catch-ups on 2 shared cores drew the rest in (8 users on a Zen 5 at 0.87x target-only, traced).
        self._draft_load = LoadEstimates({name: estimate for name, estimate in fresh.items() if name not in target},
                                         floored=("draft_sessions",))
        self._load = self._target_load.ewmas | self._draft_load.ewmas
        self._weight = weight
        self._alpha: dict[str, Ewma] = {}  # by `sampling_regime`
        self._prior_weight = prior_weight
        # The last finished session's wait between probes and its target steps since it last drafted
        # (`GammaController.probe_interval`, `steps_without_draft`): the next session goes on from there.
        self._probe_interval: int | None = None
        self._steps_without_draft = 0
        self._lock = threading.Lock()

    def new_controller(self, target_cost: CostProfile, draft_cost: CostProfile | None = None,
                       regime: str = "", adaptive: bool = True) -> GammaController:
        """A session's controller, seeded; its α from the prior of its `regime` (`sampling_regime`). `adaptive`
        False: the request fixed γ, so the session neither takes the probe schedule (`absorb`) nor probes."""
        controller = GammaController(self.gamma_max, target_cost, draft_cost)
        controller.regime, controller.adaptive = regime, adaptive
        for name, shared in self._load.items():
            setattr(controller, name, shared)
        self._target_load.join()
        self._draft_load.join()
        with self._lock:
            # Seeds are provisional: this session's first measurement of each replaces its seed,
            # so that a value measured once in a slow minute cannot pin later sessions.
            for name, shared in self._learned.items():
                getattr(controller, name).seed(shared.value)
            controller.target_sizes.seed(self._target_sizes)
            alpha = self._alpha_of(regime).value
            if self._probe_interval is not None:
                controller.probe_interval = self._probe_interval
            # The steps go to one session: handed to every session of a burst, they made all of them due a probe
            # in their first rounds at once (8 users on a Zen 1: 4 probes together scattered the target's passes,
            # which priced target-only low enough that most of the burst drafted, 0.92x batched target-only).
            if adaptive:
                controller.steps_without_draft, self._steps_without_draft = self._steps_without_draft, 0
        if alpha is not None:
            controller.acceptance = AcceptanceEstimate(alpha, self._prior_weight)
            controller.alpha_from_prior = True
        return controller

    def absorb(self, controller: GammaController) -> None:
        """Fold in what a finished session's controller learned (its measured values, not its seeds)."""
        self._target_load.leave()
        self._draft_load.leave()
        with self._lock:
            for name, shared in self._learned.items():
                learned = getattr(controller, name)
                if learned.value is not None and not learned.provisional:
                    shared.update(learned.value)
            self._target_sizes.absorb(controller.target_sizes)
            estimate = controller.acceptance
            if estimate.observed:  # a session that measured a token or two (a probe) moves it that much less
                # What the session's own rounds measured, not its estimate, which holds the prior it was handed:
                # folded back in, a low prior's pseudo-tokens held the prior down after the workload changed.
                # The first session's has nothing to move: it keeps its estimate's shrinkage to the default guess.
                alpha = self._alpha_of(controller.regime)
                sample = estimate.alpha if alpha.value is None else estimate.measured
                alpha.update(sample, share=min(estimate.observed / ALPHA_TOKENS, 1.0))
            # A probe's loss falls on the session that probes, so only sessions that choose γ earn its budget: a
            # fixed γ's target-only steps had doubled the steps `specdec bench`'s adaptive replies were handed (its
            # target-only replies run between them), and a fixed γ that drafted measured α as a probe would.
            if controller.adaptive:
                self._probe_interval = controller.probe_interval
                self._steps_without_draft = controller.steps_without_draft
            elif estimate.observed:
                self._steps_without_draft = controller.steps_without_draft

    def _alpha_of(self, regime: str) -> Ewma:
        """The α prior of `regime` (made on first use). Call with the lock held."""
        return self._alpha.setdefault(regime, Ewma(self._weight))

    def snapshot(self) -> dict:
        """The prior as plain data (JSON-ready), to share between orchestrators."""
        with self._lock:
            return {"learned": {name: e.value for name, e in (self._learned | self._load).items()},
                    "target_sizes": self._target_sizes.snapshot(),
                    "alpha": {regime: e.value for regime, e in self._alpha.items() if e.value is not None}}

    def load(self, snapshot: dict) -> None:
        """Adopt a snapshot (another orchestrator's latest view of the same model pair)."""
        with self._lock:
            for name, value in snapshot.get("learned", {}).items():
                if name in self._learned and value is not None:
                    self._learned[name].value = float(value)
                elif name in self._load and value is not None:
                    shared = self._load[name]
                    if shared.provisional or shared.value is None:  # until this orchestrator's sessions measure it
                        shared.seed(float(value))
            self._target_sizes.load(snapshot.get("target_sizes") or {})
            alpha = snapshot.get("alpha")
            if isinstance(alpha, (int, float)):  # an orchestrator of before regimes: one α for every one
                alpha = dict.fromkeys(REGIMES, alpha)
            for regime, value in (alpha or {}).items():
                self._alpha_of(regime).value = float(value)


class LookupPrior:
    """α of lookup proposals (`specdec.core.ngram`) per kind (where they matched and how long a suffix),
    handed from finished sessions to new ones, as `SharedPrior` does for the draft model's, and which kinds
    no session has tried yet (hybrid tries each one once: `untried`). Thread-safe."""

    def __init__(self, kinds, prior_alpha: float = 0.5, prior_weight: float = 8.0, weight: float = 0.3):
        self.prior_alpha, self.prior_weight = prior_alpha, prior_weight
        self._alpha = {kind: Ewma(weight) for kind in kinds}
        self._tried: set = set()
        self._lock = threading.Lock()

    def untried(self, kind) -> bool:
        """Whether no session has proposed a lookup of this kind yet."""
        with self._lock:
            return kind not in self._tried

    def tried(self, kind) -> None:
        """A session proposed a lookup of this kind: at once, so that sessions running beside it do not
        each try it too."""
        with self._lock:
            self._tried.add(kind)

    def estimates(self) -> dict:
        """A new session's estimates: the shared α where one was learned, else the prior's (weakly held)."""
        with self._lock:
            return {kind: AcceptanceEstimate(self.prior_alpha) if e.value is None
                    else AcceptanceEstimate(e.value, self.prior_weight) for kind, e in self._alpha.items()}

    def absorb(self, estimates: dict) -> None:
        with self._lock:
            for kind, estimate in estimates.items():
                if kind in self._alpha and estimate.observed >= 4:
                    self._alpha[kind].update(estimate.alpha)
