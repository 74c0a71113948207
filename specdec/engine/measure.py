"""Measuring a model's start-up cost profile (`specdec.planning.cost.CostProfile`) on this machine."""

from __future__ import annotations

import gc
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import torch

from specdec.engine.kvcache import KVCache
from specdec.engine.runner import ModelRunner, Step
from specdec.planning.cost import PROFILE_CONTEXT, CostProfile, batch_sizes

log = logging.getLogger(__name__)
T = TypeVar("T")
DEPTH_PROBE = 2048  # cached positions past PROFILE_CONTEXT at which the profile times attention's growth


PassProgress = Callable[[int, int], None]  # (tokens fed so far, tokens in all) of a measurement's passes


def measure(runner: ModelRunner, max_tokens: int, batch_tokens: int = 0, repeats: int = 3,
            vocab: int | None = None, progress: PassProgress | None = None) -> CostProfile:
    """Time forwards after a PROFILE_CONTEXT-token prefix; best of `repeats` per size. `progress` is told the
    tokens its passes have fed after each pass (a first start on a machine spends 5-20 s here).

    The passes run on a thread of their own, as a service's do (`off_the_initial_thread`).

    Sizes are 1..max_tokens (one session's verify) and doubling up to `batch_tokens` (a shared pass:
    sessions of max_tokens tokens each, as the batcher forms it). They are interleaved within each
    repeat, so slow drift of the machine affects them alike. The shared-pass sizes are repeated too:
    timed once after the warm-up, one slow pass of 18 tokens (133.6 ms where 9 took 53.7 and 36 took
    219.9; 124 / 57 / 234 an hour later) priced a pass of 32 rows at 1.7× one of 16 (measured: 1.96×), and
    16 users drafted where it did not pay. It costs the first start on a machine about 2 s more (the profile
    is kept: `specdec.engine.profile_cache`). A device's queue is drained before each clock reading.

    A forward of fewer tokens does no more work than one of more, so each size's time is capped by every
    larger size's (`monotone`): on a busy host a pass preempted in all of its repeats (10 ms and more
    on a 2 ms step, measured beside two busy loops) would otherwise price a target-only step above a
    verify of several tokens, and speculation with a useless draft would look cheaper than decoding.
    """
    return off_the_initial_thread(_measure, runner, max_tokens, batch_tokens, repeats, vocab, progress)


def off_the_initial_thread(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs) on a thread of its own, as a service's passes run on its step batcher's thread. From a
    process's initial thread the C kernels split their work on libgomp, from any other on their own pool
    (`csrc/workers.c`), and the two differ: on a Zen 4 the start-up thread's target profile said 26.5–36.2 ms for
    one token and 1.26–1.41× that for 3, where the pool that serves took 25.2–25.8 ms and 1.59×. So the start-up
    profile and the in-process baselines of `specdec bench` run where the services' passes run."""
    with ThreadPoolExecutor(1, thread_name_prefix="passes") as thread:
        return thread.submit(fn, *args, **kwargs).result()


def _measure(runner: ModelRunner, max_tokens: int, batch_tokens: int, repeats: int, vocab: int | None,
             progress: PassProgress | None) -> CostProfile:
    sizes = batch_sizes(max_tokens, batch_tokens)
    began = time.perf_counter()
    depth_sizes = (1, max_tokens)
    total = (repeats + 1) * (sum(sizes) + sum(depth_sizes))
    bench = PassTimer(runner, max_tokens, sizes[-1], vocab,
                      None if progress is None else lambda fed: progress(min(fed, total), total))
    best = [float("inf")] * len(sizes)
    for _ in range(repeats + 1):  # the first pass warms up every size
        for i, size in enumerate(sizes):
            best[i] = min(best[i], bench.seconds(size))
    per_position = per_position_s(bench, depth_sizes, {1: best[0], max_tokens: best[max_tokens - 1]}, repeats)
    profile = CostProfile(monotone(best), tuple(sizes), per_position)
    log.info("cost profile (%.1f s): forward of %s tokens = %s ms; S=%d costs %.2fx S=1; attention at depth "
             "%.0f ns a token and position", time.perf_counter() - began, ",".join(map(str, sizes)),
             " ".join(f"{s * 1e3:.0f}" for s in profile.seconds), max_tokens, profile.ratio(max_tokens),
             per_position * 1e9)
    return profile


def per_position_s(bench: "PassTimer", sizes: tuple[int, ...], shallow: dict[int, float], repeats: int) -> float:
    """What attention adds to a pass per new token and cached position past PROFILE_CONTEXT: the same passes
    (`sizes` tokens, best `shallow` seconds each) timed again DEPTH_PROBE positions deeper, their added time
    pooled over their token-positions (attention's work grows as both). The deeper positions are the cache's
    own storage, not computed (attention's cost does not depend on what it reads), so it costs a few passes.
    0 where the runner's caches are not `KVCache`s (the static runner's slots: not measured) or the context is
    too short to probe."""
    positions = bench.deepen(DEPTH_PROBE)
    if positions < DEPTH_PROBE // 4:
        bench.deepen(0)
        return 0.0
    deep = dict.fromkeys(sizes, float("inf"))
    for _ in range(repeats + 1):
        for size in sizes:
            deep[size] = min(deep[size], bench.seconds(size))
    bench.deepen(0)
    added = sum(max(deep[size] - shallow[size], 0.0) for size in deep)  # each size once (1 may be the largest)
    return added / (sum(deep) * positions)


def monotone(seconds: list[float]) -> tuple[float, ...]:
    """Each time capped by every later (larger) size's: the largest non-decreasing curve below the timings."""
    capped = list(seconds)
    for i in range(len(capped) - 2, -1, -1):
        capped[i] = min(capped[i], capped[i + 1])
    return tuple(capped)


class PassTimer:
    """Times one forward pass of `size` new tokens after a PROFILE_CONTEXT-token prefix (or deeper: `deepen`):
    a verify of `size` tokens up to `rows`, past it sessions of `rows` tokens each sharing the pass. `on_pass`: told
    the tokens its timed passes have fed so far (`fed`), after each."""

    def __init__(self, runner: ModelRunner, rows: int, largest: int, vocab: int | None = None,
                 on_pass: Callable[[int], None] | None = None):
        self.runner, self.rows, self.on_pass, self.fed = runner, rows, on_pass, 0
        gen = torch.Generator().manual_seed(0)
        vocab = vocab or runner.embed.num_embeddings
        self.tokens = torch.randint(0, vocab, (PROFILE_CONTEXT + rows,), generator=gen).tolist()
        self.caches = [runner.new_cache() for _ in range(-(-largest // rows))]
        for cache in self.caches:
            runner.forward([Step(cache, self.tokens[:PROFILE_CONTEXT])])
        self.context = PROFILE_CONTEXT  # the positions a pass comes after

    def deepen(self, positions: int) -> int:
        """From now on passes come after PROFILE_CONTEXT + `positions` cached positions (at most what the
        caches hold; 0: back to the prefix): the positions past the prefix are the caches' storage as it
        stands, finite (zeroed as allocated, or earlier passes' entries), never computed. Returns the
        positions added; 0 where the caches are not `KVCache`s."""
        if not all(isinstance(cache, KVCache) for cache in self.caches):
            return 0
        positions = max(min(positions, self.caches[0].max_length - PROFILE_CONTEXT - self.rows), 0)
        for cache in self.caches:
            cache.crop(PROFILE_CONTEXT)
            cache.reserve(PROFILE_CONTEXT + positions + self.rows)
            cache.length = PROFILE_CONTEXT + positions
        self.context = PROFILE_CONTEXT + positions
        return positions

    def seconds(self, size: int) -> float:
        """One pass of `size` tokens, the device's queue drained before each clock reading; the caches
        are cropped back to their context after it."""
        rows = self.rows
        shares = [rows] * (size // rows) + ([size % rows] if size % rows else [])
        steps = [Step(cache, self.tokens[PROFILE_CONTEXT:PROFILE_CONTEXT + n], logits=n)
                 for cache, n in zip(self.caches, shares)]
        synchronize(self.runner.device)
        began = time.perf_counter()
        self.runner.forward(steps)
        synchronize(self.runner.device)
        elapsed = time.perf_counter() - began
        for cache in self.caches:
            cache.crop(self.context)
        self.fed += size
        if self.on_pass is not None:
            self.on_pass(self.fed)
        return elapsed


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op off CUDA): before a clock reading."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release_memory(device: torch.device) -> None:
    """Collect what a dropped model left and, on CUDA, hand its cached blocks back (before loading the next)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
