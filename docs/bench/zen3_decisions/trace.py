"""Decision trace over random controller states: every price and choice, as exact reprs, for an old/new A/B."""
import random, sys
from specdec.planning.controller import GammaController
from specdec.planning.cost import CostProfile
from specdec.core.rounds import PassLoad, RoundRecord

out = []
for seed in range(300):
    r = random.Random(seed)
    tok = tuple(range(1, 10)) + (16, 32, 64, 128)
    g1, g2 = r.uniform(0.02, 0.6), r.uniform(0.02, 0.4)
    s1 = r.uniform(0.002, 0.06)
    tgt = CostProfile(tuple(s1 * (1 + g1 * (s - 1)) for s in tok), tok, r.choice([0.0, 1e-6]))
    dft = CostProfile(tuple(s1 * r.uniform(0.1, 0.8) * (1 + g2 * (s - 1)) for s in tok), tok, r.choice([0.0, 3e-7]))
    c = GammaController(8, tgt, dft, target_chunk_s=r.choice([0.0, 0.02]))
    c.context = r.randint(0, 3000)
    c.generated = r.randint(0, 300)
    for i in range(r.randint(1, 60)):
        g = r.choice([0, 0, 0, 1, 2, 3, 5, 8])
        acc = r.randint(0, g)
        n = r.randint(1, 8)
        tl = PassLoad(sessions=n, rows=r.uniform(1, n), tokens=r.randint(1, 40), wait_s=r.uniform(0, 0.01),
                      forward_s=r.uniform(0.001, 0.1)) if r.random() < 0.7 else PassLoad()
        rec = RoundRecord(gamma=g, drafted=g, accepted=acc, emitted=acc + 1, wall_s=r.uniform(0.01, 0.5),
                          draft_wall_s=r.uniform(0, 0.1) * (g > 0), draft_compute_s=r.uniform(0, 0.08) * (g > 0),
                          target_wall_s=r.uniform(0.01, 0.3), target_compute_s=r.uniform(0.005, 0.25),
                          draft_steady=r.random() < 0.8, draft_load=PassLoad(), target_load=tl,
                          overlapped=r.random() < 0.2, target_passes=r.choice([1, 1, 1, 3]))
        c.observe(rec)
        if r.random() < 0.2:
            c.observe_branch(r.randint(0, 4), r.uniform(0, 0.05), r.choice([None, True, False]))
        with c.one_decision():
            useful = r.randint(1, 100)
            unseen = r.choice([1, 1, 2, 40, 500])
            cap = min(8, useful)
            alphas = {cap: r.uniform(0, 0.99), min(cap, 3): r.uniform(0, 0.99)}
            row = [c.settled(cap, alphas), c.overlap_pays(useful, r.choice([None, None, 2]))]
            c.overlapping = row[-1]
            row += [c.choose(useful, unseen), c.probing, c.rates(cap), c.best_free(alphas[cap], cap),
                    c.confidence_threshold(), c.catch_up_rate(2, unseen, useful), c.feed_ahead(useful, unseen),
                    c.plain_rate(c.plain_steps(useful)), c.target_time(3), c.draft_time(unseen, 3),
                    c.trial_affordable(3, unseen, useful), c.probe_loss(2, unseen, 10.0)]
        out.append(repr(row))
open(sys.argv[1], "w").write("\n".join(out))
print(len(out), "decisions")
