"""`specdec bench --cpu-curve gguf-q8,gguf`: the target's forward time for S = 1, 2, 5, 9 new tokens on each
CPU path, against its two floors, with llama.cpp's own curve beside it when given.

- Bandwidth floor: the weight bytes a pass reads (every linear kernel, the output layer included; the
  embedding is looked up, not read) ÷ memory bandwidth (2 threads summing 1 GiB, best of 5).
- Compute floor: S × the multiply-adds of one token ÷ the integer dot product's peak on this CPU (the
  build's dot instructions on cached rows and register-resident weights, nothing else: `dot_peak`).
  Beside it, the kernel's own rate on a cache-resident Q4_K matrix at 16 rows (its float steps, weight
  unpacking and loads included): how far the kernel's arithmetic is from the instructions' peak.
- llama.cpp: `llama-bench -m <the same GGUF> -t 2 -p 1,2,5,9 -n 0 -o json > llama.json`, passed with
  `--llama-bench llama.json`: a prompt batch of S tokens is llama.cpp's verify of S tokens.
It writes JSON and a PNG of the curves.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdec import weights
from specdec.engine.cpu.blockquant import Q4_K, quantize
from specdec.engine.cpu.q8dot import Q8Kernel, dot_peak
from specdec.engine.kernels import time_kernel
from specdec.engine.measure import PassTimer
from specdec.engine.models import load_model

SIZES = (1, 2, 5, 9)
REPEATS = 5  # the best of this many passes per size


def memory_bandwidth() -> float:
    """Bytes per second that the torch threads read from memory (summing 1 GiB, best of 5)."""
    data = torch.ones(2**28, dtype=torch.float32)
    best = float("inf")
    for _ in range(6):
        began = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - began)
    return data.numel() * 4 / best


def kernel_rate(rows: int = 16, n: int = 2048, k: int = 1536) -> float:
    """Multiply-adds per second of the gguf-q8 kernel on a Q4_K matrix that stays in cache (best of 20)."""
    return rows * n * k / time_kernel([Q8Kernel([quantize(torch.randn(n, k), Q4_K)])], rows, repeats=20)


def read_llama_bench(path: str) -> dict[int, float]:
    """Seconds per prompt batch of S tokens from `llama-bench -o json` (its records with n_gen = 0)."""
    if not path:
        return {}
    return {r["n_prompt"]: r["n_prompt"] / r["avg_ts"] for r in json.loads(Path(path).read_text()) if r["n_gen"] == 0}


def weight_traffic(runner) -> tuple[int, int]:
    """(bytes read, multiply-adds) of one token's pass through every linear kernel."""
    kernels = runner.linear_kernels()
    return sum(k.weight_bytes() for k in kernels), sum(k.in_features * k.out_features for k in kernels)


def measure_path(spec: str, path: str, repeats: int) -> dict:
    loaded = load_model(spec, "cpu", dtype=path)
    timer = PassTimer(loaded.runner, max(SIZES), max(SIZES), loaded.vocab_size)
    seconds = {size: min(timer.seconds(size) for _ in range(repeats)) for size in SIZES}
    read, macs = weight_traffic(loaded.runner)
    return {"path": path, "kernel": loaded.choice.kernel, "weight_bytes": read, "macs_per_token": macs,
            "forward_ms": {s: round(t * 1e3, 2) for s, t in seconds.items()},
            "s5_over_s1": round(seconds[5] / seconds[1], 2)}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in result["paths"]:
        ax.plot(SIZES, [row["forward_ms"][s] for s in SIZES], "o-", label=f"{row['path']} ({row['kernel']})")
    if result["llama_cpp_ms"]:
        ax.plot(SIZES, [result["llama_cpp_ms"][s] for s in SIZES], "s--", label="llama.cpp (llama-bench, prompt of S)")
    ax.plot(SIZES, [result["floor_ms"][s] for s in SIZES], "k:", label="floor: max(bytes ÷ bandwidth, MACs ÷ peak)")
    ax.set_xlabel("tokens per forward (S)")
    ax.set_ylabel("ms per forward")
    ax.set_title(f"Target forward time against its floors\n{result['hardware']}")
    ax.set_xticks(SIZES)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run_cpu_curve(args: argparse.Namespace) -> int:
    from specdec.engine.cpu.features import cpu_features

    spec = weights.resolve(args.target_model)
    paths = [p for p in args.cpu_curve.split(",") if p]
    bandwidth, peak, rate = memory_bandwidth(), dot_peak(torch.get_num_threads()), kernel_rate()
    rows = [measure_path(spec, path, REPEATS) for path in paths]
    q8 = next((r for r in rows if r["path"] == "gguf-q8"), rows[0])
    floor = {s: round(max(q8["weight_bytes"] / bandwidth, s * q8["macs_per_token"] / peak) * 1e3, 2) for s in SIZES}
    llama = {s: round(t * 1e3, 2) for s, t in read_llama_bench(args.llama_bench).items() if s in SIZES}
    result = {"hardware": cpu_features().describe(), "threads": torch.get_num_threads(),
              "bandwidth_GBps": round(bandwidth / 1e9, 1), "dot_peak_GMACps": round(peak / 1e9, 1),
              "kernel_rate_GMACps": round(rate / 1e9, 1),
              "bandwidth_floor_ms": round(q8["weight_bytes"] / bandwidth * 1e3, 2), "floor_ms": floor,
              "paths": rows, "llama_cpp_ms": llama if len(llama) == len(SIZES) else {}}
    print(f"machine: {result['hardware']}, {result['threads']} threads; bandwidth {result['bandwidth_GBps']} GB/s, "
          f"integer dot peak {result['dot_peak_GMACps']} G multiply-adds/s, the kernel at 16 cached rows "
          f"{result['kernel_rate_GMACps']}")
    print(" S | " + " | ".join(f"{r['path']:>10}" for r in rows) + " | llama.cpp |   floor (ms)")
    for s in SIZES:
        cells = [f"{r['forward_ms'][s]:10.1f}" for r in rows]
        print(f"{s:2d} | " + " | ".join(cells) + f" | {llama.get(s, float('nan')):9.1f} | {floor[s]:8.1f}")
    output = Path(args.output)
    output.write_text(json.dumps(result, indent=2))
    plot(result, output.with_suffix(".png"))
    print(f"wrote {output} and {output.with_suffix('.png')}")
    return 0
