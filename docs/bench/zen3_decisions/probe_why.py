"""Wrap GammaController.probe_loss inside choose: print a sample of due-but-unaffordable probes."""
import sys, collections, threading
from specdec.planning import controller as ctl
rows = []
lock = threading.Lock()
orig = ctl.GammaController.probe_loss
def probe_loss(self, gamma, unseen, plain_rate):
    loss = orig(self, gamma, unseen, plain_rate)
    allowed = self.probe_share() * self.steps_without_draft * self.verify_time(0)
    with lock:
        rows.append((id(self), gamma, unseen, round(loss * 1e3, 2), round(allowed * 1e3, 2), self.steps_without_draft,
                     self.probe_interval, round(self.round_time(gamma) * 1e3, 2), round(self.catch_up_time(gamma, unseen) * 1e3, 2),
                     round(1e3 / plain_rate, 2), round(self.acceptance.alpha, 3)))
    return loss
ctl.GammaController.probe_loss = probe_loss
import atexit
def report():
    print("PROBES", len(rows), "(ctl, gamma, unseen, loss ms, allowed ms, steps, interval, round ms, catch-up ms, plain ms/token, alpha)")
    by = collections.defaultdict(list)
    for r in rows: by[r[0]].append(r)
    for k, v in list(by.items())[:6]:
        for r in v[:3] + v[len(v)//2:len(v)//2+2] + v[-3:]:
            print("  ", r[1:])
        print("   n=", len(v))
atexit.register(report)
from specdec.cli.main import main
sys.argv = ["specdec", "bench", *sys.argv[1:]]
sys.exit(main())
