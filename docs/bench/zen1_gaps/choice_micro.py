"""Time one round's choice of γ (`settled`, the overlap, `choose`) at 8 users' load, with and without
`RoundPricing.one_decision` (run from the repository root: `python docs/bench/zen1_gaps/choice_micro.py`)."""
import sys
import time

sys.path.insert(0, "tests")
from specdec.planning.controller import GammaController  # noqa: E402
from specdec.planning.cost import CostProfile  # noqa: E402

target = CostProfile(tuple(0.07 * (1 + 0.6 * (s - 1)) for s in range(1, 129)))
draft = CostProfile(tuple(0.02 * (1 + 0.5 * (s - 1)) for s in range(1, 129)))
ctl = GammaController(8, target, draft)
ctl.target_sessions.update(8.0)
ctl.draft_sessions.update(8.0)
ctl.target_fill_plain.update(1.0)
ctl.context = 60


def choose() -> None:
    ctl.settled(8, {8: 0.97, 2: 0.97})
    ctl.overlapping = ctl.overlap_pays(60)
    ctl.choose(60, 1)


def once() -> None:
    with ctl.one_decision():
        choose()


for name, decide in (("each price as asked", choose), ("one_decision", once)):
    n = 2000
    began = time.perf_counter()
    for _ in range(n):
        decide()
    print(f"{name}: {1e6 * (time.perf_counter() - began) / n:.0f} µs a choice")
