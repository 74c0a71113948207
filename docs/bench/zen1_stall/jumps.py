"""Per debug log of `specdec bench --log-level debug`: how many target-only rounds (γ = 0) moved their session's ĉ by
more than 12% (a step's scale moved by one round), and acct.py's losses per round kind. Usage: jumps.py LOG..."""
import pathlib
import re
import subprocess
import sys

ACCT = pathlib.Path(__file__).resolve().parent.parent / "zen1_probes" / "acct.py"
ROUND = re.compile(r"session (\w{8})\w* round γ=(\d+) accepted=\d+ α̂=[\d.]+ ĉ=([\d.]+)")

for log in sys.argv[1:]:
    last_c, jumps = {}, 0
    for line in open(log, encoding="utf-8"):
        found = ROUND.search(line)
        if not found:
            continue
        session, gamma, c = found[1], int(found[2]), float(found[3])
        if session in last_c and gamma == 0 and abs(c - last_c[session]) / last_c[session] > 0.12:
            jumps += 1
        last_c[session] = c
    losses = subprocess.run([sys.executable, str(ACCT), log], capture_output=True, text=True).stdout.splitlines()
    print(pathlib.Path(log).name, "ĉ jumps", jumps, "|", losses[-1] if losses else "no sessions")
