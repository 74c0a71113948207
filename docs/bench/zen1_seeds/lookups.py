"""What lookups won and lost in the adaptive replies of a `specdec bench --gammas "" --log-level debug` stderr log
(every second reply of 32 tokens or more: each prompt runs target-only, then adaptive). A round of γ = 0 that
accepted tokens is a lookup's hit, priced against its tokens at the reply's median target-only step; one that
accepted none and took over 1.3 steps is counted a miss (a verify of 2 costs 1.6 steps on a Zen 1), priced against
one step. Positive: milliseconds lost. Usage: lookups.py LOG..."""
import collections
import datetime
import re
import statistics
import sys

ROUND = re.compile(r"session (\w+) round γ=(\d+) accepted=(\d+)")
FINISHED = re.compile(r"session (\w+) finished \(\w+\): (\d+) tokens")


def stamp(line):
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


for log in sys.argv[1:]:
    rounds, tokens = collections.defaultdict(list), {}
    for line in open(log, encoding="utf-8", errors="replace"):
        found = ROUND.search(line) if line.startswith("20") else None
        if found:
            rounds[found[1]].append((stamp(line), int(found[2]), int(found[3])))
        done = FINISHED.search(line)
        if done:
            tokens[done[1]] = int(done[2])
    timed = [session for session in rounds if tokens.get(session, 0) >= 32]
    lost, count = collections.Counter(), collections.Counter()
    for session in timed[1::2]:
        kept = rounds[session]
        step = statistics.median((b[0] - a[0]).total_seconds() for a, b in zip(kept, kept[1:])
                                 if a[1] == b[1] == b[2] == 0)
        for a, b in zip(kept, kept[1:]):
            if a[1] or b[1]:
                continue
            took = (b[0] - a[0]).total_seconds()
            kind = "hit" if b[2] else "miss" if took > 1.3 * step else None
            if kind:
                lost[kind] += took - (b[2] + 1) * step
                count[kind] += 1
    print(log.rsplit("/", 1)[-1], {kind: f"{count[kind]} rounds, {round(1000 * lost[kind])} ms" for kind in lost})
