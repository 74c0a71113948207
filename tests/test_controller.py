"""γ controller and cost model on synthetic cost profiles (its probes: tests/test_probes.py)."""

import dataclasses

import pytest

from specdec.core.rounds import PassLoad, RoundRecord
from specdec.planning.controller import Ewma, GammaController, update_fill
from specdec.planning.cost import CostProfile, expected_tokens
from specdec.planning.estimates import FIRST_SAMPLES
from specdec.planning.prior import SharedPrior
from specdec.tools.bench.theory import profile_speedup, theorem_speedup

STEP = 0.1  # seconds for a one-token target forward


def timing(drafted: int, accepted: int, draft_wall: float, draft_compute: float, target_wall: float,
           target_compute: float, draft_steady: bool = True, target_load: PassLoad = PassLoad(),
           draft_load: PassLoad = PassLoad()) -> RoundRecord:
    """A round as the controller sees it: what each hop cost (wall and reported compute) and its load."""
    return RoundRecord(gamma=drafted, drafted=drafted, accepted=accepted, emitted=accepted + 1,
                       wall_s=target_wall + draft_wall, draft_wall_s=draft_wall, draft_compute_s=draft_compute,
                       target_wall_s=target_wall, target_compute_s=target_compute, draft_steady=draft_steady,
                       draft_load=draft_load, target_load=target_load)


def flat(step: float = STEP, growth: float = 0.02, sizes: int = 9) -> CostProfile:
    """A forward of S tokens costs about one step: multi-token forwards are cheap (GPU, prepacked CPU)."""
    return CostProfile(tuple(step * (1 + growth * (s - 1)) for s in range(1, sizes + 1)))


def linear(step: float = STEP, sizes: int = 9) -> CostProfile:
    """A forward of S tokens costs S steps: default fp32 kernels on some CPUs."""
    return CostProfile(tuple(step * s for s in range(1, sizes + 1)))


def pin_alpha(ctl: GammaController, alpha: float) -> GammaController:
    """Pin the controller's α to a synthetic value (a prior no round can move)."""
    ctl.acceptance.prior_alpha, ctl.acceptance.prior_weight = alpha, 1e6
    return ctl


def controller(alpha: float, draft_step: float, target: CostProfile | None = None, rtt: float = 0.0,
               gamma_max: int = 8) -> GammaController:
    ctl = pin_alpha(GammaController(gamma_max, target or flat(), flat(draft_step)), alpha)
    ctl.rtt_draft.update(rtt)
    ctl.rtt_target.update(rtt)
    return ctl


def run_rounds(ctl: GammaController, alpha: float, rounds: int) -> list[int]:
    """Drive the controller with rounds whose costs follow its own profiles exactly."""
    chosen = []
    for _ in range(rounds):
        gamma = ctl.choose()
        chosen.append(gamma)
        accepted = int(gamma * alpha)
        ctl.observe(timing(gamma, accepted, gamma * ctl.draft_cost.forward_s(1), gamma * ctl.draft_cost.forward_s(1),
                                ctl.target_cost.forward_s(gamma + 1), ctl.target_cost.forward_s(gamma + 1)))
    return chosen


def test_expected_tokens_and_predictions():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert theorem_speedup(0.8, 3, 0.1) == pytest.approx(expected_tokens(0.8, 3) / 1.3)
    # With a verify that costs one step, the measured-profile prediction is Theorem 3.8.
    same = CostProfile((STEP,) * 9)
    assert profile_speedup(0.8, 3, CostProfile((0.01,) * 9), same) == pytest.approx(theorem_speedup(0.8, 3, 0.1))


def test_zero_when_a_verify_of_s_tokens_costs_s_steps():
    """The issue's machine class: multi-token forwards cost S×; no γ > 0 pays even at α = 0.9."""
    ctl = controller(alpha=0.9, draft_step=0.01, target=linear())
    assert all(ctl.rates(8)[g] < ctl.rates(8)[0] for g in range(1, 9))
    assert run_rounds(ctl, 0.9, 3) == [0, 0, 0], "no exploration needed: the profile says so from round 1"


def test_positive_when_a_verify_costs_about_one_step():
    ctl = controller(alpha=0.9, draft_step=0.01, target=flat())
    assert ctl.choose() >= 4


def test_gamma_rises_with_alpha():
    chosen = [controller(a, 0.01).choose() for a in (0.3, 0.6, 0.8, 0.95)]
    assert chosen == sorted(chosen) and chosen[-1] > chosen[0]


def test_gamma_falls_with_draft_cost():
    chosen = [controller(0.8, d).choose() for d in (0.002, 0.01, 0.03, 0.06)]
    assert chosen == sorted(chosen, reverse=True) and chosen[0] > chosen[-1]


def test_gamma_zero_when_alpha_below_cost_ratio():
    assert controller(alpha=0.1, draft_step=0.05).choose() == 0  # c = 0.5 > α


def test_network_rtt_to_draft_counts():
    near, far = controller(0.7, 0.005), controller(0.7, 0.005)
    far.rtt_draft.value = 0.5
    assert far.round_time(2) - near.round_time(2) == pytest.approx(0.5)
    assert far.round_time(0) == pytest.approx(near.round_time(0)), "γ=0 skips the draft hop"
    assert far.choose() < near.choose(), "a distant draft is used less"


def test_bounds():
    ctl = controller(0.99, 0.0001, gamma_max=4)
    assert ctl.choose() == 4 and ctl.choose(max_useful=2) == 2 and ctl.choose(max_useful=0) == 0
    ctl.draft_cost = None
    assert ctl.choose() == 0, "no draft replica: target-only"


def test_scales_follow_a_slower_machine_without_changing_the_shape():
    ctl = controller(0.8, 0.01)
    for _ in range(20):
        ctl.observe(timing(3, 2, 0.06, 0.06, 2 * ctl.target_cost.forward_s(4), 2 * ctl.target_cost.forward_s(4)))
    assert ctl.target_scale.value == pytest.approx(2.0, rel=0.01)
    assert ctl.draft_scale.value == pytest.approx(2.0, rel=0.01)
    assert ctl.verify_time(5) == pytest.approx(2 * ctl.target_cost.forward_s(6), rel=0.01)


def test_catch_up_rounds_do_not_inflate_draft_cost():
    ctl = controller(0.8, 0.01)
    ctl.observe(timing(1, 1, 0.01, 0.01, STEP, STEP))
    before = ctl.draft_scale.value
    ctl.observe(timing(1, 1, 0.5, 0.5, STEP, STEP, draft_steady=False))  # the draft fed many tokens
    assert ctl.draft_scale.value == before


def test_a_drafts_catch_up_is_spread_over_the_rounds_it_can_serve():
    """The first round of a 64-token generation, whose draft has yet to read the 50-token prompt (a CPU-like
    pair: c = 0.4, the feed about 5 target steps, α 0.7): spread over the rounds the draft can then serve,
    its feed leaves the draft model worth more than a target-only step. Spread over 8 rounds, as it was, it
    lost, and each target-only round then left the draft a token further behind. Two tokens before the end,
    the same feed is not worth it."""
    ctl = pin_alpha(GammaController(8, machine(), machine(0.04, knee=4)), 0.7)
    gamma = ctl.choose()
    assert gamma > 0 and ctl.rate(gamma) > ctl.rate(0)
    assert ctl.catch_up_rate(gamma, 51, 63) > ctl.rate(0)
    feed = ctl.draft_time(51, gamma) - ctl.draft_time(1, gamma)
    assert ctl.rate(gamma, feed / 8) < ctl.rate(0), "over 8 rounds the prompt's feed priced the draft out"
    assert ctl.catch_up_rate(gamma, 51, 2) < ctl.rate(0)
    assert ctl.catch_up_rate(gamma, 1, 2) == ctl.rate(gamma), "a steady round feeds nothing extra"


def test_early_stop_threshold_rises_with_draft_cost():
    cheap, dear = controller(0.8, 0.005), controller(0.8, 0.05)
    assert 0 < cheap.confidence_threshold() < dear.confidence_threshold() <= 0.9
    assert GammaController(4, flat()).confidence_threshold() == 0.0, "no draft, no threshold"


def test_a_wait_behind_other_sessions_passes_is_load_not_speed():
    """A step that waited for its pass to begin (behind a burst's prefills) ran at the profile's speed: the wait is
    load, priced by the sessions and batch fill, not a slower device. Read as speed, it taught a scale of 33 for
    one-token passes, which later sessions were handed."""
    ctl = controller(0.8, 0.005)
    waited = PassLoad(sessions=8, rows=1.0, tokens=1.0, forward_s=STEP, wait_s=32 * STEP)
    ctl.observe(timing(0, 0, 0.0, 0.0, 33.1 * STEP, 33.05 * STEP, target_load=waited))
    assert ctl.target_scale_at(1) == pytest.approx(1.05), "its pass and its own work (0.05 of a step), not its wait"
    drafting = PassLoad(sessions=1, rows=1.0, tokens=1.0, forward_s=3 * 0.005, wait_s=0.05)
    ctl.observe(timing(3, 3, 0.07, 0.065, STEP, STEP, draft_load=drafting))
    assert ctl.draft_scale.value == pytest.approx(1.0)
    branch = PassLoad(sessions=8, rows=1.0, tokens=1.0, forward_s=4 * 0.005, wait_s=0.1)
    ctl.observe_branch(drafted=4, compute_s=0.12, guessed=None, load=branch)
    assert ctl.contention_draft.value == pytest.approx(1.0), "a branch's wait is no slowdown beside the verify"


def test_a_draft_that_stops_early_may_draft_past_gamma():
    """Under the early stop, a round of γ > 0 asks the draft for up to the cap: where it stays confident, it drafts
    on past γ; target-only stays target-only, and without a draft profile (no threshold) γ is the limit."""
    ctl = controller(0.8, 0.005)
    assert ctl.draft_limit(2, 8) == 8 and ctl.draft_limit(2, 3) == 3, "up to the cap"
    assert ctl.draft_limit(0, 8) == 0, "target-only stays target-only"
    assert ctl.draft_limit(3, 3) == 3
    assert GammaController(8, flat()).draft_limit(2, 8) == 2, "no threshold, no early stop: γ"


def test_shared_prior_hands_learned_costs_and_alpha_to_new_sessions():
    prior = SharedPrior(gamma_max=8)
    fresh = prior.new_controller(flat(), flat(0.01))
    assert fresh.target_scale.value == 1.0 and fresh.rtt_target.value is None
    trained = prior.new_controller(flat(), flat(0.01))
    for _ in range(12):
        trained.observe(timing(4, 4, 0.06, 0.04, 0.25, 0.2))
    prior.absorb(trained)
    informed = prior.new_controller(flat(), flat(0.01))
    assert informed.rtt_target.value == pytest.approx(trained.rtt_target.value)
    assert informed.target_scale.value == pytest.approx(trained.target_scale.value)
    assert informed.acceptance.alpha > 0.9, "α learned by earlier sessions becomes the prior"
    informed.observe(timing(3, 0, 0.1, 0.1, 0.1, 0.1))
    assert prior.new_controller(flat()).acceptance.accepted == 0, "sessions do not share mutable state"
    assert informed.target_scale.value == pytest.approx(0.1 / flat().forward_s(4)), \
        "a session's first measurement replaces the seed"


def machine(step: float = STEP, knee: int = 9, sizes=(1, 2, 3, 4, 5, 6, 7, 8, 9, 18, 36, 72, 144)) -> CostProfile:
    """A CPU-like profile: about one step up to `knee` tokens, then compute-bound (linear in tokens)."""
    return CostProfile(tuple(step * max(1.0, s / knee) * (1 + 0.01 * min(s, knee)) for s in sizes), tuple(sizes))


def loaded_round(ctl: GammaController, gamma: int, alpha: float, rows: float, sessions: float | None = None) -> None:
    """One round whose costs follow the profiles, in passes of `rows` sessions alike, out of
    `sessions` live ones (default: all of them in each pass)."""
    sessions = rows if sessions is None else sessions
    tokens = rows * (gamma + 1)
    draft_s, target_s = gamma * ctl.draft_cost.forward_s(rows), ctl.target_cost.forward_s(tokens)
    ctl.observe(timing(gamma, int(gamma * alpha), draft_s, draft_s, target_s, target_s,
                       target_load=PassLoad(sessions, rows, tokens), draft_load=PassLoad(sessions, rows, rows)))


def test_sessions_of_one_prior_share_the_load_they_measure():
    """8 users on one target. A session whose one target-only round found it alone in the pass (fill 1/8),
    and whose drafting rounds then met full passes, would keep drafting on that stale sample alone; the
    other 7 sessions' target-only rounds, in full passes, are its load estimate too, and γ = 0 wins."""
    def history(ctl: GammaController) -> GammaController:
        pin_alpha(ctl, 0.8)
        loaded_round(ctl, 0, 0.8, rows=1, sessions=8)
        loaded_round(ctl, 2, 0.8, rows=8, sessions=8)
        return ctl

    assert history(GammaController(8, machine(), machine(0.02))).choose() > 0, "the stale sample must matter"
    assert set(GammaController.fresh_load()) == set(GammaController.LOAD)
    prior = SharedPrior(gamma_max=8)
    stale = history(prior.new_controller(machine(), machine(0.02)))
    others = [prior.new_controller(machine(), machine(0.02)) for _ in range(7)]
    for _ in range(4):
        for ctl in others:
            loaded_round(ctl, 0, 0.8, rows=8, sessions=8)
    assert stale.choose() == 0
    assert stale.acceptance is not others[0].acceptance, "α stays each session's own"
    lookup_prior = SharedPrior(gamma_max=8, target_load_of=prior)
    lookups = lookup_prior.new_controller(machine(), CostProfile((0.0,)))
    assert lookups.target_fill_plain is stale.target_fill_plain, "another proposer on the same target"
    assert lookups.draft_fill is not stale.draft_fill, "a lookup's draft side is its own"
    for ctl in [stale, *others]:
        prior.absorb(ctl)
    assert not lookups.target_sessions.provisional, "a lookup session still measures the target's load"
    lookup_prior.absorb(lookups)
    alone = prior.new_controller(machine(), machine(0.02))
    loaded_round(alone, 0, 0.8, rows=1, sessions=1)
    assert alone.target_sessions.value == 1.0, "after the burst, the next session's first round is its load"


def test_a_burst_after_a_lone_session_is_priced_by_its_live_sessions():
    """A lone session speculates; when it ends, its load turns provisional. 8 sessions arriving at once choose
    their first round before any of them has measured the target: priced as the lone session's, they would
    all draft (they did, and cost 8 users 4% of target-only's tokens/s); with their own live count as the
    floor on the target's sessions, they decode target-only. Their first measurement is the load again."""
    prior = SharedPrior(gamma_max=8)
    lone = pin_alpha(prior.new_controller(machine(knee=4), machine(0.02)), 0.8)
    loaded_round(lone, 2, 0.8, rows=1)
    assert lone.choose() > 0
    prior.absorb(lone)
    burst = [pin_alpha(prior.new_controller(machine(knee=4), machine(0.02)), 0.8) for _ in range(8)]
    assert burst[0].target_sessions.value == 8 and burst[0].target_sessions.provisional
    assert all(ctl.choose() == 0 for ctl in burst)
    burst[0].target_sessions.value = 1.0  # had no floor been set: the lone session's
    assert burst[0].choose() > 0, "the floor must matter"
    sessions, fill = burst[0].target_sessions, burst[0].target_fill_plain
    sessions.value, before = 8.0, (fill.value, fill.provisional)
    loaded_round(burst[0], 0, 0.8, rows=2, sessions=2)  # the first report: the others not yet opened there
    assert sessions.value == 8 and not sessions.provisional and burst[1].choose() == 0, "the live sessions a floor"
    sessions.value, sessions.provisional, sessions.floor = 8.0, True, 0.0  # had the floor held only for the seed
    loaded_round(burst[0], 0, 0.8, rows=2, sessions=2)
    assert burst[1].choose() > 0, "the floor on every sample must matter"
    sessions.value, sessions.provisional, sessions.floor = 8.0, True, 8.0
    fill.value, fill.provisional = before
    loaded_round(burst[0], 0, 0.8, rows=1, sessions=8)  # a ragged first pass: the others still prefill
    assert burst[1].target_sessions.value == 8 and not burst[1].target_sessions.provisional
    assert burst[1].choose() == 0 and burst[1].target_fill_plain.value > 0.5
    kept = burst[1].target_fill_plain.value
    burst[1].target_fill_plain.value = 1 / 8  # had that one pass replaced the lone session's fill
    assert burst[1].choose() > 0, "the cautious fill must matter"
    burst[1].target_fill_plain.value = kept
    fill = Ewma(0.3, 0.5, provisional=True)
    update_fill(fill, 0.9)
    assert fill.value == 0.9, "a fuller pass replaces a provisional fill at once"


def test_a_burst_prices_the_draft_by_its_live_sessions_too():
    """γ > 0 is priced as every session drafting alike. The first of 8 sessions to draft finds the draft alone
    (its report: one live session there); priced as one session's, the draft's passes and catch-ups look 8
    times cheaper than all 8 drafting, and the burst drafts into its own target passes. The live sessions
    floor the draft's sessions, as the target's, until they leave."""
    prior = SharedPrior(gamma_max=8)
    burst = [pin_alpha(prior.new_controller(machine(knee=4), machine(0.02)), 0.8) for _ in range(8)]
    first = burst[0]
    first.observe(timing(2, 1, 0.04, 0.04, 0.1, 0.1, target_load=PassLoad(8, 8, 24), draft_load=PassLoad(1, 1, 1)))
    assert burst[1].draft_sessions.value == 8 and not burst[1].draft_sessions.provisional
    alone = pin_alpha(GammaController(8, machine(knee=4), machine(0.02)), 0.8)
    alone.draft_scale.value = first.draft_scale.value
    assert first.catch_up_time(2, 40) > 4 * alone.catch_up_time(2, 40), "8 sessions catching up, not one"
    for ctl in burst:
        prior.absorb(ctl)
    later = prior.new_controller(machine(knee=4), machine(0.02))
    later.observe(timing(2, 1, 0.04, 0.04, 0.1, 0.1, target_load=PassLoad(1, 1, 3), draft_load=PassLoad(1, 1, 1)))
    assert later.draft_sessions.value == 1, "after the burst, a lone session's draft load is its own"


def test_a_stall_of_one_round_is_not_the_network():
    """8 users decoding target-only; one round's hop takes 100 ms more (a span exporter's flush stalls the
    orchestrator, every session's round at once). Read as the network, the next round drafts; a lasting rise
    is followed, by half again a round."""
    ctl = pin_alpha(GammaController(8, machine(), machine(0.03)), 0.8)
    ctl.target_sessions.value = 8.0
    step = ctl.target_cost.forward_s(8)

    def plain_round(hop: float) -> None:
        ctl.observe(timing(0, 0, 0.0, 0.0, step + hop, step, target_load=PassLoad(8, 8, 8)))

    for _ in range(6):
        plain_round(0.003)
    plain_round(0.1)
    assert ctl.choose() == 0 and ctl.rtt_target.value < 0.01
    ctl.rtt_target.value = 0.05  # had the stall been averaged in
    assert ctl.choose() > 0, "the stall must matter"
    ctl.rtt_target.value = 0.003
    for _ in range(12):
        plain_round(0.3)
    assert ctl.rtt_target.value > 0.2, "a lasting rise is followed"


# The packaged pair's start-up profile on a Zen 1 (`specdec bench`, 2026-12-02), seconds a pass of 1..9 tokens.
ZEN1_TARGET = CostProfile((0.0666, 0.1065, 0.1456, 0.1822, 0.2235, 0.2569, 0.2973, 0.3289, 0.3701))
ZEN1_DRAFT = CostProfile((0.0184, 0.0299, 0.0419, 0.0530, 0.0628, 0.0730, 0.0853, 0.0955, 0.1087))


def test_stalled_target_steps_are_not_the_device_slowing():
    """A lone session at α 0.88 decodes target-only (the draft costs 0.28 of a step, a verify of 2 tokens 1.6
    steps); one step stalls at 2.8x, and later two in a row. Taken whole, one stall priced the draft at 0.195 of a
    step and the session drafted at a loss for the rest of its reply (Zen 1, 0.93x target-only); under a median of
    three, two in a row did (ĉ 0.305 → 0.217). A scale's update is the median of its last five samples
    (`SCALE_MEDIAN_OF`): two stalls in a row move nothing, and a lasting slowdown is learned two steps later. The
    draft's scale takes each sample at once: a stall there prices drafting dearer, the safe side."""
    ctl = pin_alpha(GammaController(8, ZEN1_TARGET, ZEN1_DRAFT, probe_every=1000), 0.88)  # no probe due here
    step = ZEN1_TARGET.forward_s(1)
    for size in range(1, 10):  # every pass size measured at its profiled time (earlier sessions' verifies)
        for _ in range(FIRST_SAMPLES):
            ctl.target_sizes.update(size, 1.0)

    def plain_steps(scale: float, steps: int = 1) -> None:
        for _ in range(steps):
            ctl.observe(timing(0, 0, 0.0, 0.0, scale * step, scale * step))

    plain_steps(1.0, 10)
    assert ctl.choose(max_useful=40) == 0
    plain_steps(2.8)
    assert ctl.target_scale_at(1) == ctl.target_scale.value == 1.0
    plain_steps(1.0, 5)
    plain_steps(2.3)
    plain_steps(4.0)
    assert ctl.target_scale_at(1) == ctl.target_scale.value == 1.0
    assert ctl.choose(max_useful=40) == 0, "stalls are not the device slowing"
    ctl.target_sizes.load({"1": 1.39})  # had the second stall been taken, as by a median of three
    assert ctl.choose(max_useful=40) > 0, "the stalls must matter"
    ctl.target_sizes.load({"1": 1.0})
    plain_steps(1.0, 5)  # the stalls leave the last five samples
    plain_steps(2.0, 2)
    assert ctl.target_scale_at(1) == 1.0
    plain_steps(2.0)
    assert ctl.target_scale_at(1) == pytest.approx(1.3), "three slow steps in a row are learned"
    plain_steps(2.0, 4)
    assert ctl.target_scale_at(1) > 1.8, "and a lasting slowdown followed"
    for draft_scale in (1.0, 2.0):  # two drafted rounds, the second's draft slower
        draft_s, verify_s = draft_scale * ZEN1_DRAFT.forward_s(1), ZEN1_TARGET.forward_s(2)
        ctl.observe(timing(1, 1, draft_s, draft_s, verify_s, verify_s))
    assert ctl.draft_scale.value == pytest.approx(1.3), "a slower draft is priced at once: it prices drafting dearer"


def test_the_draft_models_alpha_is_untried_until_a_session_measures_it():
    """Hybrid tries the draft model first while its α is the 0.7 guess (`GammaController.untried`): until this
    session drafted, or an earlier one handed on a measured α. A session that never drafted hands on nothing."""
    prior = SharedPrior(gamma_max=8)
    first = prior.new_controller(machine(), machine(0.02))
    assert first.untried()
    idle = prior.new_controller(machine(), machine(0.02))
    loaded_round(idle, 0, 0.8, rows=1)
    prior.absorb(idle)
    assert idle.untried() and prior.new_controller(machine(), machine(0.02)).untried()
    loaded_round(first, 2, 0.8, rows=1)
    assert not first.untried()
    for _ in range(3):
        loaded_round(first, 2, 0.8, rows=1)
    prior.absorb(first)
    later = prior.new_controller(machine(), machine(0.02))
    assert later.alpha_from_prior and not later.untried()


def test_sparse_profile_interpolates_between_sizes_and_extends_the_last_slope():
    profile = CostProfile((1.0, 1.0, 2.0, 4.0), (1, 2, 4, 8))
    assert profile.forward_s(3) == pytest.approx(1.5)
    assert profile.forward_s(6) == pytest.approx(3.0)
    assert profile.forward_s(16) == pytest.approx(8.0), "past the last size: the last segment's slope"
    assert profile.upper_bound_s(16) == pytest.approx(8.0)
    assert profile.forward_s(0.5) == profile.forward_s(1) == 1.0, "below the first size: the first size's"
    assert profile.forward_s(1.5) == 1.0 and profile.forward_s(4) == 2.0
    falling = CostProfile((2.0, 1.0, 3.0), (1, 2, 4))
    assert falling.forward_s(1.5) == 2.0, "a segment that falls is priced flat, never below its start"
    assert falling.forward_s(3) == pytest.approx(2.0) and falling.forward_s(6) == pytest.approx(5.0)
    single = CostProfile((0.5,), (4,))
    assert single.forward_s(1) == single.forward_s(4) == single.forward_s(9) == 0.5
    with pytest.raises(ValueError):
        CostProfile((1.0, 2.0), (2, 1))


def test_gamma_falls_to_zero_as_load_fills_the_machine():
    """Alone, a verify of 9 tokens costs one step: speculate. With 16 sessions per pass, every draft
    token costs the target real compute, so the goodput-optimal γ is 0 (and in between, smaller)."""
    chosen = {}
    for rows in (1, 4, 16):
        ctl = controller(alpha=0.8, draft_step=0.02, target=machine())
        ctl.draft_cost = machine(0.02)
        for _ in range(5):
            loaded_round(ctl, ctl.choose(), 0.8, rows)
        chosen[rows] = ctl.choose()
    assert chosen[1] >= 4 and 1 <= chosen[4] < chosen[1] and chosen[16] == 0, chosen


def test_aggregate_goodput_at_the_chosen_gamma_is_the_best():
    """The choice maximises b·E(γ)/T(γ) for the observed load b, not one session's speed alone."""
    for rows in (1, 2, 3, 6, 8, 12, 16, 24):
        ctl = controller(alpha=0.75, draft_step=0.03, target=machine())
        ctl.draft_cost = machine(0.03)
        loaded_round(ctl, 2, 0.75, rows)
        gamma = ctl.choose()

        def goodput(g: int) -> float:  # tokens/s over all sessions of a saturated pass
            round_s = ctl.target_cost.forward_s(rows * (g + 1)) + g * ctl.draft_cost.forward_s(rows)
            return rows * expected_tokens(0.75, g) / round_s

        assert goodput(gamma) >= 0.97 * max(goodput(g) for g in range(9)), (rows, gamma)


def test_hysteresis_keeps_gamma_when_the_load_wobbles():
    """The load estimate wobbles around the point where γ = 1 and γ = 2 trade places: without
    hysteresis γ flaps between them; with it, γ stays put."""
    def chooser(hysteresis: float) -> GammaController:
        ctl = controller(alpha=0.8, draft_step=0.02, target=machine())
        ctl.draft_cost, ctl.hysteresis = machine(0.02), hysteresis
        return ctl

    def best_at(rows: float) -> int:
        ctl = chooser(0.0)
        ctl.target_sessions.value = ctl.draft_sessions.value = rows
        return ctl.choose()

    crossing = next(r / 100 for r in range(100, 800) if best_at(r / 100) < 2)
    assert best_at(crossing - 0.05) == 2 and best_at(crossing + 0.05) == 1, crossing

    def switches(ctl: GammaController) -> int:
        chosen = []
        for i in range(40):
            ctl.target_sessions.value = ctl.draft_sessions.value = crossing + (0.05 if i % 2 else -0.05)
            chosen.append(ctl.choose())
        assert set(chosen) <= {1, 2}, chosen
        return sum(a != b for a, b in zip(chosen, chosen[1:]))

    assert switches(chooser(0.0)) >= 30, "the wobble must matter, or this test proves nothing"
    assert switches(chooser(GammaController(8, flat()).hysteresis)) <= 1


def test_speculation_that_scatters_the_batch_pays_for_it():
    """4 sessions: target-only rounds meet in one pass, speculating rounds arrive scattered (1.3
    sessions per pass). Perfect batching would favour γ > 0; the scattered batch it causes does not."""
    def settle(rows_when_drafting: float) -> int:
        ctl = controller(alpha=0.8, draft_step=0.02, target=machine())
        ctl.draft_cost = machine(0.02)
        for _ in range(10):
            gamma = ctl.choose()
            loaded_round(ctl, gamma, 0.8, rows_when_drafting if gamma > 0 else 4.0, sessions=4)
        return ctl.choose()

    assert settle(rows_when_drafting=4.0) > 0
    assert settle(rows_when_drafting=1.3) == 0


def test_a_free_proposer_pays_where_the_draft_model_does_not():
    """Hybrid's comparison: a lookup costs no draft step and no hop. A lookup accepted at α = 0.9 beats
    the draft model (α = 0.6, c = 0.5) at its best γ; one accepted at α ≈ 0 is never worth a token."""
    ctl = controller(alpha=0.6, draft_step=0.05, rtt=0.01)
    model_best = ctl.choose()
    gamma, rate = ctl.best_free(0.9, 8)
    assert gamma > 0 and rate > ctl.rate(model_best) > 0
    assert ctl.best_free(0.01, 8)[0] == 0  # never worth a token: target-only's rate
    assert ctl.best_free(0.9, 2)[0] <= 2  # a short match caps γ
    assert ctl.best_free(0.9, 0) == (0, pytest.approx(ctl.rate(0)))


def test_rounds_drafted_elsewhere_teach_nothing_of_the_draft_model():
    ctl = controller(alpha=0.7, draft_step=0.05)
    ctl.acceptance.prior_weight = 4.0
    before = ctl.acceptance.alpha
    for _ in range(10):
        ctl.observe(timing(4, 0, 0.0, 0.0, STEP, STEP), by_model=False)
    assert ctl.acceptance.alpha == before and ctl.draft_scale.provisional


def test_lookup_prior_hands_alpha_per_match_length_to_new_sessions():
    from specdec.planning.prior import LookupPrior

    prior = LookupPrior(range(2, 6))
    first = prior.estimates()
    assert {n: e.alpha for n, e in first.items()} == {2: 0.5, 3: 0.5, 4: 0.5, 5: 0.5}
    assert all(prior.untried(n) for n in range(2, 6))
    for _ in range(20):
        first[4].observe(6, 6)  # long matches: always accepted
        first[2].observe(6, 0)  # short ones: never
    first[3].observe(6, 1)  # too little to teach anything
    prior.absorb(first)
    second = prior.estimates()
    assert second[4].alpha > 0.9 and second[2].alpha < 0.1 and second[3].alpha == 0.5
    prior.tried(5)
    assert not prior.untried(5) and prior.untried(3), "a kind is untried until some session proposes it"


def test_overlap_round_time_hides_the_shorter_of_draft_and_verify():
    """T_o(γ) = max(branch, verify) + (1 − h)·draft: with every branch a hit, a round costs the slower
    of the two; with none, the branch's wait plus a whole draft; in between, the mix h(γ) = α^γ·β."""
    ctl = controller(alpha=0.8, draft_step=0.04, rtt=0.01)
    ctl.guesses.prior_alpha, ctl.guesses.prior_weight = 0.9, 1e6  # β: the bonus guess is right 90% of the time
    gamma = 3
    branch = 0.01 + (gamma + 1) * ctl.draft_step()
    verify = 0.01 + ctl.verify_time(gamma)
    h = 0.8 ** gamma * 0.9
    assert ctl.hit_probability(gamma) == pytest.approx(h)
    assert ctl.overlap_round_time(gamma) == pytest.approx(max(branch, verify) + (1 - h) * (0.01 + gamma * 0.04))
    plain = ctl.round_time(gamma)
    ctl.overlapping = True
    assert ctl.round_time(gamma) == ctl.overlap_round_time(gamma) < plain
    assert ctl.round_time(0) == pytest.approx(0.01 + ctl.verify_time(0))  # a target-only step overlaps nothing


def test_overlap_pays_on_separate_machines_not_where_services_share_cores():
    """Auto: overlap while its best rate beats plain speculation's. Measured slowdowns (κ) of 2, as two
    services on the same two cores show, make it lose; then it is only probed, ever more rarely."""
    ctl = controller(alpha=0.85, draft_step=0.05, rtt=0.02)
    assert ctl.overlap_pays()
    # A request's fixed γ is priced at that γ: at 1 the branch (2 draft steps) hides behind the verify; at 3
    # its 4 steps outlast it, and a miss (57%) still drafts 3 more.
    assert ctl.overlap_pays(gamma=1) and not ctl.overlap_pays(gamma=3)
    assert not ctl.overlap_pays(gamma=0)  # target-only has nothing to overlap
    ctl.observe_branch(drafted=4, compute_s=4 * 2 * ctl.draft_step(), guessed=True)
    for _ in range(5):
        ctl.observe(dataclasses.replace(timing(3, 3, 0.2, 0.2, 2 * STEP, 2 * STEP), overlapped=True))
    assert ctl.contention_draft.value == pytest.approx(2.0) and ctl.contention_target.value > 1.8
    assert ctl.target_scale.provisional, "an overlapped verify taught the target's plain scale"
    probes = [i for i in range(200) if ctl.overlap_pays()]
    assert 0 < len(probes) < 10 and probes[1] - probes[0] > probes[0]


def test_the_targets_slowdown_is_the_drafts_until_a_verify_overlaps():
    """κ_t, never measured, is priced as κ_d where that was: a fixed γ's rounds measured the draft's slowdown
    beside the target (3.1, services on 2 shared cores) but no overlapped verify, and priced at 1, the next
    session's first round overlapped at a loss. Measured, κ_t is its own."""
    ctl = controller(alpha=0.85, draft_step=0.05, rtt=0.02)
    assert ctl.overlap_pays(gamma=1) and ctl.target_contention() == 1.0, "neither measured: no slowdown"
    ctl.observe_branch(drafted=2, compute_s=2 * 3.1 * ctl.draft_step(), guessed=True)
    assert ctl.target_contention() == pytest.approx(3.1)
    assert not ctl.overlap_pays(gamma=1), "the target slowed as the draft did"
    ctl.observe(dataclasses.replace(timing(1, 1, 0.05, 0.05, 1.1 * ctl.verify_time(1), 1.1 * ctl.verify_time(1)),
                                    overlapped=True))
    assert ctl.target_contention() == pytest.approx(1.1)


def test_branches_teach_the_bonus_guess_rate():
    ctl = controller(alpha=0.9, draft_step=0.05)
    for hit in [True] * 9 + [False]:
        ctl.observe_branch(drafted=0, compute_s=0.0, guessed=hit)
    ctl.observe_branch(drafted=0, compute_s=0.0, guessed=None)  # a rejection: says nothing of the guess
    assert ctl.guesses.observed == 10 and 0.8 < ctl.guesses.alpha < 0.9
    assert ctl.contention_draft.value is None  # no drafted tokens: no slowdown measured


def test_target_only_rounds_of_several_steps_are_priced_so():
    """With a hop as long as a step (a GPU), speculation beats one-step target-only rounds but not rounds
    that take the steps of a 20 ms chunk in one hop: k / (rtt + k·t)."""
    ctl = controller(alpha=0.7, draft_step=0.001, target=flat(0.003), rtt=0.003)
    assert ctl.plain_steps() == 1, "chunking is off until a generation turns it on"
    assert ctl.choose() > 0
    ctl.target_chunk_s = 0.02
    assert ctl.plain_steps() == 6 and ctl.plain_steps(limit=4) == 4 and ctl.plain_steps(limit=0) == 1
    assert ctl.plain_rate(6) == pytest.approx(6 / (0.003 + 6 * ctl.verify_time(0)))
    assert ctl.rates(8, steps=6)[0] == ctl.plain_rate(6) > max(ctl.rates(8, steps=6)[g] for g in range(1, 9))
    assert ctl.choose() == 0 and not ctl.probing
    far = controller(alpha=0.7, draft_step=0.001, target=flat(0.003), rtt=0.12)
    assert far.choose() >= 4, "one step a hop: a distant target asks for long drafts"
    far.target_chunk_s = 0.02
    assert far.choose() == 0, "six tokens a hop beat a long draft's three"
    slow = controller(alpha=0.7, draft_step=0.001, target=flat(0.03), rtt=0.003)
    slow.target_chunk_s = 0.02
    assert slow.plain_steps() == 1, "a step longer than the chunk: one step a round"


def test_a_rounds_first_draft_pass_feeds_the_last_draft_and_the_bonus_token():
    """After a round that accepted every draft, the draft's first pass feeds two tokens (its own last draft and
    the target's bonus token), which at α^γ is most rounds of small γ. With a draft whose pass of 2 costs 1.7
    of one (at AVX2), a round of γ = 1 at α 0.9 does not pay against a verify of 2 at 1.5 steps, where pricing
    every draft pass as one token said it did (10.6 against 10 tokens/s); with a flat draft it does. Rounds
    that cost what the profile says, the first pass fed one token or two, leave the draft's scale at 1."""
    target = CostProfile(tuple(STEP * (1 + 0.5 * (s - 1)) for s in range(1, 10)))
    draft = CostProfile(tuple(0.03 * (1 + 0.7 * (s - 1)) for s in range(1, 10)))
    ctl = pin_alpha(GammaController(8, target, draft), 0.9)
    for gamma in (1, 2, 4):
        first = draft.forward_s(1 + 0.9 ** gamma)
        assert ctl.round_time(gamma) == pytest.approx(target.forward_s(gamma + 1) + first + (gamma - 1) * 0.03)
    assert ctl.choose() == 0 and ctl.rate(1) < ctl.rate(0)
    assert expected_tokens(0.9, 1) / (target.forward_s(2) + 0.03) > 1 / STEP, "one token a pass: γ = 1 paid"
    assert pin_alpha(GammaController(8, target, flat(0.03)), 0.9).choose() > 0
    for fed in (1, 2):  # a round of γ = 3 whose first pass fed `fed` tokens: (3 + fed - 1) / 3 tokens a pass
        compute = draft.forward_s(fed) + 2 * draft.forward_s(1)
        ctl.observe(timing(3, 3, compute, compute, target.forward_s(4), target.forward_s(4),
                           draft_load=PassLoad(tokens=(2 + fed) / 3)))
        assert ctl.draft_scale.value == pytest.approx(1.0)


def test_a_long_conversations_first_drafting_round_is_chosen_only_where_its_feed_pays():
    """Every γ > 0 is priced with the draft's feed of what it has not seen (`catch_up_rate`), not only a probe: a
    measured draft at 0.2 of a step and α 0.9, 3,000 tokens behind (60 s of feed against 0.054 s saved a token),
    stays target-only for a 127-token reply and for a reply of unknown length that has just begun, and drafts
    once the tokens generated so far would have saved the feed (ski rental: the first such count is within a round's
    yield of the feed ÷ the saving per token). Behind by a short prompt's 50 tokens, it drafts from the start."""

    def measured() -> GammaController:
        ctl = pin_alpha(GammaController(8, flat(), linear(0.02)), 0.9)
        ctl.alpha_from_prior = True  # no trial: a measured α
        return ctl

    assert measured().choose(127, unseen=1) > 0, "in step: speculation pays"
    assert measured().choose(127, unseen=3000) == 0 and measured().choose(unseen=3000) == 0
    assert measured().choose(127, unseen=50) > 0
    steady = measured()
    gamma = max(range(1, 9), key=steady.rates(8).get)
    saving = 1 / steady.rate(0) - 1 / steady.rate(gamma)  # seconds a token, drafting against target-only
    break_even = steady.catch_up_time(gamma, 3000) / saving

    def drafts_after(generated: int) -> bool:
        ctl = measured()
        ctl.generated = generated
        return ctl.choose(unseen=3000) > 0

    first = next(n for n in range(0, 5000, 10) if drafts_after(n))
    assert abs(first - break_even) <= expected_tokens(0.9, 8), (first, break_even)
    assert all(drafts_after(n) for n in range(first, 5000, 250)), "past it, it drafts"


# A Zen 4's start-up profiles (ms; the gguf-q8 target and its Q4_0 draft) and the target's passes in the service an
# hour later, as a traced benchmark run measured them: the host's bandwidth had fallen, so the one-token pass
# slowed by a quarter and the verify of 3 tokens, bound by arithmetic, hardly at all.
ZEN4_TARGET = CostProfile(tuple(ms / 1e3 for ms in (25.2, 32.4, 40.0, 46.7, 53.5, 66.0, 76.1, 83.8, 89.1)))
ZEN4_DRAFT = CostProfile(tuple(ms / 1e3 for ms in (9.6, 10.2, 12.6, 15.0, 17.3, 22.8, 25.6, 27.4, 30.1)))
IN_SERVICE = {1: 31.9e-3, 2: 36.1e-3, 3: 41.0e-3}  # target pass of S tokens
DRAFT_STEP, HOP = 9.6e-3, 1e-3


def drifted_round(gamma: int) -> RoundRecord:
    """A round of γ ≤ 2 at the in-service costs: a verify of γ + 1 tokens, γ draft passes at the profile's cost."""
    draft = gamma * DRAFT_STEP
    return timing(gamma, gamma, draft + HOP if gamma else 0.0, draft, IN_SERVICE[gamma + 1] + HOP,
                  IN_SERVICE[gamma + 1], target_load=PassLoad(tokens=gamma + 1), draft_load=PassLoad(tokens=1))


def test_a_drifting_host_is_priced_per_pass_size():
    """After target-only rounds and rounds of γ = 1 and 2 (as adaptive decoding mixes them), every size the target
    ran is priced at what it cost. One scale for every size cannot fit both a one-token pass that slowed 1.27× and
    a verify of 3 that slowed 1.03×: it priced the verify 8% high and the target-only step 12% low, and chose
    target-only at α 0.6 and γ = 1 at α 0.83, where γ = 1 and γ = 2 were 1.10× and 1.08× faster."""
    for alpha in (0.6, 0.83):
        ctl = GammaController(8, ZEN4_TARGET, ZEN4_DRAFT)
        for _ in range(6):
            for gamma in (0, 1, 2):
                ctl.observe(drifted_round(gamma))
        pin_alpha(ctl, alpha)
        for gamma in (0, 1, 2):
            assert ctl.verify_time(gamma) == pytest.approx(IN_SERVICE[gamma + 1], rel=1e-3)
        one_scale = ctl.target_scale.value
        assert max(abs(one_scale * ZEN4_TARGET.forward_s(s) / IN_SERVICE[s] - 1) for s in (1, 3)) > 0.1
        truth = {gamma: expected_tokens(alpha, gamma) / (IN_SERVICE[gamma + 1] + HOP + (HOP if gamma else 0.0)
                                                        + gamma * DRAFT_STEP) for gamma in (0, 1, 2)}
        best = max(truth, key=truth.get)
        assert best > 0 and truth[best] > 1.07 * truth[0]
        assert ctl.choose(max_useful=2) == best


def test_a_slow_first_verify_is_forgotten_at_the_next():
    """A session's first verify of 3 ran 3× its cost (a hiccup on a loaded host); the next one (a probe) cost
    what it should. The size's scale is then that one's, and γ > 0 is chosen where it pays. Averaged in, the
    slow sample kept every verify priced 2.4× for rounds to come, and a verify not chosen is not measured. Now the
    one-size scale (the default a size with fewer than `FIRST_SAMPLES` samples is capped at) takes the median of
    its last five samples (`SCALE_MEDIAN_OF`), so the slow one prices nothing out even for a round."""
    ctl = GammaController(8, ZEN4_TARGET, ZEN4_DRAFT)
    for _ in range(4):
        ctl.observe(drifted_round(0))
    slow = drifted_round(2)
    ctl.observe(dataclasses.replace(slow, target_compute_s=3 * slow.target_compute_s,
                                    target_wall_s=3 * slow.target_compute_s + HOP))
    pin_alpha(ctl, 0.83)
    assert ctl.choose(max_useful=2) > 0, "one slow sample is not the device slowing"
    ctl.observe(drifted_round(2))
    assert ctl.verify_time(2) == pytest.approx(IN_SERVICE[3], rel=1e-3)
    assert ctl.choose(max_useful=2) > 0


# The packaged target and its 4-bit draft on the Zen 5 (start-up profiles, 2026-12-01): a verify of 5 costs 1.4
# one-token steps after the profile's 128 tokens, and attention adds 0.75 µs (target) and 0.35 µs (draft) a token
# and cached position past them: 2.0 steps after 6,000.
DEEP_TARGET = CostProfile((0.022, 0.022, 0.024, 0.028, 0.031, 0.037, 0.042, 0.049, 0.052), per_position_s=7.5e-7)
DEEP_DRAFT = CostProfile((0.0065, 0.0067, 0.008, 0.0095, 0.0109, 0.0134, 0.0161, 0.0192, 0.02), per_position_s=3.5e-7)


def test_at_depth_a_verify_is_priced_with_its_attention_and_speculation_can_stop_paying():
    """Priced at the session's context: one session's verify of γ drafts costs P(γ+1) + (γ+1)·a·(d − 128), a draft
    step P_d(1) + a_d·(d − 128). With AVX2's costs (each row of a verify 8 ms, attention 1.5 µs a token and
    position), at α 0.9 γ = 2 pays after 128 positions (21.0 ms a token against 22.6) and loses after 6,000
    (35.1 against 31.4): the controller decodes target-only there. Unmeasured (a = 0), it would draft at any depth."""
    target = CostProfile(tuple(0.0226 + 0.008 * (s - 1) for s in range(1, 10)), per_position_s=1.5e-6)
    draft = CostProfile(tuple(0.008 + 0.003 * (s - 1) for s in range(1, 10)), per_position_s=7e-7)
    ctl = pin_alpha(GammaController(8, target, draft), 0.9)
    assert ctl.choose() == 2
    ctl.context, ctl._last_gamma = 6000, None
    assert ctl.verify_time(2) == pytest.approx(0.0386 + 3 * 1.5e-6 * 5872)
    assert ctl.draft_step() == pytest.approx(0.008 + 7e-7 * 5872)
    assert ctl.choose() == 0
    # A feed that ends at the context (the prompt, a draft's catch-up): each token at the feed's mean position.
    assert ctl.target_time(6000) == pytest.approx(target.upper_bound_s(6000) + 6000 * 1.5e-6 * (3000 - 128))
    assert ctl.draft_time(1000, 1) == pytest.approx(draft.upper_bound_s(1000) + 1000 * 7e-7 * (5500 - 128))
    unmeasured = pin_alpha(GammaController(8, dataclasses.replace(target, per_position_s=0.0),
                                           dataclasses.replace(draft, per_position_s=0.0)), 0.9)
    unmeasured.context = 6000
    assert unmeasured.choose() == 2


def test_a_round_at_depth_that_costs_what_its_profile_says_teaches_no_drift():
    """A round after 6,000 positions whose verify and drafts took their profiles' times at that depth leaves both
    scales at 1; read against the 128-token curve alone it would have taught the target a scale of 1.55 for every
    pass, a one-token step's included."""
    ctl = pin_alpha(GammaController(8, DEEP_TARGET, DEEP_DRAFT), 0.85)
    ctl.context = 6000
    verify, step = 0.024 + 3 * 7.5e-7 * 5872, 0.0065 + 3.5e-7 * 5872
    load = PassLoad(sessions=1, rows=1, tokens=3)
    ctl.observe(timing(2, 2, 2 * step, 2 * step, verify, verify, target_load=load,
                       draft_load=PassLoad(sessions=1, rows=1, tokens=1)))
    assert ctl.target_scale.value == pytest.approx(1.0) and ctl.draft_scale.value == pytest.approx(1.0)
    assert verify / DEEP_TARGET.forward_s(3) == pytest.approx(1.55, abs=0.01)
