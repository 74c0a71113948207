"""Microbenchmark of the adaptive decision's pricing at rest: settled(), and a full choose()+overlap_pays()."""
import time, sys
sys.path.insert(0, "/work/main/tests")
from specdec.planning.controller import GammaController
from specdec.planning.cost import CostProfile
from specdec.core.rounds import PassLoad, RoundRecord

tok = tuple(range(1, 10)) + (16, 32, 64, 128)
tgt = CostProfile(tuple(0.045 * (1 + 0.25 * (s - 1)) for s in tok), tok, 1e-6)
dft = CostProfile(tuple(0.015 * (1 + 0.2 * (s - 1)) for s in tok), tok, 3e-7)

def make():
    c = GammaController(8, tgt, dft, target_chunk_s=0.02)
    c.context = 700
    c.generated = 200
    for i in range(40):
        n = 8
        load = PassLoad(sessions=8, rows=7, tokens=7) if hasattr(PassLoad, "__dataclass_fields__") else PassLoad()
        rec = RoundRecord(gamma=0, drafted=0, accepted=0, emitted=1, wall_s=0.2, draft_wall_s=0, draft_compute_s=0,
                          target_wall_s=0.2, target_compute_s=0.18, draft_steady=True, draft_load=PassLoad(),
                          target_load=load)
        c.observe(rec)
    for g in (1, 2, 3):
        rec = RoundRecord(gamma=g, drafted=g, accepted=g - 1, emitted=g, wall_s=0.3, draft_wall_s=0.05,
                          draft_compute_s=0.04, target_wall_s=0.25, target_compute_s=0.2, draft_steady=True,
                          draft_load=PassLoad(), target_load=PassLoad())
        c.observe(rec)
    c._last_gamma = 0
    return c

c = make()
print("at rest", c.at_rest(), "alpha", c.acceptance.alpha)
def bench(label, fn, n=3000):
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n)
    print(f"{label}: {best * 1e6:.1f} us")

def settled():
    with c.one_decision():
        c._last_gamma = 0
        return c.settled(8, {8: c.acceptance.alpha})
def settled_hi():
    with c.one_decision():
        c._last_gamma = 0
        return c.settled(8, {8: 0.95, 3: 0.99})
def full():
    with c.one_decision():
        c.overlapping = c.overlap_pays(60)
        return c.choose(60, 3)
def vt():
    c.verify_time(3)
print("settled", settled(), "settled_hi", settled_hi(), "full", full())
bench("verify_time (no decision)", vt, 20000)
bench("settled", settled)
bench("settled hi alpha", settled_hi)
bench("overlap_pays + choose", full, 1000)
if len(sys.argv) > 1:
    import cProfile, pstats
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(2000):
        full(); settled()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)
