"""Where an adaptive run's time went against target-only: from a `specdec bench --log-level debug` stderr log, each
session's rounds timed by their log lines and priced at the session's median target-only step. Per round kind:
plain (γ = 0, nothing accepted: target-only steps and missed lookups), lookup0 (γ = 0 with a lookup accepted),
model-after-plain (the draft model's first round after target-only ones: a probe, or drafting resumed, with the
draft's catch-up), model and lookup (later drafted rounds). Positive: seconds lost. Replies of 32 tokens or more
count (the warm-up's are shorter). Usage: acct.py LOG"""
import collections
import datetime
import re
import statistics
import sys


def ts(line):
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


sessions, emitted = collections.defaultdict(list), {}
for line in open(sys.argv[1], encoding="utf-8"):
    m = re.search(r"session (\w+) round γ=(\d+) accepted=(\d+)", line) if line.startswith("20") else None
    if m:
        sessions[m[1]].append((ts(line), int(m[2]), int(m[3]), "draft 0.0" in line))
    m = re.search(r"session (\w+) finished \(\w+\): (\d+) tokens", line)
    if m:
        emitted[m[1]] = int(m[2])
timed = {sid: rounds for sid, rounds in sessions.items()
         if emitted.get(sid, 0) >= 32}  # not the warm-up's (a drafting reply may take under 30 rounds for 64 tokens)
steps = {sid: [(b[0] - a[0]).total_seconds() for a, b in zip(rounds, rounds[1:])
               if b[1] == 0 and b[2] == 0 and a[1] == 0]
         for sid, rounds in timed.items()}
run_step = statistics.median(s for gaps in steps.values() for s in gaps)
total = collections.Counter()
for sid, rounds in timed.items():
    # A reply with fewer than 5 target-only steps after target-only rounds (one that drafted throughout): the run's.
    step = statistics.median(steps[sid]) if len(steps[sid]) >= 5 else run_step
    loss = collections.Counter()
    for a, b in zip(rounds, rounds[1:]):
        if b[1] == 0:
            kind = "lookup0" if b[2] > 0 else "plain"
        else:
            kind = "lookup" if b[3] else ("model-after-plain" if a[1] == 0 else "model")
        loss[kind] += (b[0] - a[0]).total_seconds() - (b[2] + 1) * step
    total.update(loss)
    print(sid[:8], "step %.1f ms" % (step * 1000), {k: round(v * 1000) for k, v in loss.items()})
print("all sessions, ms:", {k: round(v * 1000) for k, v in total.items()})
