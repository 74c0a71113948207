"""CUDA graphs of a static-shape forward, one per bucket, captured on first use and replayed.

A graph owns its input tensors on the device; `run` copies a pass's inputs into them (from the host or the
device; an input given as the very tensor the graph was captured with is a constant, not copied again),
replays, and returns the graph's own output tensor, which the next replay of that graph overwrites (callers
copy what they keep before replaying it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

log = logging.getLogger(__name__)

WARMUP_RUNS = 2  # eager runs on a side stream before capture (lazy initialisation, autotuning)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]  # its own, on the device
    given: tuple[torch.Tensor, ...]  # what it was captured with
    output: torch.Tensor


class GraphBank:
    """`forward(*inputs) -> output` captured per input shape. All graphs share one memory pool."""

    def __init__(self, forward: Callable[..., torch.Tensor], device: torch.device):
        self.forward, self.device = forward, device
        self._graphs: dict[tuple, _Graph] = {}
        self._pool = None

    def run(self, *inputs: torch.Tensor) -> torch.Tensor:
        key = tuple((tuple(t.shape), t.dtype) for t in inputs)
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._graphs[key] = self._capture(inputs)
        for static, given, value in zip(entry.inputs, entry.given, inputs, strict=True):
            if value is not given:
                static.copy_(value, non_blocking=True)
        entry.graph.replay()
        return entry.output

    def capture(self, *inputs: torch.Tensor) -> None:
        """Capture the graph for these inputs' shapes now (at start-up), running it on them."""
        self.run(*inputs)

    def _capture(self, inputs: tuple[torch.Tensor, ...]) -> _Graph:
        static = tuple(t.to(self.device, copy=True) for t in inputs)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_RUNS):
                self.forward(*static)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            output = self.forward(*static)
        self._pool = graph.pool()
        log.debug("captured a CUDA graph for inputs %s", [tuple(t.shape) for t in inputs])
        return _Graph(graph, static, inputs, output)

    def __len__(self) -> int:
        return len(self._graphs)
