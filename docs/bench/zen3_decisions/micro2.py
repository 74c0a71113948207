import sys, time
sys.path.insert(0, "/work/main/tests")
from test_controller import *
c = pin_alpha(GammaController(8, flat(), flat()), 0.7)
c.choose(60, 300)
def settled():
    with c.one_decision():
        return c.settled(8, {}, 300, 60)
def full():
    with c.one_decision():
        c.overlapping = c.overlap_pays(60)
        return c.choose(60, 300)
print(settled(), full(), c.at_rest())
for f in (settled, full):
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(2000): f()
        best = min(best, (time.perf_counter() - t) / 2000)
    print(f.__name__, f"{best*1e6:.1f} us")
if len(sys.argv) > 1:
    import cProfile, pstats
    pr = cProfile.Profile(); pr.enable()
    for _ in range(2000): settled()
    pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(15)
