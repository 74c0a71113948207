"""Multiply-adds per second of the loaded target's integer linears at S rows (2026-12-04, the Zen 3): each shape
swept over every layer (weights from memory) and one layer's matrix repeated (from the caches), and the down
projections of each format apart. Run from the repo root: .venv/bin/python docs/bench/zen3_kernel_tries/rates.py"""
import statistics
import time

import torch

from specdec import weights
from specdec.engine.models import load_model

runner = load_model(weights.resolve("packaged:target"), "cpu", dtype="gguf-q8").runner


def median_ms(f, n=15):
    times = []
    for _ in range(n):
        began = time.perf_counter()
        f()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def rate(kernel, rows, ms):
    return kernel.in_features * kernel.out_features * rows / ms / 1e6  # G multiply-adds/s


downs = {fmt: next(l.down for l in runner.layers if fmt in l.down.name) for fmt in ("Q4_K", "Q6_K")}
shapes = {name: [getattr(l, name) for l in runner.layers] for name in ("gate_up", "down", "qkv")}
shapes["output"] = [runner.linear_kernels()[-1]]
for name, kernels in shapes.items():
    for rows in (1, 2, 3, 4, 5, 8, 9, 16):
        x = torch.randn(rows, kernels[0].in_features)
        swept = median_ms(lambda: [k.matmul(x) for k in kernels]) / len(kernels)
        cached = median_ms(lambda: [kernels[0].matmul(x) for _ in range(10)]) / 10
        print(f"{name:8} S={rows:2d} swept {swept:7.3f} ms ({rate(kernels[0], rows, swept):5.1f} G/s)  "
              f"cached {cached:7.3f} ms ({rate(kernels[0], rows, cached):5.1f} G/s)")
for fmt, kernel in downs.items():
    for rows in (1, 2, 3, 4, 5, 8, 9):
        x = torch.randn(rows, kernel.in_features)
        cached = median_ms(lambda: [kernel.matmul(x) for _ in range(10)]) / 10
        print(f"down {fmt} S={rows:2d} cached {cached:7.3f} ms ({rate(kernel, rows, cached):5.1f} G/s)")
