"""by_format.py with one-row pairs forced on in both builds."""
import sys, time, statistics, torch
from specdec import weights
from specdec.engine.models import load_model
from specdec.tools.bench.kernel_ab import Builds, _alternating, _both, LINEARS
a, b = sys.argv[1].split(","); sizes = [int(s) for s in sys.argv[2].split(",")]; reps = int(sys.argv[3])
pairs = (sys.argv[5] != "0") if len(sys.argv) > 5 else True
loaded = load_model(weights.resolve("packaged:target"), "cpu", dtype="gguf-q8")
builds = Builds(loaded.runner, [a, b], pairs)
groups = {}
for name in LINEARS:
    for layer in loaded.runner.layers:
        k = getattr(layer, name); groups.setdefault(f"{name}:{k.name.removeprefix('gguf-q8-')}", []).append(k)
only = sys.argv[4].split(",") if len(sys.argv) > 4 and sys.argv[4] else None
for g, ks in groups.items():
    if only and g not in only: continue
    for s in sizes:
        x = torch.randn(s, ks[0].in_features, generator=torch.Generator().manual_seed(s))
        def measure():
            t = time.perf_counter()
            for k in ks: k.matmul(x)
            return (time.perf_counter() - t) / len(ks)
        ta, tb = _alternating(measure, builds, reps)
        assert all(map(torch.equal, *_both(lambda: [k.matmul(x) for k in ks], builds)))
        ma, mb = statistics.median(ta) * 1e3, statistics.median(tb) * 1e3
        print(f"{g:22} n={len(ks):2} S={s:2}  A {ma:7.3f}  B {mb:7.3f}  B/A {mb/ma:.3f}", flush=True)
