"""One build, one-row pairs on against off, alternating, whole passes of S tokens."""
import sys, statistics
from specdec import weights
from specdec.engine.models import load_model
from specdec.engine.measure import PassTimer
from specdec.engine.cpu.q8dot import set_one_row_pairs, library
from specdec.planning.cost import PROFILE_CONTEXT
sizes = [int(s) for s in sys.argv[1].split(",")]; reps = int(sys.argv[2])
loaded = load_model(weights.resolve(sys.argv[3] if len(sys.argv) > 3 else "packaged:target"), "cpu", dtype="gguf-q8")
libs = {id(h.lib): h.lib for h in [*loaded.runner.linear_kernels(), loaded.runner.fused] if h is not None and hasattr(h, "lib")}
timer = PassTimer(loaded.runner, max(sizes), max(sizes), loaded.vocab_size)
for s in sizes:
    t = {True: [], False: []}
    for r in range(reps):
        for on in ((True, False) if r % 2 == 0 else (False, True)):
            for lib in libs.values(): set_one_row_pairs(on, lib)
            t[on].append(timer.seconds(s))
    on, off = statistics.median(t[True]) * 1e3, statistics.median(t[False]) * 1e3
    print(f"S={s:2}  pairs {on:7.2f} ms (best {min(t[True])*1e3:7.2f})  single {off:7.2f} (best {min(t[False])*1e3:7.2f})  pairs/single {on/off:.3f}", flush=True)
