"""One process: median one-token and five-token pass of the packaged target (40 each) and their ratio; run
alternately under different environments (here OMP_WAIT_POLICY=ACTIVE against the default)."""
import sys, statistics, torch
from specdec import weights
from specdec.engine.models import load_model
from specdec.engine.measure import PassTimer
loaded = load_model(weights.resolve("packaged:target"), "cpu", dtype="gguf-q8")
timer = PassTimer(loaded.runner, 5, 5, loaded.vocab_size)
out = []
for s in (1, 5):
    for _ in range(3): timer.seconds(s)
    out.append(statistics.median(timer.seconds(s) * 1e3 for _ in range(40)))
print(sys.argv[1], " ".join(f"{v:.2f}" for v in out), f"{out[1]/out[0]:.3f}", flush=True)
