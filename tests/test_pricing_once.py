"""One round's choice prices each pass and round once (`RoundPricing.one_decision`), and chooses as without."""

from __future__ import annotations

from collections import Counter

from test_controller import controller, linear

import specdec.planning.pricing as pricing


def choice(ctl) -> tuple[bool, bool, int]:
    """What a round of adaptive γ asks of the controller (`Generation._decide`): settled, overlap, γ."""
    return ctl.settled(8, {8: 0.97, 2: 0.97}), ctl.overlap_pays(60), ctl.choose(60, 5)


def test_within_one_decision_each_target_pass_is_priced_once_and_the_choice_is_the_same(monkeypatch):
    priced = Counter()
    plain_pass_cost = pricing.pass_cost

    def counted(profile, sessions, fill, tokens):
        priced[id(profile), tokens] += 1
        return plain_pass_cost(profile, sessions, fill, tokens)

    monkeypatch.setattr(pricing, "pass_cost", counted)
    ctl = controller(0.9, 0.01, linear(0.05))
    ctl.target_sessions.update(4.0)
    without = choice(ctl)
    target_passes = {k: n for (profile, k), n in priced.items() if profile == id(ctl.target_cost)}
    assert max(target_passes.values()) >= 3  # every γ priced three times over or more

    ctl = controller(0.9, 0.01, linear(0.05))
    ctl.target_sessions.update(4.0)
    priced.clear()
    with ctl.one_decision():
        within = choice(ctl)
    target_passes = {k: n for (profile, k), n in priced.items() if profile == id(ctl.target_cost)}
    assert within == without
    assert set(target_passes.values()) == {1}, target_passes


def test_one_decision_reads_the_estimates_as_first_asked_and_forgets_them_after():
    ctl = controller(0.8, 0.01, linear(0.05))
    with ctl.one_decision():
        before = ctl.verify_time(2)
        ctl.target_scale.update(3.0)  # another session's pass, meanwhile
        assert ctl.verify_time(2) == before
        with ctl.one_decision():  # nested: the outer one counts
            assert ctl.verify_time(2) == before
        assert ctl.round_time(2, False) != ctl.round_time(2, True)  # an overlapped round is its own price
        ctl.overlapping = True
        assert ctl.round_time(2) == ctl.overlap_round_time(2)  # `overlapping` is read each time
    assert ctl.verify_time(2) > before
