"""One layer's matrix again and again (L3-resident) against every layer's in turn (from memory)."""
import sys, time, statistics, torch
from specdec import weights
from specdec.engine.models import load_model
loaded = load_model(weights.resolve("packaged:target"), "cpu", dtype="gguf-q8")
layers = loaded.runner.layers
for name, fmt in (("gate_up", "Q4_K"), ("down", "Q4_K")):
    ks = [getattr(l, name) for l in layers if getattr(l, name).name.endswith(fmt)]
    for s in (1, 3, 5, 8):
        x = torch.randn(s, ks[0].in_features)
        def sweep(kk):
            t = time.perf_counter()
            for k in kk: k.matmul(x)
            return (time.perf_counter() - t) / len(kk)
        hot, cold = [], []
        for r in range(16):
            cold.append(sweep(ks)); hot.append(sweep([ks[0]] * len(ks)))
        h, c = statistics.median(hot) * 1e3, statistics.median(cold) * 1e3
        print(f"{name}:{fmt} S={s}: same matrix {h:.3f} ms, every layer's {c:.3f} ms, ratio {c/h:.2f}", flush=True)
