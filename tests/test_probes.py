"""Probes: while target-only wins, the γ controller drafts now and then to refresh α, when a probe is due (target
steps since the last draft) and affordable (its expected loss, the draft's catch-up included, within a share of the
target-only time since the last one)."""

import dataclasses
import math

import pytest

from specdec.core.rounds import ALPHA_MAX
from specdec.planning.controller import MIN_PROBE_SHARE, PROBE_SHARE, TRIAL_SHARE, GammaController
from specdec.planning.cost import CostProfile
from specdec.planning.prior import SharedPrior
from test_controller import STEP, controller, flat, linear, pin_alpha, run_rounds, timing


def test_settles_at_zero_and_probes_ever_more_rarely():
    ctl = controller(alpha=0.9, draft_step=0.01, target=linear())
    chosen = run_rounds(ctl, 0.9, 600)
    probes = [i for i, g in enumerate(chosen) if g > 0]
    assert chosen[:16] == [0] * 16
    flagged = controller(alpha=0.9, draft_step=0.01, target=linear())
    flags = []
    for _ in range(100):
        flags.append((run_rounds(flagged, 0.9, 1)[0], flagged.probing))
    assert [g > 0 for g, _ in flags] == [probing for _, probing in flags], "each probe, and only a probe, says so"
    assert 3 <= len(probes) <= 8, f"probes at {probes}"
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and gaps[-1] >= 128, "each probe that changes nothing doubles the wait"


def test_a_probe_of_one_token_hands_its_alpha_on_by_its_share():
    """A session whose only model round was a probe of γ = 1 measured α: the next session's α is no longer
    untried (so it is not measured again whatever the draft's catch-up costs), and a later probe moves the
    prior by a quarter of a session that measured 4 tokens or more, toward what the probe measured (its one
    token accepted), not toward the session's estimate, which holds the prior it was handed."""
    prior = SharedPrior(gamma_max=8)
    first = prior.new_controller(linear(), flat(0.01))
    assert first.untried()
    first.observe(timing(1, 0, 0.01, 0.01, 2 * STEP, 2 * STEP))
    prior.absorb(first)
    second = prior.new_controller(linear(), flat(0.01))
    assert not second.untried() and second.acceptance.alpha == pytest.approx(first.acceptance.alpha)
    second.observe(timing(1, 1, 0.01, 0.01, 2 * STEP, 2 * STEP))
    prior.absorb(second)
    step = 0.3 * (ALPHA_MAX - first.acceptance.alpha)
    assert prior.new_controller(linear()).acceptance.alpha == pytest.approx(first.acceptance.alpha + step / 4)


def test_the_wait_between_probes_outlives_a_session():
    """A session where speculation never paid hands its wait between probes to the next, and its steps since its
    last probe (the next one then first probes after 64 steps in all, not 16 of its own); a session whose probe
    found γ > 0 best hands on the short wait."""
    prior = SharedPrior(gamma_max=8)

    def session(alpha: float, rounds: int, target: CostProfile = linear()) -> list[int]:
        ctl = pin_alpha(prior.new_controller(target, flat(0.01)), alpha)
        chosen = run_rounds(ctl, alpha, rounds)
        prior.absorb(ctl)
        return chosen

    first = session(0.9, 60)  # probes after 16 and 32 more steps: γ = 0 still best, the wait is now 64
    assert [i for i, g in enumerate(first) if g > 0] == [16, 49], first
    second = session(0.9, 80)
    # the first ran 10 steps after its last probe (round 49 of 60)
    assert [i for i, g in enumerate(second) if g > 0] == [64 - 10], "it starts where the first one left"
    assert session(0.9, 3, flat())[0] > 0  # speculation pays (a verify costs one step): γ > 0 at once, the wait back to 16
    assert [i for i, g in enumerate(session(0.9, 20)) if g > 0] == [16]


def test_probes_count_target_steps_not_rounds():
    """A target-only round of k steps brings the next probe k steps closer, as k one-step rounds would."""
    ctl = controller(alpha=0.2, draft_step=0.05)
    ctl.probe_every = 16
    plain = dataclasses.replace(timing(0, 0, 0, 0, 8 * STEP, 8 * STEP), target_passes=8)
    assert ctl.choose() == 0
    ctl.observe(plain)
    assert ctl.choose() == 0
    ctl.observe(plain)
    assert ctl.choose() > 0 and ctl.probing, "16 steps in two rounds"


def test_a_probe_waits_until_the_drafts_catch_up_is_affordable():
    """While target-only wins, a due probe whose draft must first feed every token since it last drafted waits
    until its expected loss against target-only decoding is at most `PROBE_SHARE` of the target-only time
    since the last probe (a draft at 0.2 of a step, 90 tokens behind: 18 steps of catch-up, so some 600
    steps); one in step with the committed tokens probes when due, as before. An α never measured is probed
    when due whatever the catch-up costs where no count of tokens left bounds it (with one: the next test)."""

    def first_probe(unseen: int, measured: bool = True) -> int:
        ctl = pin_alpha(GammaController(8, linear(), linear(0.02)), 0.9)
        ctl.alpha_from_prior = measured
        for step in range(2000):
            if ctl.choose(unseen=unseen) > 0:
                assert ctl.probing
                return step
            ctl.observe(timing(0, 0, 0.0, 0.0, STEP, STEP))
        return -1

    assert first_probe(1) == 16
    ctl = pin_alpha(GammaController(8, linear(), linear(0.02)), 0.9)
    loss = ctl.probe_loss(1, 90, ctl.rate(0))
    assert loss > 1.8 and ctl.probe_loss(1, 1, ctl.rate(0)) < PROBE_SHARE * 16 * STEP
    assert first_probe(90) == math.ceil(loss / (PROBE_SHARE * STEP))
    assert first_probe(90, measured=False) == 16


def test_a_declined_probe_leaves_the_session_at_rest_until_its_allowance_reaches_that_loss():
    """A due probe declined for what it would lose is not priced again until the allowance has grown to that loss,
    and the session is at rest meanwhile (`settled` may skip its pricing). With the draft falling a token further
    behind every round, so that the loss only grows, the probe still comes at the very step at which pricing every
    round would have taken it, after a small fraction of the pricings. (A lag that grew a token a round here, 0.2
    steps of catch-up, would outgrow the allowance's 1/32 of a step for good: then no probe comes either way.)"""

    def first_probe(deferred: bool) -> tuple[int, int]:
        ctl = pin_alpha(GammaController(8, linear(), linear(0.02)), 0.9)
        ctl.alpha_from_prior = True
        priced = 0
        for step in range(5000):
            if not deferred:
                ctl._declined_loss = None  # as before: every due round prices the probe again
            unseen = 90 + step // 20  # a token further behind every 20 rounds
            if not ctl.settled(8, {}, unseen, None):
                priced += 1
                if ctl.choose(unseen=unseen) > 0:
                    return step, priced
            ctl.observe(timing(0, 0, 0.0, 0.0, STEP, STEP))
        return -1, priced

    (step, priced), (step_before, priced_before) = first_probe(True), first_probe(False)
    assert step == step_before > 100 and priced_before > 100, (step, step_before, priced_before)
    assert priced < priced_before / 10, (priced, priced_before)


def test_probes_that_change_nothing_halve_their_share_and_one_that_pays_restores_it():
    """Each probe in a row that leaves target-only best may lose half the share of the time since the last one
    that the one before it could, down to `MIN_PROBE_SHARE`: a draft 90 tokens behind probes after n, 2n, 4n and
    4n steps. Over a long generation where speculation never pays, probes lose at most a little more than that
    floor's share of the time. A round that drafts because speculation pays (α rose) restores `PROBE_SHARE`."""
    ctl = pin_alpha(GammaController(8, flat(), linear(0.02)), 0.1)
    ctl.alpha_from_prior = True
    loss = ctl.probe_loss(1, 90, ctl.rate(0))
    needed = [math.ceil(loss / (PROBE_SHARE / halved * STEP)) for halved in (1, 2, 4)]
    assert needed[0] > ctl.max_probe_every, "the share, not the interval, sets when a probe comes"
    probes, lost = [], 0.0
    for step in range(20_000):
        if ctl.choose(unseen=90) > 0:
            assert ctl.probing
            probes.append(step)
            lost += loss
        ctl.observe(timing(0, 0, 0.0, 0.0, STEP, STEP))
    gaps = [b - a for a, b in zip([0] + probes, probes)]  # steps without a draft when each probe came
    assert gaps[:4] == needed + needed[-1:] and set(gaps[3:]) == {needed[-1]}
    assert lost / (20_000 * STEP) < 1.25 * MIN_PROBE_SHARE < PROBE_SHARE / 3
    pin_alpha(ctl, 0.9)  # speculation now pays: the next choice drafts, and a later γ = 0 stretch starts afresh
    assert ctl.choose(unseen=1) > 0 and ctl.probe_share() == PROBE_SHARE


def test_an_untried_draft_is_measured_first_only_where_its_catch_up_is_affordable():
    """While the draft model's α is the guess, a due probe measures it whatever it is priced at, where the draft's
    extra feed is at most `TRIAL_SHARE` of the target-only time of the tokens left (a draft at 0.2 of a step, 100
    tokens left: about 126 tokens to feed). Past that (a long prompt's first request) the probe waits as a measured
    α's does, for a session with less to feed. With no count of tokens left, any feed; a measured α, never."""
    ctl = GammaController(8, linear(), linear(0.02))
    budget = TRIAL_SHARE * 100 * ctl.verify_time(0)
    near = max(unseen for unseen in range(1, 1000) if ctl.catch_up_time(1, unseen) <= budget)
    assert ctl.untried() and 100 < near < 150
    assert ctl.trial_affordable(1, near, 100) and not ctl.trial_affordable(1, near + 1, 100)
    assert ctl.trial_affordable(1, 10_000), "no count of tokens left: any feed"

    def first_probe(unseen: int) -> int:
        fresh = GammaController(8, linear(), linear(0.02))
        for step in range(400):
            if fresh.choose(100, unseen=unseen) > 0:
                return step
            fresh.observe(timing(0, 0, 0.0, 0.0, STEP, STEP))
        return -1

    assert first_probe(near) == 16, "affordable: the first due probe measures it"
    assert first_probe(10 * near) == -1, "a long prompt's feed: not within 400 steps"
    measured = pin_alpha(GammaController(8, linear(), linear(0.02)), 0.7)
    measured.alpha_from_prior = True
    assert not measured.trial_affordable(1, 1, 100)
