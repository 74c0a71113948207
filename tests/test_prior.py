"""What a model pair's shared prior hands from session to session when the workload changes under it."""

import dataclasses
import random

import pytest

from orchestrator.generation import Generation
from orchestrator.request import GenerationRequest
from specdec.core.params import SamplingParams
from specdec.core.rounds import PassLoad, RoundRecord
from specdec.planning.controller import GammaController
from specdec.planning.prior import REGIMES, SharedPrior, sampling_regime
from test_controller import STEP, flat, linear, timing


# A draft step at 0.3 of the target's: speculation loses at α 0.2 and pays at α 0.9.
TARGET, DRAFT = flat(STEP), flat(0.3 * STEP)


def session(prior: SharedPrior, alpha: float, tokens: int, rng: random.Random, regime: str = "") -> tuple[int, int]:
    """One generation of `tokens` tokens whose drafts are each accepted with probability `alpha` (until the
    first rejection), by a draft confident enough to draft on to the controller's limit (as a code completion's
    does), its rounds costing what the profiles say. Returns (tokens from rounds that drafted, rounds)."""
    ctl: GammaController = prior.new_controller(TARGET, DRAFT, regime)
    emitted = drafted_tokens = rounds = 0
    while emitted < tokens:
        cap = tokens - emitted - 1
        gamma = ctl.choose(max_useful=cap)
        gamma = ctl.draft_limit(gamma, min(cap, ctl.gamma_max))
        accepted = 0
        while accepted < gamma and rng.random() < alpha:
            accepted += 1
        draft_s, target_s = gamma * DRAFT.forward_s(1), TARGET.forward_s(gamma + 1)
        ctl.observe(timing(gamma, accepted, draft_s, draft_s, target_s, target_s))
        emitted += accepted + 1
        drafted_tokens += (accepted + 1) * (gamma > 0)
        rounds += 1
    prior.absorb(ctl)
    return drafted_tokens, rounds


def recovery(seed: int, sessions: int = 24) -> tuple[list[float], int]:
    """After a burst of 8 sessions at α 0.2, `sessions` sessions at α 0.9: each one's share of tokens from rounds
    that drafted, and how many sessions passed before one drafted most of its tokens (`sessions` if none did)."""
    rng = random.Random(seed)
    prior = SharedPrior(gamma_max=8)
    for _ in range(8):
        session(prior, 0.2, 40, rng)
    low = prior.new_controller(TARGET, DRAFT)
    assert low.choose() == 0 and low.probe_interval > 16, "the burst taught γ = 0 and a longer wait"
    prior.absorb(low)
    shares = [session(prior, 0.9, 40, rng)[0] / 40 for _ in range(sessions)]
    return shares, next((i for i, share in enumerate(shares) if share > 0.8), sessions)


def test_short_sessions_win_speculation_back_after_a_burst_taught_a_low_alpha():
    """A burst of sessions whose drafts were rarely accepted (a hot sampling temperature) teaches the prior a low α
    and a long wait between probes. Sessions that follow, of 40 tokens each, at α 0.9, must probe (the steps since
    the last probe carry from session to session, or none of them reaches the wait) and win speculation back
    within a few sessions (each probe's measured α moves the prior, not the estimate that holds the low prior
    itself), and keep it. Measured before: an orchestrator's greedy code completions drafted nothing for hundreds
    of tokens after a few chats at temperature 1. Eight seeds: a probe whose first draft is rejected (one in ten)
    doubles the wait, so some take longer."""
    runs = [recovery(seed) for seed in range(8)]
    firsts = sorted(first for _, first in runs)
    assert firsts[-1] < 24 and firsts[5] <= 8, f"sessions before speculation came back, per seed: {firsts}"
    for shares, first in runs:
        assert min(shares[first:]) > 0.8, f"speculation kept once it came back: {shares}"


def drafting_round(draft_wall_s: float, sessions: int = 1, opened: bool = False) -> RoundRecord:
    """A round of 3 drafts, 2 accepted, its draft hop `draft_wall_s` long (3 draft steps of it compute), on
    services that serve `sessions` sessions in each pass."""
    draft_s, target_s = 3 * DRAFT.forward_s(1), TARGET.forward_s(4)
    record = timing(3, 2, draft_wall_s, draft_s, target_s + 0.001, target_s,
                    target_load=PassLoad(sessions, sessions, 4 * sessions),
                    draft_load=PassLoad(sessions, sessions, sessions))
    return dataclasses.replace(record, draft_opened=opened)


def test_a_stall_in_a_drafting_round_is_not_the_next_sessions_draft_hop():
    """The draft hop is measured only in rounds that draft, so a hop read too long prices the draft model out for
    good. A session's first drafting round opens the draft's session (its stream, its grammar: 2.5 s for the first
    JSON schema of a process, measured), which is no network sample; and a stall in a later session's first
    drafting round is bounded by the hop handed on, as it is within a session. Measured before: one structured
    output request made every later session of the orchestrator target-only (draft hop 2.46 s, then 0.74 s)."""
    prior = SharedPrior(gamma_max=8)
    first = prior.new_controller(TARGET, DRAFT)
    draft_s = 3 * DRAFT.forward_s(1)
    first.observe(drafting_round(draft_s + 2.5, opened=True))
    assert first.rtt_draft.value is None, "the opening is not the network"
    for _ in range(4):
        first.observe(drafting_round(draft_s + 0.001))
    prior.absorb(first)
    second = prior.new_controller(TARGET, DRAFT)
    assert second.rtt_draft.value == pytest.approx(0.001)
    second.observe(drafting_round(draft_s + 2.5))
    assert second.rtt_draft.value == pytest.approx(2 * 0.001 + 0.002), "a stall counts as twice the hop, plus 2 ms"
    assert second.choose() > 0


def test_a_lone_session_after_a_burst_prices_the_draft_as_its_own():
    """When a burst's sessions have all ended, a lone session prices the draft's passes as its own, not as the
    burst's 8 sessions' (which it would never measure again: the draft's load is measured in rounds that draft);
    a new burst's sessions, joining, price them as theirs."""
    prior = SharedPrior(gamma_max=8)
    burst = [prior.new_controller(TARGET, DRAFT) for _ in range(8)]
    for ctl in burst:
        ctl.observe(drafting_round(3 * DRAFT.forward_s(1) + 0.001, sessions=8))
    assert burst[0].draft_sessions.value == pytest.approx(8)
    for ctl in burst:
        prior.absorb(ctl)
    lone = prior.new_controller(TARGET, DRAFT)
    assert lone.draft_sessions.value == 1 and lone.target_sessions.value == 1
    others = [prior.new_controller(TARGET, DRAFT) for _ in range(3)]
    assert lone.draft_sessions.value == 4, "sessions that join price the draft as theirs until one measures it"
    for ctl in [lone, *others]:
        prior.absorb(ctl)


def test_through_the_services_only_the_drafts_opening_round_says_it_opened(stack):
    """A generation's first drafting round opens the draft's session in its hop, and says so; no other round does
    (the controller then learns the draft hop from the second drafting round on)."""
    servicer = stack.orchestrator.servicer
    ctl = GammaController(8, TARGET, DRAFT)
    request = GenerationRequest([7, 8, 9, 10, 11] * 3, 16, SamplingParams(), gamma=2, proposer="model",
                                overlap="off", ignore_eos=True)
    generation = Generation(request, servicer.drafts, servicer.target, servicer.tokenizer, frozenset(),
                            servicer.max_context, ctl)
    records = [chunk.record for chunk in generation.run()]
    drafting = [r for r in records if r.drafted > 0]
    assert len(drafting) >= 3 and drafting[0].draft_opened, records
    assert not any(r.draft_opened for r in drafting[1:]), "only the opening round"
    assert ctl.rtt_draft.value is not None and ctl.rtt_draft.value < 0.5


def test_hot_sampled_sessions_do_not_price_greedy_ones():
    """α's prior is kept per sampling regime: a burst of chats at temperature 1 (α 0.2) leaves greedy sessions
    (α 0.9 before it) drafting from their first round; each regime's sessions start from their own."""
    assert [sampling_regime(t) for t in (0.0, 0.3, 0.7, 1.0, 1.5)] == ["greedy", "t<=0.5", "t<=1", "t<=1", "t>1"]
    rng = random.Random(0)
    prior = SharedPrior(gamma_max=8)
    for _ in range(4):
        session(prior, 0.9, 40, rng, "greedy")
    for _ in range(8):
        session(prior, 0.2, 40, rng, "t<=1")
    greedy, hot, cool = (prior.new_controller(TARGET, DRAFT, regime) for regime in ("greedy", "t<=1", "t<=0.5"))
    assert greedy.acceptance.alpha > 0.8 and greedy.choose() > 0
    assert hot.acceptance.alpha < 0.4 and hot.choose() == 0
    assert cool.untried(), "a regime no session measured is measured afresh"
    for ctl in (greedy, hot, cool):
        prior.absorb(ctl)


def test_the_prior_per_regime_survives_a_snapshot_and_takes_an_older_one():
    """Between orchestrators (through Redis) each regime's α travels; an older orchestrator's one α seeds all."""
    rng = random.Random(1)
    prior = SharedPrior(gamma_max=8)
    session(prior, 0.9, 40, rng, "greedy")
    session(prior, 0.2, 40, rng, "t>1")
    other = SharedPrior(gamma_max=8)
    other.load(prior.snapshot())
    assert other.snapshot() == prior.snapshot() and set(prior.snapshot()["alpha"]) == {"greedy", "t>1"}
    older = SharedPrior(gamma_max=8)
    older.load({"alpha": 0.75})
    seeded = [older.new_controller(TARGET, DRAFT, regime).acceptance.alpha for regime in REGIMES]
    assert seeded == pytest.approx([0.75] * len(REGIMES))


def controllers_made(stack, monkeypatch, field: str, requests: list[dict]) -> list:
    """`field` of each controller the orchestrator's prior makes for `requests` (`make_request`'s arguments), run
    one after another through the services."""
    from specdec.cli.client import generate, make_request

    prior, seen = stack.orchestrator.servicer.prior, []
    new_controller = prior.new_controller

    def spy(*args, **kwargs):
        controller = new_controller(*args, **kwargs)
        seen.append(getattr(controller, field))
        return controller

    monkeypatch.setattr(prior, "new_controller", spy)
    for request in requests:
        generate(stack.endpoint, make_request(prompt="abc", max_new_tokens=4, seed=1, **request))
    return seen


def test_through_the_services_a_session_draws_on_its_temperatures_prior(stack, monkeypatch):
    """The orchestrator seeds each session's controller from the prior of the request's sampling regime."""
    requests = [{"temperature": t} for t in (0.0, 1.5, 0.7)]
    assert controllers_made(stack, monkeypatch, "regime", requests) == ["greedy", "t>1", "t<=1"]


def test_a_burst_after_a_burst_has_one_session_due_a_probe_not_every_one():
    """The steps toward a probe that a finished session leaves go to the next session alone. Handed to every session
    of a burst, they made all of them due a probe in their first rounds (8 users on a Zen 1: 4 probes at once
    scattered the target's passes, target-only then looked slow, and most of the burst drafted: 0.92x batched
    target-only). A probe is spread over the sessions as before: each counts its own steps from then on."""
    draft = linear(0.3 * STEP / 8)  # a CPU's: a catch-up's passes cost by the token
    prior = SharedPrior(gamma_max=8)
    session(prior, 0.2, 40, random.Random(0))  # measures α: the probes below are not a first measurement's
    burst = [prior.new_controller(TARGET, draft) for _ in range(8)]
    for unseen in range(10, 300):  # target-only rounds of 8 sessions in full passes; the draft falls behind
        for ctl in burst:
            assert ctl.choose(unseen=unseen) == 0, "a probe that would catch up on the whole generation is too dear"
            ctl.observe(timing(0, 0, 0.0, 0.0, STEP + 0.001, STEP, target_load=PassLoad(8, 8, 8)))
    assert burst[-1].steps_without_draft >= 8 * burst[-1].probe_interval, "the last session ends due a probe"
    for ctl in burst:
        prior.absorb(ctl)
    following = [prior.new_controller(TARGET, draft) for _ in range(8)]
    probes = []
    for ctl in following:  # their draft has a 10-token prompt to feed
        ctl.choose(unseen=10)
        probes.append(ctl.probing)
    assert probes == [True] + [False] * 7, probes
    for ctl in following:
        prior.absorb(ctl)


def test_a_fixed_gammas_steps_earn_no_probe():
    """A probe's loss falls on the session that probes, so only sessions that choose γ count steps toward it: a
    request with a fixed γ of 0 (the bench's target-only replies, run between its adaptive ones) takes none and
    hands none on, and one with a fixed γ that drafted measured α as a probe would: the count goes on from its
    last draft. An adaptive session takes the count, as before."""
    prior = SharedPrior(gamma_max=8)
    session(prior, 0.2, 40, random.Random(0))  # measures α

    def plain(ctl: GammaController, steps: int) -> GammaController:
        for _ in range(steps):
            ctl.observe(timing(0, 0, 0.0, 0.0, STEP, STEP))
        prior.absorb(ctl)
        return ctl

    left = plain(prior.new_controller(TARGET, DRAFT), 10).steps_without_draft
    fixed = prior.new_controller(TARGET, DRAFT, adaptive=False)
    assert fixed.steps_without_draft == 0 and not fixed.adaptive
    plain(fixed, 64)
    handed = prior.new_controller(TARGET, DRAFT)
    assert handed.steps_without_draft == left, "a fixed γ of 0 hands nothing on"
    plain(handed, 5)
    drafting = prior.new_controller(TARGET, DRAFT, adaptive=False)
    drafting.observe(timing(2, 2, 2 * DRAFT.forward_s(1), 2 * DRAFT.forward_s(1), TARGET.forward_s(3),
                            TARGET.forward_s(3)))
    plain(drafting, 3)
    assert prior.new_controller(TARGET, DRAFT).steps_without_draft == 3, "from a fixed γ's last draft"


def test_through_the_services_a_fixed_gamma_makes_no_adaptive_session(stack, monkeypatch):
    """The orchestrator tells the prior which sessions choose γ: those whose request fixes none."""
    requests = [{"gamma": g} for g in (0, None, 2)]
    assert controllers_made(stack, monkeypatch, "adaptive", requests) == [False, True, False]
