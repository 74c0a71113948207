"""What each timed reply of a `specdec bench --gammas "" --log-level debug` stderr log was handed: per reply of 32
tokens or more (the warm-up's are shorter), in order, its first and last ĉ and which of its rounds drafted. In
that bench each prompt runs target-only, then adaptive, so an adaptive reply's first ĉ against the target-only
reply's last before it shows what the prior handed on against what the host measured just then. Usage: handed.py
LOG..."""
import re
import sys

ROUND = re.compile(r"session (\w+) round γ=(\d+) accepted=\d+ α̂=[\d.]+ ĉ=([\d.]+)")
FINISHED = re.compile(r"session (\w+) finished \(\w+\): (\d+) tokens")

for log in sys.argv[1:]:
    rounds, order, tokens = {}, [], {}
    for line in open(log, encoding="utf-8", errors="replace"):
        found = ROUND.search(line)
        if found:
            if found[1] not in rounds:
                rounds[found[1]] = []
                order.append(found[1])
            rounds[found[1]].append((int(found[2]), float(found[3])))
        done = FINISHED.search(line)
        if done:
            tokens[done[1]] = int(done[2])
    print(log.rsplit("/", 1)[-1])
    last_plain = None
    for session in (s for s in order if tokens.get(s, 0) >= 32):
        kept = rounds[session]
        drafted = [i for i, (gamma, _) in enumerate(kept) if gamma > 0]
        # the reply's first round is its prompt's, priced before it measured anything
        first, last = kept[min(1, len(kept) - 1)][1], kept[-1][1]
        versus = f" {first / last_plain:.2f} of the target-only reply's last" if drafted and last_plain else ""
        shown = drafted if len(drafted) <= 4 else f"{len(drafted)} rounds from {drafted[0]}"
        print(f"  {session[:8]} rounds {len(kept):3d} ĉ {first:.3f} -> {last:.3f}{versus}; drafted at {shown}")
        if not drafted:
            last_plain = last
