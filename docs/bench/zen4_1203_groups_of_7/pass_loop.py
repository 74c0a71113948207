"""Passes of S tokens in a loop for `seconds`, so that a sampling profiler can see where a pass's CPU goes.

Usage: .venv/bin/python pass_loop.py S SECONDS &   then, once /tmp/k/ready exists:
    perf record -e cpu-clock -F 2000 -p <pid> -o perf.data -- sleep 15
    perf report -i perf.data -s pid,sym --stdio      (per thread: the main thread and libgomp's worker)
This VM has no hardware counters (`perf stat -e cycles`: not supported); cpu-clock sampling works.
"""
import sys, time, torch
from specdec import weights
from specdec.engine.models import load_model
from specdec.engine.measure import PassTimer
loaded = load_model(weights.resolve("packaged:target"), "cpu", dtype="gguf-q8")
S = int(sys.argv[1])
timer = PassTimer(loaded.runner, S, S, loaded.vocab_size)
for _ in range(3): timer.seconds(S)
open("/tmp/k/ready", "w").write("1")
t = time.time()
n = 0
while time.time() - t < float(sys.argv[2]):
    timer.seconds(S); n += 1
print("passes", n, (time.time() - t) / n * 1e3, "ms")
