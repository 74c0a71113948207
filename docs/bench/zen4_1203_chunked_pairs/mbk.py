"""Interleaved cases with one build: median q8_matmul time per case, ps per weight."""
import os, pathlib, sys, time
import numpy as np, torch
from specdec.engine.cpu import native
T = int(os.environ.get("QT", "14")); TH = int(os.environ.get("TH", "2"))
FMT = {12: (256, 144, [0, 2]), 14: (256, 210, [208]), 6: (32, 22, [0]), 2: (32, 18, [0])}
lib = native.open_library(pathlib.Path(sys.argv[1]), native.Q8DOT)
def mat(N, K):
    per, nbytes, dpos = FMT[T]; nb = N * K // per
    raw = np.random.default_rng(0).integers(0, 256, size=(nb, nbytes), dtype=np.uint8)
    d = np.full(nb, 0.001, np.float16).view(np.uint8).reshape(nb, 2)
    for p in dpos: raw[:, p:p + 2] = d
    src = torch.from_numpy(raw.reshape(N, -1).copy())
    out = torch.empty(N, lib.q8_row_bytes(T, K), dtype=torch.uint8)
    assert lib.q8_repack(T, src.data_ptr(), N, K, out.data_ptr()) == 0
    return out
cases = [tuple(map(int, c.split(":"))) for c in os.environ["CASES"].split(",")]
copies = int(os.environ.get("COPIES", "4")); REPS = int(os.environ.get("REPS", "60"))
data = []
for N, K, G in cases:
    ws = [mat(N, K) for _ in range(copies)]
    x = torch.randn(G, K); a = torch.empty(G, lib.q8_act_bytes(K), dtype=torch.uint8)
    lib.q8_quantize(x.data_ptr(), G, K, a.data_ptr())
    data.append((ws, a, torch.empty(G, N), []))
for r in range(REPS):
    for (N, K, G), (ws, a, y, ts) in zip(cases, data):
        t = time.perf_counter()
        lib.q8_matmul(T, ws[r % copies].data_ptr(), N, K, a.data_ptr(), G, y.data_ptr(), N, None, TH)
        ts.append(time.perf_counter() - t)
for (N, K, G), (_, _, _, ts) in zip(cases, data):
    m = float(np.median(ts)); print(f"N={N:6d} K={K:5d} G={G:2d}: {m*1e6:8.1f}us  {m*1e12/(N*K):6.1f} ps/weight", flush=True)
