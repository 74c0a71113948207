"""A/B of blockquant builds (`python ab.py <model> a.so,b.so [rounds]`, the builds made by hand with the flags
`native.build` uses) on a model's forward passes: every BlockQuantKernel's library swapped in turn, PassTimer's
passes of 1/2/5/9 tokens, the builds in turn each round, three passes a size; the best so far printed each round."""
import gc
import sys
from pathlib import Path

from specdec.engine.cpu import native
from specdec.engine.cpu.blockquant import BlockQuantKernel
from specdec.engine.measure import PassTimer
from specdec.engine.models import load_model

spec, libs = sys.argv[1], sys.argv[2].split(",")
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
loaded = load_model(spec, "cpu", dtype="gguf-q8")
print(loaded.choice.kernel, flush=True)
kernels = [o for o in gc.get_objects() if isinstance(o, BlockQuantKernel)]  # inside the gguf-q8 kernels
print(len(kernels), "exact kernels", flush=True)
opened = {path: native.open_library(Path(path)) for path in libs}
timer = PassTimer(loaded.runner, 9, 9, loaded.vocab_size)
best = {path: {s: float("inf") for s in (1, 2, 5, 9)} for path in libs}
for r in range(rounds):
    for path in libs:
        for k in kernels:
            k.lib = opened[path]
        for s in (1, 2, 5, 9):
            for _ in range(3):
                best[path][s] = min(best[path][s], timer.seconds(s))
    so_far = {p.split("/")[-1]: {s: round(t * 1e3, 1) for s, t in b.items()} for p, b in best.items()}
    print("round", r, so_far, flush=True)
for p, b in best.items():
    print(p.split("/")[-1], {s: round(t * 1e3, 1) for s, t in b.items()}, "S5/S1", round(b[5] / b[1], 2))
