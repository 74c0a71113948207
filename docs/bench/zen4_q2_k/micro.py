"""Per-format gguf-q8 matmul time (ms, median of 30) at 1, 2, 5 and 9 rows on random [8960, 1536] blocks:
Q4_K, Q3_K, Q2_K, Q6_K side by side in one run (`.venv/bin/python docs/bench/zen4_q2_k/micro.py`)."""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from test_gguf_path import random_blocks
from specdec.engine.cpu.blockquant import BlockTensor, Q2_K, Q3_K, Q4_K, Q6_K, NAMES
from specdec.engine.cpu.q8dot import Q8Kernel
N, K = 8960, 1536
kernels = {q: Q8Kernel([BlockTensor.from_numpy(q, random_blocks(q, N, K, seed=q), K)])
           for q in (Q4_K, Q3_K, Q2_K, Q6_K)}
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
