"""The lookup rounds of each adaptive reply in a `specdec bench --gammas "" --log-level debug` stderr log (gzipped or
not): rounds with γ > 0 and no draft hop ("rtt draft 0.0 ms"), as (γ, accepted). Each prompt runs target-only,
then adaptive; replies under 32 tokens (the warm-up's) are skipped. Usage: lookup_rounds.py LOG..."""
import collections
import gzip
import re
import sys

ROUND = re.compile(r"session (\w+) round γ=(\d+) accepted=(\d+) .* rtt draft ([\d.]+) ms")
FINISHED = re.compile(r"session (\w+) finished \(\w+\): (\d+) tokens")

for log in sys.argv[1:]:
    rounds, tokens, order = collections.defaultdict(list), {}, []
    with (gzip.open if log.endswith(".gz") else open)(log, "rt", encoding="utf-8", errors="replace") as lines:
        for line in lines:
            found = ROUND.search(line) if line.startswith("20") else None
            if found:
                if found[1] not in rounds:
                    order.append(found[1])
                rounds[found[1]].append((int(found[2]), int(found[3]), float(found[4])))
            done = FINISHED.search(line)
            if done:
                tokens[done[1]] = int(done[2])
    timed = [session for session in order if tokens.get(session, 0) >= 32]
    replies = [[(g, a) for g, a, rtt in rounds[session] if g > 0 and rtt == 0.0] for session in timed[1::2]]
    print(log.rsplit("/", 1)[-1], sum(map(len, replies)), "lookup rounds, (γ, accepted) per adaptive reply:", replies)
