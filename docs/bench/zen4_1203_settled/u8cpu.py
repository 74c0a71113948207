"""Run `specdec bench --concurrency ...` with every run_level wrapped: CPU seconds per process (and the
orchestrator's busiest threads) over each run, beside its tok/s; per round, the CPU time (`time.thread_time`) of a
few orchestrator methods (COSTS), the rounds' proposers and how many settled (PROPS). SPY=1: py-spy (from
/tmp/spyenv) records the orchestrator's process over each run. Usage, with PYTHONPATH at the code to measure:
.venv/bin/python docs/bench/zen4_1203_settled/u8cpu.py --concurrency 8 --repeats 4 --no-hf --output /tmp/r.json"""
import os, sys, time, collections
import psutil
import specdec.tools.bench.concurrency as conc

me = psutil.Process()
orig = conc.run_level
order = collections.Counter()

def label(p):
    c = " ".join(p.cmdline())
    for k in ("draft", "target"):
        if k in c:
            return k + ("-tp" if "worker" in c else "")
    return "other:" + c[:40]

def snap():
    out = {"orch": sum(me.cpu_times()[:2])}
    for ch in me.children(recursive=True):
        try:
            out[label(ch) + f"[{ch.pid}]"] = sum(ch.cpu_times()[:2])
        except psutil.Error:
            pass
    threads = {}
    for t in me.threads():
        try:
            name = open(f"/proc/{me.pid}/task/{t.id}/comm").read().strip()
        except OSError:
            name = "?"
        threads[f"{name}:{t.id}"] = t.user_time + t.system_time
    return out, threads

def wrapped(endpoint, prompts, n, gamma, target=None, stream=conc._stream):
    a, ta = snap()
    spy = None
    name0 = "TO" if gamma == 0 else "AD"
    if os.environ.get("SPY"):
        import subprocess, signal
        spy = subprocess.Popen(["/tmp/spyenv/bin/py-spy", "record", "-p", str(me.pid), "-r", "200", "-f", "raw",
                                "-o", f"/tmp/u8/spy_{name0}{order[name0] + 1}.txt", "--nonblocking"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
    t0 = time.perf_counter()
    level = orig(endpoint, prompts, n, gamma, target, stream)
    if spy is not None:
        spy.send_signal(signal.SIGINT); spy.wait()
    wall = time.perf_counter() - t0
    b, tb = snap()
    name = "TO" if gamma == 0 else "AD"
    order[name] += 1
    cpu = {k: b[k] - a.get(k, 0.0) for k in b}
    by_name = collections.Counter()
    for k, v in tb.items():
        by_name[k.split(":")[0]] += v - ta.get(k, 0.0)
    global costs, calls
    extra = " ".join(f"{k}={1e3*v/max(calls[k],1):.3f}ms/{calls[k]}" for k, v in sorted(costs.items()))
    costs.clear(); calls.clear()
    print("  PROPS " + " ".join(f"{k}={v}" for k, v in sorted(props.items())), flush=True); props.clear()
    print("  COSTS " + extra, flush=True)
    print(f"RUN {name}{order[name]} tok/s {level.tokens / level.seconds:.2f} wall {wall:.2f} rows {level.target_rows:.2f} "
          + " ".join(f"{k}={v:.2f}" for k, v in sorted(cpu.items()))
          + " | threads " + " ".join(f"{k}={v:.2f}" for k, v in by_name.most_common(6)), flush=True)
    return level

conc.run_level = wrapped
props = collections.Counter()
_orig_round = None

import threading as _th
from orchestrator import generation as _gen, lookups as _lk, sessions as _ss
from specdec.planning import controller as _ctl
costs = collections.Counter()
calls = collections.Counter()
_lock = _th.RLock()
def timed(cls, name, label=None):
    fn = getattr(cls, name)
    key = label or f"{cls.__name__}.{name}"
    def w(*a, **k):
        t = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            d = time.thread_time() - t
            with _lock:
                costs[key] += d; calls[key] += 1
    setattr(cls, name, w)
for cls, name in [(_gen.Generation, "_decide"), (_gen.Generation, "_round"), (_gen.Generation, "_sources"),
                  (_gen.Generation, "_push"), (_lk.Lookups, "observe_shadow"), (_lk.Lookups, "sync"),
                  (_lk.Lookups, "priced"), (_ctl.GammaController, "observe"), (_ss.TargetSession, "verify"),
                  (_gen.Generation, "_annotate"), (_lk.Lookups, "found_alphas"), (_lk.Lookups, "_find"),
                  (_ctl.GammaController, "settled"), (_ctl.GammaController, "best_free"), (_gen.Generation, "_settled"),
                  (_gen.Generation, "_choose")]:
    if not hasattr(cls, name):
        continue
    timed(cls, name)
_r = _gen.Generation._round
def _round2(self, *a, **k):
    rec, verdict, new = _r(self, *a, **k)
    with _lock:
        props["rounds"] += 1
        if rec.proposer:
            props[rec.proposer + "_rounds"] += 1
            props[rec.proposer + "_drafted"] += rec.drafted
            props[rec.proposer + "_accepted"] += rec.accepted
    return rec, verdict, new
_gen.Generation._round = _round2
_s = _gen.Generation._settled
def _settled2(self, cap, *rest):
    out = _s(self, cap, *rest)
    with _lock:
        props["settled" if out else ("unsettled_rest" if self.controller.at_rest() else "unsettled_notrest")] += 1
        props["nsizes_max"] = max(props["nsizes_max"], len(self.controller.target_sizes.sizes))
        props["nmeasured_max"] = max(props["nmeasured_max"], sum(1 for v in self.controller.target_sizes.samples.values() if v))
    return out
_gen.Generation._settled = _settled2

from specdec.cli.main import main
sys.argv = ["specdec", "bench", *sys.argv[1:]]
sys.exit(main())
