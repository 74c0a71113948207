"""The kernels of one decode step of the static runner, by device time: its layers eager and compiled, its
attention scaled_dot_product_attention ("sdpa") or the Triton kernel over the pool ("pool").

Where a step's time goes on a GPU: how many kernels one step launches and which take the time. The
runner runs without its CUDA graphs here, so that the profiler sees each kernel (a graph replays the same
kernels). Usage: python scripts/gpu_kernels.py [model spec] [steps] [variants, default
compiled-sdpa,compiled-pool]; on a machine without CUDA it profiles the CPU (a dry run: its attention sdpa).
"""

from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from specdec.engine.measure import PassTimer, release_memory
from specdec.engine.models import load_hf_model, resolve_device
from specdec.engine.static.runner import StaticRunner


def main(spec: str = "synthetic:target", steps: int = 5, variants: str = "compiled-sdpa,compiled-pool") -> None:
    device = resolve_device("auto")
    activity = ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU
    for variant in variants.split(","):
        layers, attention = variant.split("-")
        compiled = layers == "compiled"
        attention = attention if device.type == "cuda" else "sdpa"
        model = load_hf_model(spec, device, torch.bfloat16)
        runner = StaticRunner(model, "bf16", slots=2, rows=9, graphs=False, compile=compiled, attention=attention)
        timer = PassTimer(runner, runner.rows, runner.rows)
        for _ in range(3):
            timer.seconds(1)  # compiles, warms
        with profile(activities=[activity]) as prof:
            for _ in range(steps):
                timer.seconds(1)
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA] \
            if device.type == "cuda" else [e for e in prof.events() if e.cpu_parent is None]
        busy_us = sum(e.device_time if device.type == "cuda" else e.cpu_time for e in events) / steps
        print(f"\n== {spec}, layers {layers}, attention {attention}: {len(events) / steps:.0f} kernels a "
              f"step, {busy_us / 1e3:.2f} ms of kernel time a step", flush=True)
        sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=sort, row_limit=18, max_name_column_width=70), flush=True)
        del runner, model, timer
        release_memory(device)


if __name__ == "__main__":
    main(*(sys.argv[1:2] or ["synthetic:target"]), *[int(a) for a in sys.argv[2:3]], *sys.argv[3:4])
