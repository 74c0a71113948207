"""The static runner's step curve (compiled layers, CUDA graphs replayed) under each attention kernel, for the
target and the draft, alternating: which kernel `--runner static` should take on this GPU.

Usage: python scripts/gpu_attention.py [rounds, default 1] [output.json]. Each round times "sdpa" then "pool"
(SPECDEC_STATIC_ATTENTION) at S = 1, 9, 18, 36 and 72 rows after a PROFILE_CONTEXT prefix, medians of 20 passes.
On a machine without CUDA it runs the sdpa side alone (a dry run).
"""

from __future__ import annotations

import json
import os
import sys
from unittest import mock

import torch

from specdec.tools.bench.gpu import SYNTHETIC_DRAFT, SYNTHETIC_TARGET, static_curve

SIZES = [1, 9, 18, 36, 72]


def main(rounds: int = 1, output: str | None = None) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kernels = ("sdpa", "pool") if device.type == "cuda" else ("sdpa",)
    results: dict[str, dict[str, list]] = {}
    for _ in range(rounds):
        for attention in kernels:
            for role, spec in (("target", SYNTHETIC_TARGET), ("draft", SYNTHETIC_DRAFT)):
                with mock.patch.dict(os.environ, {"SPECDEC_STATIC_ATTENTION": attention}):
                    curve, start_s, _ = static_curve(spec, device, "bf16", SIZES, rows=9,
                                                     compiled=device.type == "cuda")
                ms = [round(1e3 * s, 3) for s in curve]
                results.setdefault(f"{role}-{attention}", {}).setdefault("ms", []).append(ms)
                print(f"{role:6} {attention:4} (start {start_s:.0f} s): "
                      + ", ".join(f"S={s} {t:.3f} ms" for s, t in zip(SIZES, ms)), flush=True)
    if output:
        with open(output, "w") as f:
            json.dump({"sizes": SIZES, "device": str(torch.cuda.get_device_name() if device.type == "cuda" else "cpu"),
                       **results}, f, indent=2)


if __name__ == "__main__":
    main(*[int(a) for a in sys.argv[1:2]], *sys.argv[2:3])
