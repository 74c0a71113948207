"""One thread, one q8dot build or several alternating: q8_matmul's median time on a random matrix of one format.

Usage: QT=12 .venv/bin/python mb2.py A.so [B.so ...]   (QT: 12 Q4_K, 14 Q6_K, 6 Q5_0, 2 Q4_0)
Prints, per case (rows N, width K, activation rows G), each build's microseconds and its ratio to the first, and
ns per row and unit of 512 weights for the first; DIFFERENT BITS if the builds' outputs differ. The cases below are
the last ones run; the section "Two weight rows, one activation load" of docs/PERFORMANCE.md edited them per
experiment (cached: a few hundred rows; from memory: thousands).
"""
import os
import pathlib
import sys
import time

import numpy as np
import torch

from specdec.engine.cpu import native

T = int(os.environ.get("QT", "12"))
FMT = {12: (256, 144, [0, 2]), 14: (256, 210, [208]), 6: (32, 22, [0]), 2: (32, 18, [0])}  # weights, bytes, f16 at
libs = [native.open_library(pathlib.Path(p), native.Q8DOT) for p in sys.argv[1:]]


def mat(lib, N, K):
    """N rows of K random weights in format T (scales 0.001), repacked by `lib`."""
    per, nbytes, dpos = FMT[T]
    nb = N * K // per
    raw = np.random.default_rng(0).integers(0, 256, size=(nb, nbytes), dtype=np.uint8)
    d = np.full(nb, 0.001, np.float16).view(np.uint8).reshape(nb, 2)
    for p in dpos:
        raw[:, p:p + 2] = d
    src = torch.from_numpy(raw.reshape(N, -1).copy())
    out = torch.empty(N, lib.q8_row_bytes(T, K), dtype=torch.uint8)
    assert lib.q8_repack(T, src.data_ptr(), N, K, out.data_ptr()) == 0
    return out


cases = [(512, 1536, 2, 400), (512, 1536, 4, 400), (512, 1536, 5, 400), (8960, 1536, 2, 30), (8960, 1536, 5, 30)]
for N, K, G, reps in cases:
    ws = [mat(lib, N, K) for lib in libs]
    x = torch.randn(G, K)
    acts = []
    for lib in libs:
        a = torch.empty(G, lib.q8_act_bytes(K), dtype=torch.uint8)
        lib.q8_quantize(x.data_ptr(), G, K, a.data_ptr())
        acts.append(a)
    ys = [torch.empty(G, N) for _ in libs]
    ts = [[] for _ in libs]
    for _ in range(reps):
        for i, lib in enumerate(libs):
            t = time.perf_counter()
            lib.q8_matmul(T, ws[i].data_ptr(), N, K, acts[i].data_ptr(), G, ys[i].data_ptr(), N, None, 1)
            ts[i].append(time.perf_counter() - t)
    meds = [float(np.median(t)) * 1e6 for t in ts]
    same = all(torch.equal(ys[0], y) for y in ys)
    print(f"N={N:5d} K={K} G={G} ns/ru {meds[0] * 1e3 / (N * K / 512 * G):.2f}: "
          + "  ".join(f"{m:8.1f}us ({m / meds[0]:.3f})" for m in meds) + ("" if same else "  DIFFERENT BITS"))
