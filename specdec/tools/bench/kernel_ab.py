"""`specdec bench --kernel-ab A.so,B.so`: two builds of the integer kernel (`csrc/q8dot.c`: a baseline's and a
change's, both of this CPU's level, whose weight layout the model is repacked in) on the target's own weights in
one process, each measurement alternating between them. What a kernel change is worth on this CPU, measured
beside its baseline rather than minutes apart on a shared machine that drifts by 15-20%
(`python -m specdec.engine.cpu.native` prints where this source's build lies; a baseline's is built the same way
from its checkout).

- Per linear (q/k/v, out, gate/up, down, the output layer) at S rows (`--kernel-ab-sizes`, 1, 2, 3 and 5
  unless told): a measurement is one sweep over every layer's matrix, so that the weights come from memory as
  in a pass and both builds time the same matrices (the layers' formats differ: Q4_K_M gives some down
  projections Q6_K); each build's median time a matrix and their ratio, B over A.
- Whole passes of S tokens after a short prefix (`PassTimer`), both builds swapped into every kernel of the one
  loaded model (its linears and its layers' one-call loop, attention included); with `--kernel-ab-depths`, passes
  after that many tokens of context too (an attention change shows there), the context fed once and kept.
The two must compute the same bits (one definition): every linear's output and every pass's logits at depth are
compared, and a difference fails. It writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specdec import weights
from specdec.engine.cpu import native
from specdec.engine.cpu.features import cpu_features
from specdec.engine.cpu.q8dot import set_one_row_pairs, states_one_row_pairs
from specdec.engine.measure import PassTimer
from specdec.engine.models import load_model
from specdec.engine.runner import Step
from specdec.planning.cost import PROFILE_CONTEXT
from specdec.tools.bench.depth import context_tokens, fill_to

LINEARS = ("qkv", "out", "gate_up", "down")


class Builds:
    """The loaded model's holders of its integer kernel library, and the two builds to swap into them."""

    def __init__(self, runner, paths: list[str], one_row_pairs: bool = False):
        holders = [*runner.linear_kernels(), runner.fused, getattr(runner.fused, "compiled", None)]
        self.holders = [h for h in holders if h is not None and hasattr(h, "lib")]
        if not self.holders:
            raise SystemExit("--kernel-ab: the target does not run on the gguf-q8 path")
        self.libs = [native.open_library(Path(p), native.Q8DOT) for p in paths]
        levels, loaded = [lib.q8_level().decode() for lib in self.libs], self.holders[0].lib.q8_level().decode()
        if set(levels) != {loaded}:  # each level repacks the weights in its own layout
            raise SystemExit(f"--kernel-ab: builds of one level, the loaded model's ({loaded}); these are "
                             f"{', '.join(levels)}")
        # the one-row setting the load timed for this process, in each build that can take it
        self.one_row_pairs = [set_one_row_pairs(one_row_pairs, lib) for lib in self.libs]

    def use(self, which: int) -> None:
        for holder in self.holders:
            holder.lib = self.libs[which]


def _alternating(measure, builds: Builds, repeats: int) -> tuple[list[float], list[float]]:
    """Each build's times for `measure()`, the two alternating (A B, then B A, ...)."""
    times = ([], [])
    for r in range(repeats):
        for which in ((0, 1) if r % 2 == 0 else (1, 0)):
            builds.use(which)
            times[which].append(measure())
    builds.use(0)
    return times


def _both(compute, builds: Builds) -> list:
    """compute() under each build, A then B; the baseline left in place."""
    outputs = []
    for which in (0, 1):
        builds.use(which)
        outputs.append(compute())
    builds.use(0)
    return outputs


def _row(name: str, size: int, times: tuple[list[float], list[float]], context: int | None = None) -> dict:
    a, b = (statistics.median(t) * 1e3 for t in times)
    where = {} if context is None else {"context": context}
    return {"name": name, "rows": size, **where, "a_ms": round(a, 4), "b_ms": round(b, 4),
            "b_over_a": round(b / a, 3)}


def linear_rows(runner, builds: Builds, sizes, repeats: int) -> list[dict]:
    """Per linear and size: sweeps over every layer's matrix (from memory), outputs compared between the builds."""
    rows = []
    head = runner.linear_kernels()[-1]  # the output layer, or its cut (`limit_vocabulary`)
    groups = {name: [getattr(layer, name) for layer in runner.layers] for name in LINEARS} | {"output": [head]}
    for name, kernels in groups.items():
        for size in sizes:
            x = torch.randn(size, kernels[0].in_features, generator=torch.Generator().manual_seed(size))

            def measure() -> float:  # a sweep over every layer's matrix: each build times the same ones
                began = time.perf_counter()
                for kernel in kernels:
                    kernel.matmul(x)
                return (time.perf_counter() - began) / len(kernels)

            times = _alternating(measure, builds, repeats)
            if not all(map(torch.equal, *_both(lambda: [kernel.matmul(x) for kernel in kernels], builds))):
                raise AssertionError(f"--kernel-ab: the two builds' {name} outputs differ at {size} rows")
            rows.append(_row(name, size, times))
    return rows


def pass_rows(loaded, builds: Builds, sizes, repeats: int) -> list[dict]:
    timer = PassTimer(loaded.runner, max(sizes), max(sizes), loaded.vocab_size)
    return [_row("pass", size, _alternating(lambda: timer.seconds(size), builds, repeats), PROFILE_CONTEXT)
            for size in sizes]


def depth_rows(loaded, builds: Builds, sizes, depths, repeats: int) -> list[dict]:
    """Per depth (ascending) and size: one session's pass of that many tokens after that many of context, the
    cache cropped back after each; the two builds' logits compared at every depth and size."""
    runner, rows = loaded.runner, []
    tokens = context_tokens(loaded.vocab_size, max(depths) + max(sizes))
    cache = runner.new_cache()
    for depth in sorted(depths):
        fill_to(runner, cache, tokens, depth)
        for size in sizes:
            def forward() -> torch.Tensor:
                logits = runner.forward([Step(cache, tokens[depth:depth + size], logits=size)])[0]
                cache.crop(depth)
                return logits

            def measure() -> float:
                began = time.perf_counter()
                forward()
                return time.perf_counter() - began

            times = _alternating(measure, builds, repeats)
            if not torch.equal(*_both(forward, builds)):
                raise AssertionError(f"--kernel-ab: the two builds' logits differ at {size} rows after {depth}")
            rows.append(_row("pass", size, times, depth))
    return rows


def _sizes(text: str, option: str = "--kernel-ab-sizes", what: str = "row counts") -> tuple[int, ...]:
    from specdec.cli.options import positive_ints

    sizes = positive_ints(text)
    if not sizes:
        raise SystemExit(f"{option}: positive {what}, comma-separated (got {text!r})")
    return tuple(sizes)


def run_kernel_ab(args: argparse.Namespace) -> int:
    paths = [p for p in args.kernel_ab.split(",") if p]
    if len(paths) != 2:
        raise SystemExit("--kernel-ab takes two builds: A.so,B.so")
    repeats, sizes = args.kernel_ab_repeats, _sizes(args.kernel_ab_sizes)
    depths = _sizes(args.kernel_ab_depths, "--kernel-ab-depths", "context lengths") if args.kernel_ab_depths else ()
    loaded = load_model(weights.resolve(args.target_model), "cpu", dtype="gguf-q8")
    builds = Builds(loaded.runner, paths, states_one_row_pairs(loaded.choice.kernel))
    rows = linear_rows(loaded.runner, builds, sizes, repeats) + pass_rows(loaded, builds, sizes, repeats)
    if depths:
        rows += depth_rows(loaded, builds, sizes, depths, repeats)
    result = {"hardware": cpu_features().describe(), "threads": torch.get_num_threads(), "a": paths[0],
              "b": paths[1], "one_row_pairs": builds.one_row_pairs, "repeats": repeats, "rows": rows}
    pairs = ["one-row pairs" if on else "single rows" for on in builds.one_row_pairs]
    print(f"machine: {result['hardware']}, {result['threads']} threads; A {paths[0]} ({pairs[0]}), B {paths[1]} "
          f"({pairs[1]}); medians of {repeats}, alternating")
    print(f"{'':8} {'S':>2} | {'context':>7} | {'A ms':>9} | {'B ms':>9} | B/A")
    for row in rows:
        print(f"{row['name']:8} {row['rows']:2d} | {row.get('context', ''):>7} | {row['a_ms']:9.3f} | "
              f"{row['b_ms']:9.3f} | {row['b_over_a']:.3f}")
    Path(args.output).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.output}")
    return 0
