"""γ controller and cost model on synthetic costs."""

import pytest

from specdec.controller import GammaController, RoundTiming, expected_tokens, theorem_speedup


def trained(alpha: float, draft_step: float, rtt: float, verify_base: float = 0.1, verify_slope: float = 0.01,
            gamma_max: int = 8) -> GammaController:
    ctl = GammaController(gamma_max, prior_alpha=alpha)
    ctl.acceptance.prior_weight = 1e6  # pin α to the synthetic value
    for gamma in (1, 3, 5):
        accepted = gamma - 1
        verify = verify_base + verify_slope * (gamma + 1)
        ctl.observe(RoundTiming(gamma, accepted, draft_step * gamma + rtt, draft_step * gamma, verify + rtt, verify))
    return ctl


def test_expected_tokens():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert theorem_speedup(0.8, 3, 0.1) == pytest.approx(expected_tokens(0.8, 3) / 1.3)


def test_gamma_rises_with_alpha():
    chosen = [trained(a, 0.01, 0.0).choose() for a in (0.3, 0.6, 0.8, 0.95)]
    assert chosen == sorted(chosen) and chosen[-1] > chosen[0]


def test_gamma_falls_with_draft_cost():
    chosen = [trained(0.8, d, 0.0).choose() for d in (0.002, 0.01, 0.03, 0.06)]
    assert chosen == sorted(chosen, reverse=True) and chosen[0] > chosen[-1]


def test_gamma_zero_when_alpha_below_cost_ratio():
    ctl = trained(alpha=0.1, draft_step=0.05, rtt=0.0)  # c = 0.05/0.11 ≈ 0.45 > α
    assert ctl.choose() == 0


def test_network_rtt_to_draft_counts():
    near, far = trained(0.7, 0.005, rtt=0.0), trained(0.7, 0.005, rtt=0.0)
    far.rtt_draft.value = 0.5
    assert far.round_time(2) - near.round_time(2) == pytest.approx(0.5)
    assert far.round_time(0) == pytest.approx(near.round_time(0)), "γ=0 skips the draft hop"
    assert far.choose() < near.choose(), "a distant draft is used less"


def test_bounds_and_probe():
    ctl = trained(0.99, 0.0001, 0.0, gamma_max=4)
    assert ctl.choose() == 4 and ctl.choose(max_useful=2) == 2 and ctl.choose(max_useful=0) == 0
    low = trained(0.05, 0.05, 0.0)
    for _ in range(low.probe_every):
        assert low.choose() == 0
        low.observe(RoundTiming(0, 0, 0.0, 0.0, 0.1, 0.1))
    assert low.choose() == 1, "after a streak of target-only rounds the controller probes the draft"


def test_measured_verify_time_beats_the_linear_fit():
    ctl = GammaController(8)
    for n_tokens, seconds in ((1, 0.38), (2, 0.386), (4, 0.72)):
        ctl.observe(RoundTiming(n_tokens - 1, 0, 0.1, 0.1, seconds, seconds))
    assert ctl.verify_time(1) == pytest.approx(0.386)
    assert ctl.verify_time(2) > ctl.verify_time(1), "an unmeasured size is interpolated from the fit"


def test_catch_up_rounds_do_not_inflate_draft_cost():
    ctl = trained(0.8, 0.01, 0.0)
    before = ctl.draft_step.value
    ctl.observe(RoundTiming(1, 1, 0.5, 0.5, 0.1, 0.1, draft_steady=False))  # draft fed many tokens
    assert ctl.draft_step.value == before


def test_early_stop_threshold_rises_with_draft_cost():
    cheap, dear = trained(0.8, 0.005, 0.0), trained(0.8, 0.05, 0.0)
    assert 0 < cheap.confidence_threshold() < dear.confidence_threshold() <= 0.9
    assert GammaController(4).confidence_threshold() == 0.0, "no threshold before anything is measured"


def test_shared_prior_hands_costs_and_alpha_to_new_sessions():
    from specdec.controller import SharedPrior

    prior = SharedPrior(gamma_max=8)
    fresh = prior.new_controller()
    assert fresh.draft_step.value is None and fresh.choose() == fresh.initial_gamma
    prior.absorb(trained(0.95, 0.005, 0.0))
    informed = prior.new_controller()
    assert informed.draft_step.value == pytest.approx(0.005)
    assert informed.acceptance.alpha > 0.9, "α learned by earlier sessions becomes the prior"
    assert informed.choose() == trained(0.95, 0.005, 0.0).choose(), "no cold start: it decides from measurements"
    informed.observe(RoundTiming(3, 0, 0.1, 0.1, 0.1, 0.1))
    assert prior.new_controller().acceptance.accepted == 0, "sessions do not share mutable state"
    assert informed.draft_step.weight == GammaController(8).draft_step.weight, "sessions keep their own smoothing"


def test_verify_time_stays_positive_below_the_measured_sizes():
    """Seen on the real pair: a steep line through 3 and 4 tokens went negative at 1 token."""
    ctl = GammaController(8)
    ctl.observe(RoundTiming(2, 2, 0.3, 0.3, 0.45, 0.45))
    ctl.observe(RoundTiming(3, 3, 0.4, 0.4, 0.72, 0.72))
    assert 0 < ctl.verify_time(0) < ctl.verify_time(2) < ctl.verify_time(3) <= ctl.verify_time(5)
    assert 0.0 <= ctl.confidence_threshold() <= 0.9
    assert ctl.round_time(0) > 0


def test_a_stale_slow_verify_measurement_is_explored_again():
    """The shared prior says 4 tokens cost 1.2 s (measured once, in a slow minute). The session
    starts below the optimum, explores γ+1 now and then, and its first fresh measurement replaces
    the stale one, so it climbs to the true optimum."""
    from specdec.controller import SharedPrior

    true_verify = {1: 0.38, 2: 0.39, 3: 0.40, 4: 0.42, 5: 0.44, 6: 0.46, 7: 0.48}
    prior = SharedPrior(gamma_max=6)
    earlier = prior.new_controller()
    for timing in [RoundTiming(0, 0, 0.0, 0.0, 0.38, 0.38), RoundTiming(1, 1, 0.16, 0.16, 0.39, 0.39),
                   RoundTiming(3, 3, 0.48, 0.48, 1.2, 1.2)] * 3:
        earlier.observe(timing)
    prior.absorb(earlier)
    ctl = prior.new_controller()
    ctl.acceptance = type(ctl.acceptance)(prior_alpha=0.98, prior_weight=1e6)
    chosen = []
    for _ in range(40):
        gamma = ctl.choose()
        chosen.append(gamma)
        ctl.observe(RoundTiming(gamma, gamma, 0.16 * gamma, 0.16 * gamma, true_verify[gamma + 1],
                                true_verify[gamma + 1]))
    assert chosen[0] <= 2, "the stale measurement first holds γ down"
    best = max(range(7), key=lambda g: expected_tokens(0.98, g) / (true_verify[g + 1] + 0.16 * g))
    assert best >= 3 and abs(chosen[-1] - best) <= 1, f"exploration should find γ≈{best}: {chosen}"


def test_exploration_stays_near_the_optimum():
    ctl = trained(0.8, 0.01, 0.0)
    picks = [ctl.choose() for _ in range(64)]
    best = max(set(picks), key=picks.count)
    assert picks.count(best) >= 0.85 * len(picks) and set(picks) <= {best, best + 1}
