"""What a round costs and yields by the controller's estimates: Leviathan et al.'s walltime model, with
measured costs, the network and load.

Round time  T(γ) = rtt_target + s_t·C_t(γ+1) + [γ > 0]·(rtt_draft + s_d·(C_d(1 + α^γ) + (γ−1)·C_d(1)))
Pass cost   C(k) = P(f·n·k)/f + n·k·a·(d − 128): n live sessions, a share f of them per pass, k tokens each
            (n = 1: P(k)), each token attending over the session's d cached positions (a: `per_position_s`)
Tokens      E(γ) = (1 − α^(γ+1)) / (1 − α)
(A round's first draft pass feeds the last round's last draft and bonus token where it accepted every draft.)

P_t(S) and P_d(S) are the services' start-up cost profiles (`specdec.planning.cost`): one forward
of S tokens, measured on their own machine and compute path, with what attention adds per token and
cached position past their 128-token context (a_t, a_d; d: the session's context, `context`, which every
session prices its own and the passes it shares at). So the shape of the verify cost, the thing that
decides whether speculation pays, is known from the first round and at any depth (a CPU's verify of 5
costs 1.4 one-token steps after 128 tokens and 2.5 after 6,144, measured). What is learned
online: α, a scale per service (s ≈ 1; it follows drift), the target's also per pass size once that size
was measured (`SizeScales`: a CPU's one-token pass slows with the host's bandwidth, a verify's arithmetic
does not, so drift changes the curve's shape), the network time of each hop (wall
time minus the compute time the service reports), and the load each service reports every round:
its live sessions n and the sessions that shared the pass, a share f of n (the batch fill). The load
is the services' own state: the sessions of one `SharedPrior` share one estimate of it.

Load: with n sessions on a busy service, every session's round waits for the 1/f passes that serve
them all, each of f·n·k tokens. The n sessions emit n·E(γ) tokens per such cycle, so the aggregate
goodput n·E(γ)/T(γ) and one session's E(γ)/T(γ) peak at the same γ (SmartSpec's uniform-γ
objective). Where several tokens per forward stop being cheap, because the batch already fills the
machine, γ falls to 0. f is learned apart for rounds that draft and rounds that do not: sessions
that decode target-only return to the target in step and fill its passes, while speculating ones
arrive scattered by their draft rounds, so speculation also pays for the batch it scatters. Draft
and target time add up, as they do when the services share a machine (the embedded default); on
separate machines this undercounts speculation at high load, never at n = 1.

Overlap (drafting during verification): while the target verifies γ drafts, the draft drafts γ+1
more, a guess of the bonus token and the next round's drafts. The next round finds them ready when
every draft was accepted and the guess was right, probability h(γ) = α^γ·β (β learned); otherwise it
drafts as usual. A round then costs
    T_o(γ) = max(rtt_draft + κ_d·(γ+1)·t_d, rtt_target + κ_t·t_v(γ)) + (1 − h(γ))·(rtt_draft + γ·t_d)
instead of T(γ), where κ_d, κ_t ≥ 1 are the slowdowns each service shows while the other runs
(1 on separate machines; more where they share cores), measured in overlapped rounds only (1 until then).

γ = 0 is a candidate like any other. A target-only round may take k steps on the target in one hop
(`specdec.engine.continuation`): as many as fit in `target_chunk_s` of expected compute, so that
tokens still stream that often. It yields k tokens in rtt_target + k·t_v(0), and γ = 0 is priced so;
where one step takes longer than the chunk, k = 1.

A round whose draft must first feed tokens it has not seen (a prompt, or what lookups or target-only rounds
committed) pays that feed once: it is spread over the rounds the draft then serves (`catch_up_rate`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from specdec.core.rounds import MAX_EXTRA_STEPS, AcceptanceEstimate
from specdec.planning.cost import CostProfile, expected_tokens, pass_cost, pass_rows, positions_past
from specdec.planning.estimates import SCALE_MEDIAN_OF, Ewma, SizeScales

# The rounds a draft's catch-up is spread over (`catch_up_rate`), unless fewer tokens are left or more were generated
# already. Over 8, a ~50-token prompt's prefill priced the draft model out of 64-token generations for good: each
# target-only round left it a token further behind (measured: adaptive at γ <= 1 with α 0.64, against γ up to 6 with
# α 0.85 once it drafted from the start).
CATCH_UP_ROUNDS = 32


def priced_once(method: Callable) -> Callable:
    """A price method (positional arguments only) computed once per arguments within `RoundPricing.one_decision`."""
    name = method.__name__

    @functools.wraps(method)
    def price(self, *args):
        prices = self._prices
        if prices is None:
            return method(self, *args)
        key = (name, *args)
        value = prices.get(key)
        if value is None:
            value = prices[key] = method(self, *args)
        return value

    return price


class RoundPricing:
    """The estimates a session's rounds are priced by, and the prices: what a round of γ drafts (or of k
    target-only steps) costs and yields. `GammaController` learns the estimates and chooses by the prices."""

    LEARNED = ("target_scale", "draft_scale", "rtt_draft", "rtt_target", "contention_target", "contention_draft")
    # The services' load: one state of theirs, that every session's rounds measure (`SharedPrior` hands all
    # of its sessions the same estimates of it).
    LOAD = ("target_sessions", "draft_sessions", "target_fill_drafting", "target_fill_plain", "draft_fill")

    def __init__(self, gamma_max: int, target_cost: CostProfile, draft_cost: CostProfile | None = None,
                 prior_alpha: float = 0.7, target_chunk_s: float = 0.0):
        self.gamma_max = gamma_max
        self.target_chunk_s = target_chunk_s  # target-only rounds take the steps that fit in this (0: one)
        self.context = 0  # the session's cached positions: its passes' attention is priced at this depth
        self.generated = 0  # tokens the generation has emitted: a guess at how many more it emits (`catch_up_rate`)
        # The services' start-up cost profiles (no draft profile: no draft model to price).
        self.target_cost, self.draft_cost = target_cost, draft_cost
        self.acceptance = AcceptanceEstimate(prior_alpha=prior_alpha)
        # Measured / profiled compute: of the target's passes of every size, then per size (which prices passes
        # once measured), each update the median of the last few samples, since a stall there prices drafting as
        # cheaper than it is; and of the draft's, each sample taken at once: a stall there prices it dearer, and its
        # samples come only from drafted rounds, where one that finds the draft slower should count that round.
        self.target_scale = Ewma(0.3, 1.0, provisional=True, median_of=SCALE_MEDIAN_OF)
        self.target_sizes = SizeScales(0.3, median_of=SCALE_MEDIAN_OF)
        self.draft_scale = Ewma(0.3, 1.0, provisional=True)
        # Network time is measured every round with little noise: follow it quickly.
        self.rtt_draft = Ewma(0.5)
        self.rtt_target = Ewma(0.5)
        for name, estimate in self.fresh_load().items():
            setattr(self, name, estimate)
        # Overlap: κ, each service's slowdown while the other computes (None until measured: priced as 1), and β,
        # how often the draft's guess of the bonus token is right once every draft was accepted.
        self.contention_target = Ewma(0.3)
        self.contention_draft = Ewma(0.3)
        self.guesses = AcceptanceEstimate(prior_alpha=prior_alpha)
        self.overlapping = False  # price rounds as overlapped (`overlap_round_time`)
        self._prices: dict | None = None  # within `one_decision`: the prices computed so far

    @contextmanager
    def one_decision(self) -> Iterator[None]:
        """Within it, each pass's and round's price is computed once and then reused: the estimates are read as
        they stand when first asked. Choosing one round prices every γ three to five times over (`settled`, the
        overlap, `choose`): 0.7 ms of Python a round on a Zen 1 at 8 users (0.03 for target-only), for 8 sessions
        one after another between two passes that wait for them all. Nested, the outermost one counts."""
        if self._prices is not None:
            yield
            return
        self._prices = {}
        try:
            yield
        finally:
            self._prices = None

    @staticmethod
    def fresh_load() -> dict[str, Ewma]:
        """The `LOAD` estimates before any round: n (live sessions on each service) 1, provisionally; f (the
        share of the live sessions in a pass) unmeasured, which prices passes as if every session were in one."""
        return {"target_sessions": Ewma(0.3, 1.0, provisional=True), "draft_sessions": Ewma(0.3, 1.0, provisional=True),
                "target_fill_drafting": Ewma(0.3), "target_fill_plain": Ewma(0.3), "draft_fill": Ewma(0.3)}

    def depth_s(self, profile: CostProfile, tokens: float) -> float:
        """What attention over the session's context adds to `tokens` new tokens' passes after it, by `profile`."""
        return profile.depth_s(positions_past(tokens, self.context))

    def feed_depth_s(self, profile: CostProfile, tokens: float) -> float:
        """The same for a feed of `tokens` that ends at the session's context (a prompt, a draft's catch-up):
        each token priced at the feed's mean position, its chunks' growth included."""
        return profile.depth_s(positions_past(tokens, self.context - tokens / 2))

    def profiled_s(self, profile: CostProfile, tokens: float) -> float:
        """One pass of `tokens` new tokens at the session's depth, by `profile` (no scale)."""
        return profile.forward_s(tokens) + self.depth_s(profile, tokens)

    def target_scale_at(self, tokens: float, at_own_level: bool = False) -> float:
        """s_t for a target pass of `tokens` new tokens: its size's, once any size was measured (`SizeScales.at`)."""
        return self.target_sizes.at(tokens, self.target_scale.value, at_own_level)

    @priced_once
    def verify_time(self, gamma: int) -> float:
        """t_v(γ): the target passes that verify γ drafts of every live session that does alike. Target-only's
        pass, where this session has not run it, is priced at the session's own level (`SizeScales.level`): run
        once, it measures itself at no cost, where a verify priced low costs a draft's catch-up to measure."""
        fill = self.target_fill_drafting if gamma > 0 else self.target_fill_plain
        sessions = self.target_sessions.value
        scale = self.target_scale_at(pass_rows(sessions, fill.value) * (gamma + 1), at_own_level=gamma == 0)
        return scale * (pass_cost(self.target_cost, sessions, fill.value, gamma + 1)
                        + self.depth_s(self.target_cost, sessions * (gamma + 1)))

    @priced_once
    def draft_step(self) -> float:
        """One draft step: a pass of one token per drafting session (0 without a draft profile)."""
        if self.draft_cost is None:
            return 0.0
        sessions = self.draft_sessions.value
        return self.draft_scale.value * (pass_cost(self.draft_cost, sessions, self.draft_fill.value, 1)
                                         + self.depth_s(self.draft_cost, sessions))

    def target_time(self, tokens: int) -> float:
        """Expected target compute for `tokens` new tokens (a prefill included) in a loaded pass."""
        sessions = self.target_sessions.value
        total = round(sessions * tokens)
        return self.target_scale_at(total) * (self.target_cost.upper_bound_s(total)
                                              + sessions * self.feed_depth_s(self.target_cost, tokens))

    def draft_time(self, fed: int, gamma: int, step: float | None = None) -> float:
        """Expected draft compute: feed `fed` tokens, then γ−1 single-token steps, in loaded passes (`step`: as in
        `round_time`)."""
        if self.draft_cost is None:
            return 0.0
        step = self.draft_step() if step is None else step
        return self.draft_scale.value * self._draft_feed_s(fed) + (gamma - 1) * step

    @priced_once
    def _draft_feed_s(self, fed: int) -> float:
        """The draft's profiled passes that feed `fed` tokens, every drafting session's (no scale): one feed, whatever
        γ follows it (a decision prices every γ's catch-up after the same feed)."""
        sessions = self.draft_sessions.value
        return self.draft_cost.upper_bound_s(round(sessions * fed)) + sessions * self.feed_depth_s(self.draft_cost, fed)

    @priced_once
    def steady_draft_time(self, gamma: int, step: float | None = None) -> float:
        """The draft compute of a steady round of γ drafts: γ passes, the first of which feeds what the draft
        has not seen of the last round: its own last draft and the bonus token where every draft was accepted
        (probability α^γ, in rounds of γ), else the target's correction alone. Where a pass of 2 tokens costs
        1.7 of one (a draft at AVX2), pricing every pass as one token priced the drafting of a round of γ = 1
        at α 0.8 at 0.64 of its cost. `step`: `draft_step()`, where the caller has it."""
        if self.draft_cost is None or gamma == 0:
            return 0.0
        fed, sessions = 1.0 + self.acceptance.alpha ** gamma, self.draft_sessions.value
        first = pass_cost(self.draft_cost, sessions, self.draft_fill.value, fed) + \
            self.depth_s(self.draft_cost, sessions * fed)
        return self.draft_scale.value * first + (gamma - 1) * (self.draft_step() if step is None else step)

    def catch_up_time(self, gamma: int, unseen: int, step: float | None = None) -> float:
        """The extra draft compute of a round whose draft first feeds `unseen` tokens (its prompt, or what
        lookups or target-only rounds committed) where a steady round feeds one or two."""
        step = self.draft_step() if step is None else step
        return max(self.draft_time(unseen, gamma, step) - self.steady_draft_time(gamma, step), 0.0)

    def round_time(self, gamma: int, overlapped: bool | None = None, step: float | None = None) -> float:
        """T(γ), or T_o(γ) when `overlapped` (default: while `overlapping`); `step`: `draft_step()`, where the
        caller has it (every round prices every γ, twice or three times: once a step, not once a γ)."""
        return self._round_time(gamma, self.overlapping if overlapped is None else overlapped, step)

    @priced_once
    def _round_time(self, gamma: int, overlapped: bool, step: float | None) -> float:
        if overlapped and gamma > 0:
            return self.overlap_round_time(gamma, step)
        time = (self.rtt_target.value or 0.0) + self.verify_time(gamma)
        if gamma > 0:
            time += (self.rtt_draft.value or 0.0) + self.steady_draft_time(gamma, step)
        return time

    def hit_probability(self, gamma: int) -> float:
        """h(γ): every draft accepted and the bonus token guessed, so the next proposal is ready."""
        return self.acceptance.alpha ** gamma * self.guesses.alpha

    def overlap_round_time(self, gamma: int, step: float | None = None) -> float:
        """T_o(γ): a round of γ drafts whose verify runs beside the drafting of the next round's branch."""
        rtt_draft, step = self.rtt_draft.value or 0.0, self.draft_step() if step is None else step
        branch = rtt_draft + (self.contention_draft.value or 1.0) * (gamma + 1) * step
        verify = (self.rtt_target.value or 0.0) + self.target_contention() * self.verify_time(gamma)
        return max(branch, verify) + (1.0 - self.hit_probability(gamma)) * (rtt_draft + gamma * step)

    def target_contention(self) -> float:
        """κ_t, the target's slowdown beside a branch; until a verify overlapped, the draft's beside it (κ_d), or 1
        with neither: cores that slow the draft beside the target slow the target beside the draft. Priced at 1
        after a fixed γ's warm-up measured κ_d at 3.1 (services on the same 2 cores, Zen 1), a session's first
        round overlapped γ = 1 at a loss (κ_t then measured 1.26)."""
        kappa_t, kappa_d = self.contention_target.value, self.contention_draft.value
        return kappa_t if kappa_t is not None else kappa_d if kappa_d is not None else 1.0

    def rates(self, cap: int, overlapped: bool | None = None, steps: int = 1) -> dict[int, float]:
        """Expected tokens per second for γ = 0..cap (`overlapped`: as in `round_time`), γ = 0 in target-only
        rounds of `steps` steps (`plain_rate`)."""
        alpha, step = self.acceptance.alpha, self.draft_step()
        rates = {g: expected_tokens(alpha, g) / self.round_time(g, overlapped, step) for g in range(1, cap + 1)}
        return {0: self.plain_rate(steps), **rates}

    def plain_steps(self, limit: int | None = None) -> int:
        """k: the target steps one target-only round takes, as many as fit in `target_chunk_s` of expected
        compute; at least 1 (where one step is longer than the chunk, or chunking is off), at most
        1 + `MAX_EXTRA_STEPS` and `limit` (the tokens the round may still emit)."""
        step_s = self.target_time(1)
        if self.target_chunk_s <= 0 or step_s <= 0:
            return 1
        steps = min(int(self.target_chunk_s / step_s), MAX_EXTRA_STEPS + 1)
        return max(1, steps if limit is None else min(steps, limit))

    def plain_rate(self, steps: int = 1) -> float:
        """Expected tokens per second of target-only rounds of `steps` steps in one hop: k / (rtt + k·t_v(0))."""
        return steps / ((self.rtt_target.value or 0.0) + steps * self.verify_time(0))

    def rate(self, gamma: int, extra_s: float = 0.0, overlapped: bool | None = None) -> float:
        """Expected tokens per second of a round that drafts γ tokens with the draft model, costing
        `extra_s` more than a steady round (a draft catching up on tokens it has not seen);
        `overlapped`: as in `round_time`."""
        return expected_tokens(self.acceptance.alpha, gamma) / (self.round_time(gamma, overlapped) + extra_s)

    def catch_up_rate(self, gamma: int, unseen: int, useful: int | None, steady: float | None = None,
                      step: float | None = None, share: float = 1.0) -> float:
        """`rate(γ)` of a draft-model round whose draft must first feed `unseen` tokens (its prompt, or what
        lookups or target-only rounds committed) where a steady round feeds one or two: the feed's extra time,
        an investment, is spread over the rounds the draft can then serve. That is the `useful` tokens left
        (None: no bound) at a round's expected yield, but at most `CATCH_UP_ROUNDS` or the rounds that the tokens
        generated so far make, whichever is more: a generation that has run n tokens is expected to run about n
        more, so a long one buys the feed once what drafting would have saved pays for it (ski rental: it loses at
        most twice what a choice that knew the length would). Near a generation's end it is paid nearly whole.
        `steady`: `rate(γ)`, `step`: as in `round_time`, where the caller has them; `share`: of the feed's time that
        the generation pays (1: all of it, as a round's first pass)."""
        yield_ = expected_tokens(self.acceptance.alpha, gamma)
        served = max(CATCH_UP_ROUNDS, self.generated / yield_)
        if useful is not None:
            served = min(max(useful / yield_, 1.0), served)
        round_s = yield_ / (self.rate(gamma) if steady is None else steady)
        return yield_ / (round_s + share * self.catch_up_time(gamma, unseen, step) / served)

    def best_free(self, alpha: float, cap: int) -> tuple[int, float]:
        """The best γ ≤ cap for a proposer that costs no draft time and no hop (a lookup) whose tokens
        are accepted at rate α, and its expected tokens per second."""
        rtt = self.rtt_target.value or 0.0
        rates = {g: expected_tokens(alpha, g) / (rtt + self.verify_time(g)) for g in range(max(cap, 0) + 1)}
        best = max(rates, key=rates.get)
        return best, rates[best]

    def cost_ratio(self) -> float:
        """c = t_draft_step / t_target_step."""
        return self.draft_step() / self.verify_time(0)
