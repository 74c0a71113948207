"""Where a service's host time goes while 8 users decode target-only: py-spy samples the target service's
Python, only the thread that holds the GIL (`--gil`: the work that runs one thread at a time, between passes on
a GPU), and this prints the functions that take the most of it, by their own time and with what they call.

On an H200 at 8 users a target pass came every 4.4 ms for a 2.5 ms device step (docs/PERFORMANCE.md, "The GPU
path"), and handing the sessions' steps to one thread did not shorten it: this says what the rest is.
Usage: python scripts/host_profile.py [bench flags, e.g. --device cuda] [--seconds 15]; needs py-spy on PATH
(or in /tmp/site/bin, where scripts/gpu_check.sh installs the wheels). The draft and target default to the
synthetic pair; --device cpu --dtype bfloat16 with small synthetic models dry-runs it.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from specdec.cli.main import build_parser
from specdec.cli.options import stack_options
from specdec.launch.stack import EmbeddedStack
from specdec.tools.bench.concurrency import run_level
from specdec.tools.bench.gpu import SYNTHETIC_DRAFT, SYNTHETIC_TARGET
from specdec.tools.bench.speed import load_prompts, warm_up

OURS = ("specdec/", "target_service/", "orchestrator/", "protos/")


def py_spy() -> str:
    found = shutil.which("py-spy") or ("/tmp/site/bin/py-spy" if os.path.exists("/tmp/site/bin/py-spy") else None)
    if found is None:
        sys.exit("py-spy not found (pip install py-spy, or scripts/gpu_wheels.sh and scripts/gpu_check.sh)")
    return found


def summarise(raw: str, top: int = 25) -> str:
    """py-spy's raw output (one `frame;frame;... count` line per stack, outermost first) as two tables: each
    function's own samples (the innermost frame, by line), and ours with everything they call (by function)."""
    own, inclusive, total = collections.Counter(), collections.Counter(), 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames, n = stack.split(";"), int(count)
        total += n
        own[frames[-1]] += n
        for function in {re.sub(r":\d+\)$", ")", frame) for frame in frames}:  # each function once a stack
            if any(part in function for part in OURS):
                inclusive[function] += n
    if not total:
        return "no samples (was the GIL ever held?)"
    lines = [f"{total} samples with the GIL held", "", "own time (innermost frame):"]
    lines += [f"  {100 * n / total:5.1f}%  {frame}" for frame, n in own.most_common(top)]
    lines += ["", "ours, with what they call:"]
    lines += [f"  {100 * n / total:5.1f}%  {frame}" for frame, n in inclusive.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    seconds = 15
    if "--seconds" in argv:
        at = argv.index("--seconds")
        seconds, argv = int(argv[at + 1]), argv[:at] + argv[at + 2:]
    args = build_parser().parse_args(["bench", "--draft-model", SYNTHETIC_DRAFT, "--target-model", SYNTHETIC_TARGET,
                                      "--max-new-tokens", "128", *argv])
    prompts = [p["prompt"] for p in load_prompts(args.prompts, args.limit_prompts or 3)]
    users = [prompts[i % len(prompts)] for i in range(8)]
    with EmbeddedStack(stack_options(args, max_sessions=16)) as stack, tempfile.TemporaryDirectory() as folder:
        warm_up(stack.endpoint, prompts[0], args.gamma_max)
        run_level(stack.endpoint, users, args.max_new_tokens, 0)  # the first 8-user passes, untimed
        raw, log = os.path.join(folder, "raw.txt"), os.path.join(folder, "py-spy.log")
        with open(log, "w") as errors:  # a file, not a pipe nobody reads while it samples
            spy = subprocess.Popen([py_spy(), "record", "--pid", str(stack.target.proc.pid), "--gil", "--nonblocking",
                                    "--format", "raw", "--rate", "1000", "--duration", str(seconds), "-o", raw],
                                   stdout=subprocess.DEVNULL, stderr=errors)
            tokens, began = 0, time.perf_counter()
            while spy.poll() is None:
                tokens += run_level(stack.endpoint, users, args.max_new_tokens, 0).tokens
        rate = tokens / (time.perf_counter() - began)
        if spy.returncode != 0 or not os.path.exists(raw):
            with open(log) as errors:
                sys.exit(f"py-spy failed ({spy.returncode}): {errors.read().strip()}")
        print(f"8 users, target-only: {rate:.1f} tok/s while sampled")
        with open(raw) as f:
            print(summarise(f.read()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
