"""The pool attention kernel alone at depth, its walk split in parts of SPLIT_N keys against walked whole: what a
long context costs one layer's attention, per session count, on the packaged target's attention shapes (12 query
heads on 2 KV heads of 128, a step of 1 row and a verify of 9).

Usage: python scripts/gpu_pool_depth.py [output.json]. On CUDA: CUDA-event medians of 50 calls after 5, bf16, at
depths 256 .. 8,192, and the largest difference between the two outputs. Without CUDA it runs one small depth
through Triton's interpreter (a dry run of the script).
"""

from __future__ import annotations

import json
import os
import sys

import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from specdec.engine.cuda import pool_attention as kernel  # noqa: E402

H, KV, D = 12, 2, 128
DEPTHS = [256, 1024, 2048, 4096, 8192] if CUDA else [300]
SHAPES = [(1, 1), (1, 9), (8, 1), (8, 9)] if CUDA else [(1, 1)]  # (sessions, rows each)


def time_ms(call) -> float:
    if not CUDA:
        return 0.0
    for _ in range(5):
        call()
    times = []
    for _ in range(50):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        call()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main(output: str | None = None) -> None:
    device, dtype = (torch.device("cuda"), torch.bfloat16) if CUDA else (torch.device("cpu"), torch.float32)
    rows, default = [], kernel.SPLIT_N
    for depth in DEPTHS:
        pool = depth + 16
        keys, values = (torch.randn(9, pool, KV, D, device=device, dtype=dtype) for _ in range(2))
        for sessions, S in SHAPES:
            q = torch.randn(H, sessions * S, D, device=device, dtype=dtype)
            positions = torch.arange(depth - S, depth, device=device).repeat(sessions, 1)  # [B, S]
            slots = torch.arange(1, sessions + 1, device=device)

            def call(split_n: int):
                kernel.SPLIT_N = split_n
                return kernel.pool_attention(q, keys, values, positions, slots, D ** -0.5, depth)

            split, whole = call(default), call(1 << 30)
            row = {"depth": depth, "sessions": sessions, "rows": S,
                   "split_ms": round(time_ms(lambda: call(default)), 4),
                   "whole_ms": round(time_ms(lambda: call(1 << 30)), 4),
                   "max_difference": float((split.float() - whole.float()).abs().max())}
            rows.append(row)
            print(json.dumps(row), flush=True)
    kernel.SPLIT_N = default
    if output:
        with open(output, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if CUDA else "cpu", "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main(*sys.argv[1:])
