"""Time the exact kernel on F16, BF16 and F32 weights [N, K] against the integer kernel on Q4_K, at 1/2/5/9 rows
(`PYTHONPATH=<checkout> python micro.py [N K]`; the weights stay in the L3 at these shapes, so not a pass's time)."""
import sys
import time

import torch

from specdec.engine.cpu import blockquant
from specdec.engine.cpu.blockquant import BF16, F16, F32, Q4_K, BlockQuantKernel
from specdec.engine.cpu.q8dot import Q8Kernel

N, K = (int(v) for v in (sys.argv[1:3] if len(sys.argv) > 2 else (8960, 1536)))
torch.manual_seed(0)
w = torch.randn(N, K) * 0.02
kernels = {name: BlockQuantKernel([blockquant.quantize(w, qtype)]) for name, qtype in (("F16", F16), ("BF16", BF16),
                                                                                        ("F32", F32))}
kernels["Q4_K q8"] = Q8Kernel([blockquant.quantize(w, Q4_K)])
for rows in (1, 2, 5, 9):
    x = torch.randn(rows, K)
    line = []
    for name, k in kernels.items():
        for _ in range(3): k(x)
        times = []
        for _ in range(15):
            t = time.perf_counter(); k(x); times.append(time.perf_counter() - t)
        best = sorted(times)[len(times) // 2]
        line.append(f"{name} {best * 1e3:6.2f} ms")
    print(f"{rows:2d} rows: " + " | ".join(line), flush=True)
print("weight MB: F16", N * K * 2 / 1e6, "F32", N * K * 4 / 1e6)
