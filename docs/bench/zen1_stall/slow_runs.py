"""Over debug logs of `specdec bench --log-level debug`: runs of slow target-only steps (over 1.5x the reply's median
step, replies of 20 or more such steps), counted by length (6: six or more). Usage: slow_runs.py LOG..."""
import collections
import datetime
import re
import statistics
import sys

ROUND = re.compile(r"session (\w{8})\w* round γ=(\d+) accepted=(\d+) ")


def timestamp(line):
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


lengths, steps = collections.Counter(), 0
for log in sys.argv[1:]:
    replies = collections.defaultdict(list)
    for line in open(log, encoding="utf-8"):
        found = ROUND.search(line) if line.startswith("20") else None
        if found:
            replies[found[1]].append((timestamp(line), int(found[2]), int(found[3])))
    for rounds in replies.values():
        gaps = [(b[0] - a[0]).total_seconds() for a, b in zip(rounds, rounds[1:])
                if a[1] == 0 and b[1] == 0 and b[2] == 0]
        if len(gaps) < 20:
            continue
        median, run, steps = statistics.median(gaps), 0, steps + len(gaps)
        for gap in gaps + [0.0]:
            if gap > 1.5 * median:
                run += 1
            elif run:
                lengths[min(run, 6)], run = lengths[min(run, 6)] + 1, 0
print("target-only steps", steps, "| runs of slow steps by length:", sorted(lengths.items()))
