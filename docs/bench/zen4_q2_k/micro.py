"""Per-format Q8Kernel time at S rows, [N, K] random blocks; median of repeats (ms)."""
import sys, time, statistics, torch
sys.path.insert(0, "/work/main/tests")
from test_gguf_path import random_blocks
from specdec.engine.cpu.blockquant import BlockTensor, Q2_K, Q3_K, Q4_K, Q6_K, NAMES
from specdec.engine.cpu.q8dot import Q8Kernel
N, K = 8960, 1536
kernels = {q: Q8Kernel([BlockTensor.from_numpy(q, random_blocks(q, N, K, seed=q), K)]) for q in (Q4_K, Q3_K, Q2_K, Q6_K)}
for S in (1, 2, 5, 9):
    x = torch.randn(S, K)
    row = []
    for q, k in kernels.items():
        for _ in range(3): k(x)
        ts = []
        for _ in range(30):
            t = time.perf_counter(); k(x); ts.append(time.perf_counter() - t)
        row.append(f"{NAMES[q]} {statistics.median(ts)*1e3:.3f}")
    print(S, " ".join(row), flush=True)
