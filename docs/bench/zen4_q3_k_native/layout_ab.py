"""Two builds of the integer kernel whose Q3_K layouts differ (each repacks the same Q3_K weights its own way):
q8_matmul on the 1.5B target's gate/up [17920, 1536] and down [1536, 8960] shapes, random Q3_K blocks, at 1, 2 and
5 rows, both threads, alternating; median ms a call of each and B over A. Usage: layout_ab.py A.so B.so [rounds].
`specdec bench --kernel-ab` cannot do this: its two builds share the loaded model's repacked weights."""

import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from specdec.engine.cpu import native

Q3_K, rounds = 11, int(sys.argv[3]) if len(sys.argv) > 3 else 30
libs = [native.open_library(Path(p), native.Q8DOT) for p in sys.argv[1:3]]
rng = np.random.default_rng(0)
threads = torch.get_num_threads()
for rows_w, cols in ((17920, 1536), (1536, 8960)):
    raw = rng.integers(0, 256, (rows_w, cols // 256, 110), dtype=np.uint8)
    raw[..., 108:110] = (rng.random((rows_w, cols // 256)) * 1e-3).astype(np.float16).view(np.uint8).reshape(
        rows_w, -1, 2)
    raw = torch.from_numpy(raw.reshape(rows_w, -1))
    packed = []
    for lib in libs:
        data = torch.empty(rows_w, lib.q8_row_bytes(Q3_K, cols), dtype=torch.uint8)
        assert lib.q8_repack(Q3_K, raw.data_ptr(), rows_w, cols, data.data_ptr()) == 0
        packed.append(data)
    for S in (1, 2, 5):
        x = torch.randn(S, cols)
        act = torch.empty(S, libs[0].q8_act_bytes(cols), dtype=torch.uint8)
        libs[0].q8_quantize(x.data_ptr(), S, cols, act.data_ptr())
        ys = [torch.empty(S, rows_w) for _ in libs]
        times = [[], []]
        for _ in range(rounds):
            for i, lib in enumerate(libs):
                began = time.perf_counter()
                lib.q8_matmul(Q3_K, packed[i].data_ptr(), rows_w, cols, act.data_ptr(), S, ys[i].data_ptr(), rows_w,
                              None, threads)
                times[i].append(time.perf_counter() - began)
        assert torch.equal(ys[0], ys[1]), "the two builds differ"
        a, b = (statistics.median(t) * 1e3 for t in times)
        print(f"[{rows_w}, {cols}] S={S}: A {a:.3f} ms, B {b:.3f} ms, B/A {b / a:.3f}")
