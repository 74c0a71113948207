"""q8_matmul median time per build, alternating in one process: QT format (12 Q4_K, 14 Q6_K), TH threads,
CASES "N:K:G,...", COPIES of the weights rotated (4: from memory), REPS. Usage: mb3.py A.so [B.so ...]"""
import os, pathlib, sys, time
import numpy as np, torch
from specdec.engine.cpu import native
T = int(os.environ.get("QT", "14")); TH = int(os.environ.get("TH", "2"))
FMT = {12: (256, 144, [0, 2]), 14: (256, 210, [208]), 6: (32, 22, [0]), 2: (32, 18, [0])}
libs = [native.open_library(pathlib.Path(p), native.Q8DOT) for p in sys.argv[1:]]
def mat(lib, N, K):
    per, nbytes, dpos = FMT[T]; nb = N * K // per
    raw = np.random.default_rng(0).integers(0, 256, size=(nb, nbytes), dtype=np.uint8)
    d = np.full(nb, 0.001, np.float16).view(np.uint8).reshape(nb, 2)
    for p in dpos: raw[:, p:p + 2] = d
    src = torch.from_numpy(raw.reshape(N, -1).copy())
    out = torch.empty(N, lib.q8_row_bytes(T, K), dtype=torch.uint8)
    assert lib.q8_repack(T, src.data_ptr(), N, K, out.data_ptr()) == 0
    return out
REPS = int(os.environ.get("REPS", "60"))
for case in os.environ.get("CASES", "1536:8960:5").split(","):
    N, K, G = map(int, case.split(":"))
    # several copies of the weights so each call reads from memory
    copies = int(os.environ.get("COPIES", "4"))
    ws = [[mat(lib, N, K) for _ in range(copies)] for lib in libs]
    x = torch.randn(G, K); acts = []
    for lib in libs:
        a = torch.empty(G, lib.q8_act_bytes(K), dtype=torch.uint8); lib.q8_quantize(x.data_ptr(), G, K, a.data_ptr()); acts.append(a)
    ys = [torch.empty(G, N) for _ in libs]; ts = [[] for _ in libs]
    for r in range(REPS):
        for i, lib in enumerate(libs):
            w = ws[i][r % copies]
            t = time.perf_counter()
            lib.q8_matmul(T, w.data_ptr(), N, K, acts[i].data_ptr(), G, ys[i].data_ptr(), N, None, TH)
            ts[i].append(time.perf_counter() - t)
    meds = [float(np.median(t)) * 1e6 for t in ts]
    same = all(torch.equal(ys[0], y) for y in ys)
    print(f"N={N:5d} K={K} G={G}: " + "  ".join(f"{m:8.1f}us ({m / meds[0]:.3f})" for m in meds) + ("" if same else "  DIFFERENT BITS"), flush=True)
