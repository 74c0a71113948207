"""The γ controller: learns the estimates that `RoundPricing` prices rounds by from every round's record, and
picks γ* = argmax over γ ∈ {0..γ_max} of E(γ)/T(γ) (`specdec.planning.pricing`), every round.

A switch of γ needs a gain of `hysteresis`, so γ does not flap on noise in the load. A probe
(below) pulls its session out of the shared passes, so probes come n times less often.

The controller overlaps rounds (drafting during verification) where max over γ of E/T_o beats max of E/T, and
probes now and then while it does not, as it probes γ > 0 (below), so a slowdown that went away is noticed.

γ = 0 is a candidate like any other, priced as the round it will be. While γ = 0 wins, the controller probes
the best γ > 0 now and then to refresh α, and doubles the interval after every probe that changes nothing, so
a workload where speculation never pays settles at target-only decoding and probes rarely. The interval counts
target steps, not rounds, so a round of k steps brings a probe k steps closer, and it outlives a session: the
next one starts where the last left it (`SharedPrior`), since on a GPU a probe (the draft catching up on a
chunk's tokens, its steps, a second hop) costs several target-only tokens. A due probe also waits until what
it loses against target-only decoding, the draft's catch-up on every token it has not seen included, is at
most `PROBE_SHARE` of the target-only time since the last one, a share halved with the interval (to at most 4
times less): on a CPU a draft model that has not drafted for a while is far behind (at AVX2, a probe at the end of
a 64-token generation caught up on 90 tokens in 12 target steps' time: 0.86× target-only over the generation).
A probe declined for that loss is due again once the allowance has grown to it. Between probes, a round that no
lookup could win even with no draft time and no hop, at the highest α it is priced at, and that the draft model
could not win even at the least its round and catch-up could cost, is target-only without pricing γ, the overlap
or the lookups (`settled`): many sessions on a CPU, and where passes cost the same at any size (a GPU), a draft
far behind.
"""

from __future__ import annotations

from specdec.core.rounds import ALPHA_MAX, PassLoad, RoundRecord
from specdec.planning.cost import CostProfile, batch_fill, expected_tokens
from specdec.planning.estimates import Ewma
from specdec.planning.pricing import RoundPricing

GAMMA_MAX = 8  # the largest γ the adaptive policy plans with, unless configured otherwise
# The most of the target-only time since the last probe that the next one may lose (`GammaController.choose`),
# halved after every probe in a row that changed nothing, down to MIN_PROBE_SHARE (`GammaController.probe_share`).
PROBE_SHARE, MIN_PROBE_SHARE = 1 / 32, 1 / 128
# The most of the target-only time of what a generation can still use that a first measurement of the draft
# model's α may spend on the draft's catch-up (`GammaController.trial_affordable`).
TRIAL_SHARE = 1 / 4
# The most of its own time that a draft's feed beside the target's rounds may cost them, for the draft to count as
# computing apart from the target (`runs_apart`).
APART_SHARE = 1 / 2
# A hop's sample counts as at most HOP_JUMP times its estimate plus HOP_SLACK_S (`update_hop`).
HOP_JUMP, HOP_SLACK_S = 2.0, 0.002


def update_fill(fill: Ewma, sample: float) -> None:
    """Learn a batch fill f from one pass. A provisional or unmeasured f (a finished burst's, a lone session's,
    or none, which prices passes as f = 1) gives way at once to a fuller pass, but only by the average's
    weight to a sparser one: a burst's first passes are ragged while its sessions still prefill, and pricing
    target-only passes by one of them (f = 1/8) made a session draft γ = 7 into 8 users' batch. Over-pricing
    drafting costs a few rounds of speculation; under-pricing it under load costs every session in the pass."""
    current = 1.0 if fill.value is None else fill.value
    if (fill.provisional or fill.value is None) and sample < current:
        fill.value, fill.provisional = current, False
    fill.update(sample)


def update_hop(hop: Ewma, sample: float) -> None:
    """Learn a hop's network time from one round. A sample far above the estimate counts as `HOP_JUMP` times it
    (plus `HOP_SLACK_S`): a stall of one round (a span exporter's flush, a pause of the orchestrator's process)
    is not the network. Read as it, 7 of 8 users' rounds stalled 200 ms at once on a Zen 5 made all 8 draft γ = 3
    in the next round, their draft's catch-ups on 2 shared cores scattered them out of the target's passes, and
    adaptive fell to 0.89x target-only (docs/PERFORMANCE.md). A lasting rise still grows the estimate by half a
    round (the average's weight of 0.5 times twice the estimate). A seed handed on by earlier sessions bounds a
    sample as a measurement does, though the sample then replaces it: taken whole, one stall in a session's first
    drafting round became the next sessions' draft hop, which priced the draft model out for good (its hop is
    measured only in rounds that draft)."""
    if hop.value is not None:
        sample = min(sample, HOP_JUMP * hop.value + HOP_SLACK_S)
    hop.update(sample)


def busy_time(load: PassLoad, compute_s: float) -> float:
    """What a service's scale is learned from: the compute time it reports for a round less the round's wait
    for its passes to begin (its passes and its own work around them). The wait is load, which n and f price
    (`pass_cost`): read as the device's speed, a one-token step that waited 0.94 s behind a burst's prefills
    taught a scale of 33 for one-token passes (7.7 once averaged), which later sessions were handed: 8 users
    drafted in a burst's first rounds, at 0.89-0.93x batched target-only (0.97-1.00x, no drafted round, without
    the wait; docs/PERFORMANCE.md)."""
    return max(compute_s - load.wait_s, load.forward_s)


class GammaController(RoundPricing):
    """Chooses γ each round from the cost profiles, the online α estimate and the measured scales."""

    def __init__(self, gamma_max: int, target_cost: CostProfile, draft_cost: CostProfile | None = None,
                 prior_alpha: float = 0.7, probe_every: int = 16, max_probe_every: int = 256,
                 hysteresis: float = 0.03, target_chunk_s: float = 0.0):
        super().__init__(gamma_max, target_cost, draft_cost, prior_alpha, target_chunk_s)
        self.regime = ""  # whose α prior this session's α comes from and goes back to (`SharedPrior`)
        self.adaptive = True  # it chooses γ: the request fixed none (`SharedPrior` hands it the probe schedule)
        self.alpha_from_prior = False  # α's prior was measured by earlier sessions (`SharedPrior`), not guessed
        self.probe_every, self.max_probe_every = probe_every, max_probe_every
        self.hysteresis = hysteresis
        self._last_gamma: int | None = None
        self.probing = False  # the last `choose` was a probe: γ > 0 though γ = 0 paid (hybrid must draft it)
        self.probe_interval = probe_every  # target steps between probes while γ = 0 wins
        # Target steps since the draft model last drafted: a session's own, from where the last finished session of
        # its prior left it (`SharedPrior`), so that short sessions still reach a probe.
        self.steps_without_draft = 0
        # The loss a due probe was declined at (`choose`): it is due again once the allowance has grown to it.
        self._declined_loss: float | None = None
        self._rounds_without_overlap = 0
        self._overlap_probe_interval = probe_every

    # -- learning ----------------------------------------------------------------------------
    def observe(self, record: RoundRecord, by_model: bool = True) -> None:
        """Learn from one round (`specdec.core.rounds`): α, each service's scale, network time and load.
        `by_model` False: the drafts came from elsewhere (a lookup), which teaches nothing of the draft
        model's α or cost; the target's side is learned all the same."""
        target, draft = record.target_load, record.draft_load
        update_hop(self.rtt_target, record.rtt_target_s)
        pass_tokens = target.tokens or record.drafted + 1
        steps_s = (record.target_passes - 1) * self.profiled_s(self.target_cost, 1)  # one token each
        target_s = busy_time(target, record.target_compute_s) / (self.profiled_s(self.target_cost, pass_tokens)
                                                                 + steps_s)
        if record.overlapped:  # a verify beside the draft's next branch: its slowdown, not drift
            self.contention_target.update(max(target_s / self.target_scale_at(pass_tokens), 1.0))
        else:
            self.target_scale.update(target_s)
            if record.target_passes == 1 or pass_tokens == 1:  # passes of one size
                self.target_sizes.update(round(pass_tokens), target_s)
        self.observe_sessions(record)
        fill = self.target_fill_drafting if record.drafted > 0 else self.target_fill_plain
        update_fill(fill, batch_fill(target.rows, target.sessions))
        if record.drafted > 0 and by_model:
            self.acceptance.observe(record.drafted, record.accepted)
            self.draft_sessions.update(max(draft.sessions, 1))
            update_fill(self.draft_fill, batch_fill(draft.rows, draft.sessions))
            step = self.profiled_s(self.draft_cost, draft.tokens or 1) if self.draft_cost is not None else 0.0
            # A prefetched proposal's compute is its branch's, learned in `observe_branch`; a free
            # proposer (a lookup) has no scale to learn.
            if record.draft_steady and not record.prefetched and step > 0:
                self.draft_scale.update(busy_time(draft, record.draft_compute_s) / (record.drafted * step))
            if not record.draft_opened:
                update_hop(self.rtt_draft, record.rtt_draft_s)
            self.steps_without_draft, self._declined_loss = 0, None
        else:
            self.steps_without_draft += max(record.target_passes, 1)

    def observe_sessions(self, record: RoundRecord) -> None:
        """Learn how many sessions the target serves from any round, a prefill's too (whose cost teaches
        nothing of a steady round's)."""
        self.target_sessions.update(max(record.target_load.sessions, 1))

    def observe_branch(self, drafted: int, compute_s: float, guessed: bool | None,
                       load: PassLoad = PassLoad()) -> None:
        """Learn from a branch drafted beside a verify: the draft's slowdown there (κ_d), from its busy time
        (`busy_time`: its `load`'s wait behind other sessions' passes is load, not slowdown), and, when
        the verdict accepted every draft, whether the branch's guess of the bonus token was right."""
        step = self.draft_step()
        if drafted > 0 and step > 0:
            self.contention_draft.update(max(busy_time(load, compute_s) / (drafted * step), 1.0))
        if guessed is not None:
            self.guesses.observe(1, int(guessed))

    # -- the decision ----------------------------------------------------------------------------
    def overlap_pays(self, max_useful: int | None = None, gamma: int | None = None) -> bool:
        """Overlap the next round: its best rate under T_o beats the best under T (at `gamma` when the
        request fixed one), or it is time to probe (doubling the wait after every probe that changes
        nothing, as `choose` does)."""
        cap = self.gamma_max if max_useful is None else max(0, min(self.gamma_max, max_useful))
        if self.draft_cost is None or cap == 0 or gamma == 0:
            return False
        plain, overlapped = (self.rate(gamma, overlapped=o) if gamma is not None else max(self.rates(cap, o).values())
                             for o in (False, True))
        if overlapped > plain:
            self._rounds_without_overlap, self._overlap_probe_interval = 0, self.probe_every
            return True
        self._rounds_without_overlap += 1
        if self._rounds_without_overlap < self._overlap_probe_interval * round(self.target_sessions.value):
            return False
        self._overlap_probe_interval = min(2 * self._overlap_probe_interval, self.max_probe_every)
        self._rounds_without_overlap = 0
        return True

    def feed_share(self) -> float | None:
        """What a draft's feed beside the target's rounds costs them, as a share of the feed's own time: their
        slowdown beside it (κ_t − 1) for as long as it runs there (κ_d times its own time). None until both κ were
        measured (overlapped rounds, this session's or handed on by earlier ones)."""
        kappa_t, kappa_d = self.contention_target.value, self.contention_draft.value
        return None if kappa_t is None or kappa_d is None else (kappa_t - 1.0) * kappa_d

    def runs_apart(self) -> bool:
        """Whether the draft computes apart from the target: a feed beside the target's rounds costs them at most
        `APART_SHARE` of its time (`feed_share`). Measured on a Zen 5 of 2 cores: the services pinned to a core
        each, κ_t 1.01-1.21 and κ_d 1.13-1.36 (0.01-0.29); on both cores, κ_d 5.3, and κ_t unmeasured: overlap
        does not pay there, so no verify overlaps."""
        share = self.feed_share()
        return share is not None and share <= APART_SHARE

    def feed_ahead(self, max_useful: int, unseen: int) -> int:
        """γ for a draft that feeds `unseen` tokens beside the target's prompt round (0: none): where it runs apart
        (`runs_apart`) and steady rounds of the draft model then beat target-only, the feed's cost to the target
        (`feed_share` of it) spread as a catch-up's (`catch_up_rate`). A feed that only a later turn could repay is
        not made: with the services pinned a core each, 3,000 tokens fed beside the target's prefill of them slowed
        it by about a seventh, a 128-token reply's wall time 1.11x, and the reply drafted 22 tokens."""
        gamma = self.steady_best(max_useful) if self.runs_apart() else 0
        if gamma == 0:
            return 0
        plain = self.plain_rate(self.plain_steps(max_useful + 1))
        return gamma if self.catch_up_rate(gamma, unseen, max_useful, share=self.feed_share()) > plain else 0

    def steady_best(self, max_useful: int) -> int:
        """The γ that steady rounds would draft at (0: target-only beats every γ > 0), with no catch-up to pay,
        as `choose` picks a probe's."""
        cap = max(0, min(self.gamma_max, max_useful))
        if self.draft_cost is None or cap == 0:
            return 0
        steady = self.rates(cap, steps=self.plain_steps(max_useful + 1))
        return max(steady, key=steady.get)

    def untried(self) -> bool:
        """Whether the draft model's α is still a guess: no earlier session measured it, nor has this one."""
        return not self.alpha_from_prior and self.acceptance.observed == 0

    def trial_affordable(self, gamma: int, unseen: int, useful: int | None = None) -> bool:
        """Whether to measure the draft model's α now, as a round of γ whose draft first feeds `unseen` tokens,
        whatever the round is priced at: while α is a guess, where that feed's extra time is at most `TRIAL_SHARE`
        of the target-only time of the `useful` tokens left (None: any feed). Past it the model is priced at the
        guess like any option, and a later session with less to feed measures it: a fresh server's first request
        after a 3,000-token prompt had paid the draft's whole feed, 6 s at VNNI, for a 128-token reply (0.23–0.43×
        target-only)."""
        if not self.untried():
            return False
        return useful is None or self.catch_up_time(gamma, unseen) <= TRIAL_SHARE * max(useful, 1) * self.verify_time(0)

    def confidence_threshold(self) -> float:
        """The draft's early-stop threshold.

        One more draft token costs a draft step plus the marginal verify time. It pays back one
        target-only round only if every token before it is accepted too, which the draft's
        running confidence estimates. So stop once that confidence is below cost / T(0).
        """
        if self.draft_cost is None:
            return 0.0
        marginal_verify = max(self.verify_time(self.gamma_max) - self.verify_time(0), 0.0) / self.gamma_max
        cost = self.draft_step() + marginal_verify
        return min(max(cost / self.round_time(0), 0.0), 0.9)

    def draft_limit(self, gamma: int, cap: int) -> int:
        """The most drafts a draft-model round of γ asks for: `cap` (γ_max, or fewer near the end) wherever
        the draft stops early (`confidence_threshold` > 0, γ > 0), so that a confident stretch drafts on for
        as long as each next token pays, where γ, priced at the generation's average α, stops short of it
        (the packaged pair: accepted length 2.3 → 3.2 and adaptive 1.015-1.041x as fast in six alternating runs
        on a Zen 4; 2.5 → 3.3 at the same speed on a Zen 5; docs/PERFORMANCE.md); else γ."""
        return max(gamma, cap) if gamma > 0 and self.confidence_threshold() > 0 else gamma

    def settled(self, max_useful: int | None = None, alphas: dict[int, float] | None = None,
                unseen: int | None = None, useful: int | None = None) -> bool:
        """Whether this round is target-only whoever would propose, so that `choose` (which would say 0), the
        overlap's pricing and the lookups' can be skipped: the last choice was γ = 0, no probe is due, and for
        every proposer, priced as a free one (`best_free`: no draft time, no hop and no slowdown, a lookup's price
        and more than the draft model's, overlapped or not) at its α and up to the most tokens it proposes, the
        best γ is 0: a one-step target-only round, the least target-only is priced at. `alphas`: each proposer's
        α by the most tokens it proposes (default: any number at `ALPHA_MAX`, the most an estimate says). With
        `unseen` (`choose`'s, and `useful`, its `max_useful`), the draft model is priced apart at its own α and
        with its catch-up (`model_loses`), not as a free proposer. A round it settles is decided, as `choose`
        decides one: `probing` turns False.

        Measured on a Zen 5 at 8 users, the orchestrator priced γ, overlap and lookups in 95 µs a round: for 8
        sessions, 0.8 ms of Python one after another between two 55 ms passes that wait for every session.
        This costs a verify price per γ and proposer (15 µs there, with the model and an untried lookup kind)."""
        cap = self.gamma_max if max_useful is None else max(0, min(self.gamma_max, max_useful))
        alphas = {cap: ALPHA_MAX} if alphas is None else alphas
        if not self.at_rest():
            return False
        if any(self.best_free(alpha, min(longest, cap))[0] > 0 for longest, alpha in alphas.items()):
            return False
        if unseen is not None and not self.model_loses(cap, unseen, useful):
            return False
        self.probing = False  # as `choose` would leave it
        return True

    def model_loses(self, cap: int, unseen: int, useful: int | None) -> bool:
        """Whether every γ ≤ cap of the draft model loses to a one-step target-only round even priced at the least
        `choose` could price it, overlapped or not: its round no shorter than the verify and the draft's steps
        without their hops (`steady_draft_time`), or, overlapped, than the longer of the verify and the branch's
        steps, either at a slowdown of at most 1; plus the catch-up on `unseen` tokens, spread as
        `catch_up_rate` spreads it. Where a pass of more tokens costs about what one does (a GPU), a free proposer
        wins at any α, so the model priced as one never settled a round; what it cannot win there is its draft's
        cost and catch-up (docs/PERFORMANCE.md, "Decisions in GPU-like passes")."""
        if self.draft_cost is None or self.best_free(self.acceptance.alpha, cap)[0] == 0:  # even free, it loses
            return True
        rtt, step = self.rtt_target.value or 0.0, self.draft_step()
        kappa_t, kappa_d = min(self.target_contention(), 1.0), min(self.contention_draft.value or 1.0, 1.0)
        plain = 1.0 / (rtt + self.verify_time(0))
        for gamma in range(1, cap + 1):
            verify = self.verify_time(gamma)
            alone = rtt + verify + self.steady_draft_time(gamma, step)
            overlapped = max(rtt + kappa_t * verify, kappa_d * (gamma + 1) * step)
            most = expected_tokens(self.acceptance.alpha, gamma) / min(alone, overlapped)
            if unseen > 1:
                most = self.catch_up_rate(gamma, unseen, useful, most, step)
            if most > (1.0 - 1e-9) * plain:  # a margin for the rounding of the rates' divisions
                return False
        return True

    def at_rest(self) -> bool:
        """The preconditions of `settled` that need no α: the last choice was γ = 0 and no probe is due."""
        return self._last_gamma == 0 and not self._probe_due()

    def _probe_due(self) -> bool:
        """While γ = 0 wins: enough target steps since the last drafted round for a probe (`choose`), and, after a
        probe declined for what it would lose, an allowance grown to that loss (`probe_allowance`). Until then the
        session is at rest (`settled` may skip its pricing): where the draft falls further behind with every
        target-only round, its catch-up grew faster than the allowance, and every round was priced in full only
        to decline the probe again (docs/PERFORMANCE.md)."""
        if self.steps_without_draft < self.probe_interval * round(self.target_sessions.value):
            return False
        return self._declined_loss is None or self.probe_allowance() >= self._declined_loss

    def probe_allowance(self) -> float:
        """Seconds the next probe may lose against target-only decoding: `probe_share` of the target-only time
        since the last probe."""
        return self.probe_share() * self.steps_without_draft * self.verify_time(0)

    def choose(self, max_useful: int | None = None, unseen: int = 1) -> int:
        """γ for the next round; `max_useful` caps it (e.g. tokens left to generate minus one); `unseen`: the
        tokens the draft model must feed before it drafts (1 in a steady round), which prices every γ > 0
        (`catch_up_rate`) and which a probe pays for."""
        cap = self.gamma_max if max_useful is None else max(0, min(self.gamma_max, max_useful))
        if self.draft_cost is None or cap == 0:
            return 0
        steady = self.rates(cap, steps=self.plain_steps(None if max_useful is None else max_useful + 1))
        rate = dict(steady)
        if unseen > 1:  # the draft first catches up: a long conversation's first drafting round feeds all of it
            step = self.draft_step()
            rate.update({g: self.catch_up_rate(g, unseen, max_useful, steady[g], step) for g in range(1, cap + 1)})
        best = max(rate, key=rate.get)
        last = self._last_gamma
        if last is not None and last <= cap and rate[last] >= (1.0 - self.hysteresis) * rate[best]:
            best = last  # not worth a switch
        self.probing = False
        if best == 0 and self._probe_due():
            # Probe: refresh α with the γ that would be used if speculation paid, once it is affordable (an
            # α never measured is worth its first measurement, where the draft's feed allows: `trial_affordable`).
            # A probe that leaves γ = 0 best doubles the wait before the next one.
            probe = max(range(1, cap + 1), key=steady.get)  # the rounds after it are steady
            loss = 0.0 if self.trial_affordable(probe, unseen, max_useful) else self.probe_loss(probe, unseen, rate[0])
            if loss <= self.probe_allowance():
                self.probe_interval = min(2 * self.probe_interval, self.max_probe_every)
                self.steps_without_draft, self._declined_loss = 0, None
                self.probing = True
                return probe
            self._declined_loss = loss
        if best > 0:
            self.probe_interval, self._declined_loss = self.probe_every, None
        self._last_gamma = best
        return best

    def probe_share(self) -> float:
        """The most of the target-only time since the last probe that the next one may lose: `PROBE_SHARE`,
        halved for every probe in a row that left γ = 0 best (as `probe_interval` doubles), down to
        `MIN_PROBE_SHARE`. Where a probe costs more than the interval's share (a draft far behind on a CPU), the
        share and not the interval sets when it comes, so a fixed share never let probes thin out: on a Zen 1,
        where this pair's speculation barely pays, two to four of `specdec bench`'s four 64-token replies probed,
        each probe 0.06-0.25 s behind target-only, mostly the draft's catch-up (docs/PERFORMANCE.md)."""
        return max(PROBE_SHARE * self.probe_every / self.probe_interval, MIN_PROBE_SHARE)

    def probe_loss(self, gamma: int, unseen: int, plain_rate: float) -> float:
        """Seconds a round of γ drafts whose draft first feeds `unseen` tokens is expected to lose against
        target-only decoding at `plain_rate` tokens per second (0 where it gains)."""
        spent = self.round_time(gamma) + self.catch_up_time(gamma, unseen)
        return max(spent - expected_tokens(self.acceptance.alpha, gamma) / plain_rate, 0.0)
