"""Run `specdec bench` in process, logging every GammaController.choose with its inputs."""
import sys, time, logging
from specdec.planning import controller as C
orig = C.GammaController.choose
log = open(sys.argv[1], "w")
def choose(self, max_useful=None, unseen=1):
    due = self._probe_due()
    steps, interval = self.steps_without_draft, self.probe_interval
    g = orig(self, max_useful, unseen)
    cap = self.gamma_max if max_useful is None else max(0, min(self.gamma_max, max_useful))
    r = self.rates(cap)
    log.write(f"{time.time():.3f} ctl={id(self)%100000} g={g} probing={self.probing} due={due} steps={steps} "
              f"interval={interval} unseen={unseen} n={self.target_sessions.value:.2f} nd={self.draft_sessions.value:.2f} "
              f"fp={self.target_fill_plain.value} fd={self.target_fill_drafting.value} a={self.acceptance.alpha:.3f} "
              f"s1={self.target_scale_at(1):.2f} st={self.target_scale.value:.2f} sd={self.draft_scale.value:.2f} "
              f"r0={r[0]:.2f} r1={r.get(1,0):.2f} r2={r.get(2,0):.2f} v0={self.verify_time(0)*1e3:.0f} v1={self.verify_time(1)*1e3:.0f} "
              f"ds={self.draft_step()*1e3:.0f} untried={self.untried()} sizes={ {k: round(v,2) for k,v in self.target_sizes.snapshot().items()} } samples={self.target_sizes.samples} s16={self.target_scale_at(16):.2f}\n")
    log.flush()
    return g
C.GammaController.choose = choose
from specdec.cli.main import main
sys.exit(main(sys.argv[2:]))
