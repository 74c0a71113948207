"""The controller's running estimates: the per-size cost scales, and how sessions hand them on."""

import json

import pytest
from test_controller import ZEN1_DRAFT, ZEN1_TARGET, pin_alpha, timing

from specdec.core.rounds import PassLoad, RoundRecord
from specdec.planning.cost import CostProfile
from specdec.planning.estimates import FIRST_SAMPLES, SizeScales
from specdec.planning.prior import SharedPrior

PROFILE = CostProfile((0.10, 0.12, 0.14, 0.16, 0.18))


def test_a_size_never_measured_takes_the_scales_around_it():
    scales = SizeScales()
    assert scales.at(3, default=1.4) == 1.4, "nothing measured: the one scale of every size"
    scales.update(1, 1.3)
    assert scales.at(1, 2.0) == scales.at(5, 2.0) == 1.3, "one size measured: every size takes it"
    scales.update(5, 1.1)
    assert scales.at(3, 2.0) == pytest.approx(1.2) and scales.at(2, 2.0) == pytest.approx(1.25)
    assert scales.at(9, 2.0) == 1.1 and scales.at(0.5, 2.0) == 1.3, "past either end: the nearest size's"
    for sample in (1.15, 1.1, 1.0):  # the second and third keep the least; the fourth is averaged in
        scales.update(5, sample)
    assert scales.at(5, 2.0) == pytest.approx(0.7 * 1.1 + 0.3 * 1.0), "each size an average of its own samples"


def test_prices_follow_every_change_of_a_size():
    """`at` keeps its sizes' prices between changes (a round prices every γ): after each update, seed, absorb
    and load, and under another default, it prices as a copy that never priced anything before."""
    import copy
    import random

    rng, scales, other = random.Random(0), SizeScales(), SizeScales()
    other.update(4, 0.9)
    changes = [lambda: scales.update(rng.randint(1, 6), rng.uniform(0.8, 2.0)), lambda: scales.seed(other),
               lambda: scales.absorb(other), lambda: scales.load({str(rng.randint(1, 6)): rng.uniform(0.8, 2.0)})]
    for i in range(60):
        rng.choice(changes)()
        default = 1.5 if i % 10 == 9 else 1.0
        fresh = copy.deepcopy(scales)
        fresh._known = None
        sizes = (0.5, 1, 2.5, 4, 9)
        for own in (False, True):
            assert [scales.at(t, default, own) for t in sizes] == [fresh.at(t, default, own) for t in sizes]


def test_a_slow_first_sample_neither_lasts_nor_prices_its_size_out():
    """Noise only slows a pass: a size's first samples keep their least, so a slow first one is gone at the next
    sample (averaged in, it would weigh 0.7 and then 0.49). Until a size has three, the caller's default (the
    one scale) caps it, so a size that looked dear once is run, and measured, again."""
    scales = SizeScales()
    scales.update(2, 2.8)  # a scheduler's hiccup
    assert scales.at(2, 1.5) == 1.5 and scales.at(4, 1.5) == 1.5, "one sample: capped by the one scale"
    assert scales.at(2, 3.0) == 2.8, "never raised to it"
    scales.update(2, 1.05)
    assert scales.at(2, 1.5) == 1.05, "the second sample: the least so far"
    scales.update(2, 1.2)
    assert scales.at(2, 1.0) == 1.05, "three samples: its own, whatever the one scale"
    scales.update(2, 1.2)
    assert scales.at(2, 1.0) == pytest.approx(0.7 * 1.05 + 0.3 * 1.2)


def test_a_seed_holds_until_the_first_sample_of_its_size():
    prior = SizeScales()
    prior.update(1, 1.3)
    prior.update(3, 1.05)
    scales = SizeScales()
    scales.seed(prior)
    assert scales.at(1, 1.0) == 1.3 and scales.at(2, 1.0) == pytest.approx(1.175), "a seed is not capped"
    scales.update(1, 1.1)
    assert scales.at(1, 2.0) == 1.1, "a lower first sample replaces the seed"
    folded = SizeScales()
    folded.absorb(scales)
    assert folded.snapshot() == {"1": 1.1}, "a seed is no measurement: only measured sizes fold back"


def test_a_seed_counts_as_one_of_its_sizes_first_samples():
    """A size's first samples keep their least, and a seed (earlier sessions' scale) is one of them: a slower first
    sample does not replace it. Replaced whole, one pass slowed by another session's draft catching up on the same
    cores (a one-token step at 2.6x, 8 users on a Zen 1) priced a session's target-only rounds as a slower device's,
    and it drafted. A lasting slowdown is learned from the sample after `FIRST_SAMPLES`, as without a seed."""
    prior = SizeScales()
    prior.update(1, 1.1)
    scales = SizeScales()
    scales.seed(prior)
    for _ in range(FIRST_SAMPLES):
        scales.update(1, 2.6)
        assert scales.at(1, 3.0) == 1.1
    scales.update(1, 2.6)
    assert scales.at(1, 3.0) == pytest.approx(0.7 * 1.1 + 0.3 * 2.6)
    folded = SizeScales()
    folded.absorb(scales)
    assert folded.snapshot() == {"1": pytest.approx(0.7 * 1.1 + 0.3 * 2.6)}, "measured once sampled"


def test_a_seed_is_priced_at_the_sessions_level_never_above_its_own():
    """`level`: the lower median, over the sizes a session measured, of its scale over its seeds' there (the
    seeds interpolated); at most 1. Sizes it measured keep their own scales."""
    prior = SizeScales()
    for size, scale in ((1, 1.5), (3, 1.2), (5, 1.0)):
        prior.update(size, scale)
    scales = SizeScales()
    scales.seed(prior)
    assert scales.level() == 1.0 and scales.at(1, 1.0, at_own_level=True) == 1.5, "nothing measured yet"
    scales.update(2, 0.9)  # against a seed of 1.35 there
    assert scales.level() == pytest.approx(0.9 / 1.35)
    assert scales.at(1, 1.0, at_own_level=True) == pytest.approx(1.5 * 0.9 / 1.35)
    assert scales.at(1, 1.0) == 1.5, "only where asked"
    assert scales.at(2, 1.0, at_own_level=True) == 0.9, "a measured size is its own"
    scales.update(5, 1.0)
    scales.update(3, 1.2)
    assert scales.level() == pytest.approx(1.0), "the lower median of 0.67, 1 and 1"
    slower = SizeScales()
    slower.seed(prior)
    for _ in range(FIRST_SAMPLES + 3):
        slower.update(5, 1.6)
    assert slower.level() == 1.0 and slower.at(1, 1.0, at_own_level=True) == 1.5, "never raised"


def round_at(tokens: int, seconds: float) -> RoundRecord:
    """A round whose one target pass of `tokens` tokens took `seconds` (every draft accepted; no draft time)."""
    return timing(tokens - 1, tokens - 1, 0.0, 0.0, seconds, seconds, target_load=PassLoad(tokens=tokens))


def test_sessions_hand_their_per_size_scales_on_and_orchestrators_share_them():
    """A finished session's per-size scales seed the next session's, through `SharedPrior` and through the
    snapshot another orchestrator adopts (JSON, as Redis keeps it); a seed gives way to the session's first
    sample of that size."""
    prior = SharedPrior(gamma_max=4)
    first = prior.new_controller(PROFILE)
    for _ in range(4):
        first.observe(round_at(1, 0.13))  # target-only: 1.3× the profile
        first.observe(round_at(3, 0.147))  # a verify of 3: 1.05×
    prior.absorb(first)
    second = prior.new_controller(PROFILE)
    assert second.verify_time(0) == pytest.approx(0.13) and second.verify_time(2) == pytest.approx(0.147)
    assert second.verify_time(1) == pytest.approx(0.12 * 1.175), "between measured sizes: interpolated"
    other = SharedPrior(gamma_max=4)
    other.load(json.loads(json.dumps(prior.snapshot())))
    assert other.new_controller(PROFILE).verify_time(0) == pytest.approx(0.13)
    second.observe(round_at(1, 0.11))
    assert second.verify_time(0) == pytest.approx(0.11) and second.verify_time(2) == pytest.approx(0.147)


def test_a_step_seeded_in_a_slow_minute_is_priced_at_the_sessions_own_level():
    """The bench's warm-up ran its first minute slow (target steps at 1.6x); the prior's one-token scale still
    held most of that after one target-only reply at 1.0x, and the next adaptive session was handed ĉ 0.185
    where target-only measured 0.30 (Zen 1). Drafting, it never ran a one-token pass, so never measured that seed,
    and it drafted at a loss. The sizes a session has measured say where it stands against its seeds: a seed it
    has not measured is priced at that level (never above its own), so target-only is tried, and measured."""
    prior = SharedPrior(gamma_max=8)
    step, draft_s = ZEN1_TARGET.forward_s(1), ZEN1_DRAFT.forward_s(1)

    def session(scale: float, rounds: int, gamma: int = 0) -> None:
        ctl = prior.new_controller(ZEN1_TARGET, ZEN1_DRAFT)
        verify_s = scale * ZEN1_TARGET.forward_s(gamma + 1)
        for _ in range(rounds):
            ctl.observe(timing(gamma, gamma, gamma * draft_s, gamma * draft_s, verify_s, verify_s,
                               target_load=PassLoad(tokens=gamma + 1)))
        prior.absorb(ctl)

    session(1.6, 2, gamma=3)  # the warm-up: its draft at its profile, the target slow
    for _ in range(6):
        session(1.6, 12)
    session(1.0, 64)  # a target-only reply once the host is back
    ctl = pin_alpha(prior.new_controller(ZEN1_TARGET, ZEN1_DRAFT), 0.88)
    assert ctl.verify_time(0) > 1.4 * step, "the slow minute still in the seed"
    ctl.observe(timing(1, 1, draft_s, draft_s, ZEN1_TARGET.forward_s(2), ZEN1_TARGET.forward_s(2),
                       target_load=PassLoad(tokens=2)))  # a verify of 2 at its profiled time: the host is back
    assert ctl.verify_time(0) == pytest.approx(step, rel=0.05)
    assert ctl.verify_time(1) == pytest.approx(ZEN1_TARGET.forward_s(2)), "a measured size is its own"
    assert ctl.choose(max_useful=40) == 0
    for _ in range(FIRST_SAMPLES):  # measured: its own samples from here on
        ctl.observe(timing(0, 0, 0.0, 0.0, 1.2 * step, 1.2 * step))
    assert ctl.verify_time(0) == pytest.approx(1.2 * step)
