"""The start-up cost profile: how long a forward pass of S new tokens takes, S = 1..N.

Measured once per service at start-up, after a context of `CONTEXT` tokens, on this machine and
compute path. The γ controller plans with this curve from the first round (the verify of γ drafts
is one forward of γ+1 tokens); it only learns a scale for drift and load online.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.runner import ModelRunner, Step

log = logging.getLogger(__name__)

CONTEXT = 128


@contextlib.contextmanager
def machine_lock(name: str = "specdec-startup.lock"):
    """Held by one process on this machine at a time (a file lock in the temp folder).

    Services that share a machine load and profile one after the other: a profile measured while
    another process loads a model would time that process as much as this one.
    """
    path = Path(os.environ.get("SPECDEC_LOCK_DIR", tempfile.gettempdir())) / name
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True)
class CostProfile:
    """seconds[i]: one forward of tokens[i] new tokens (tokens ascending; empty means 1, 2, …, len(seconds)).

    The dense head (1..γ_max+1) prices one session's verify; the sparse tail prices a pass shared by
    many sessions, whose linear layers see the tokens of all of them.
    """

    seconds: tuple[float, ...]
    tokens: tuple[int, ...] = ()

    def __post_init__(self):
        if not self.tokens:
            object.__setattr__(self, "tokens", tuple(range(1, len(self.seconds) + 1)))
        if len(self.tokens) != len(self.seconds) or list(self.tokens) != sorted(set(self.tokens)):
            raise ValueError(f"cost profile sizes {self.tokens} do not match {len(self.seconds)} timings")

    def forward_s(self, tokens: float) -> float:
        """Seconds for `tokens` new tokens: interpolated between measured sizes, linear past the last."""
        sizes, seconds = self.tokens, self.seconds
        tokens = max(tokens, sizes[0])
        at = bisect.bisect_left(sizes, tokens)
        if at < len(sizes) and sizes[at] == tokens:
            return seconds[at]
        if at == len(sizes):  # past the measured range: extend the last segment's slope
            if len(sizes) == 1:
                return seconds[0]
            at -= 1
        lo, hi = at - 1, at
        slope = max(seconds[hi] - seconds[lo], 0.0) / (sizes[hi] - sizes[lo])
        return seconds[lo] + slope * (tokens - sizes[lo])

    def upper_bound_s(self, tokens: int) -> float:
        """A generous estimate for any size: past the measured range, the largest forward per chunk."""
        largest = self.tokens[-1]
        return self.forward_s(tokens) if tokens <= largest else self.seconds[-1] * -(-tokens // largest)

    def ratio(self, tokens: int) -> float:
        """forward(S) / forward(1): 1 means scoring S tokens costs no more than scoring one."""
        return self.forward_s(tokens) / self.seconds[0]


def batch_sizes(max_tokens: int, batch_tokens: int) -> list[int]:
    """The profiled sizes: every size 1..max_tokens, then doubling up to `batch_tokens`."""
    sizes = list(range(1, max_tokens + 1))
    while sizes[-1] * 2 <= batch_tokens:
        sizes.append(sizes[-1] * 2)
    return sizes


def measure(runner: ModelRunner, max_tokens: int, batch_tokens: int = 0, repeats: int = 3,
            vocab: int | None = None) -> CostProfile:
    """Time forwards after a CONTEXT-token prefix; best of `repeats` per size.

    Sizes are 1..max_tokens (one session's verify) and doubling up to `batch_tokens` (a shared pass).
    They are interleaved within each repeat, so slow drift of the machine affects them alike. The
    shared-pass sizes are compute-bound and steady, so they are timed once after the warm-up: repeating
    them would add seconds to every start-up.
    """
    vocab = vocab or runner.embed.num_embeddings
    sizes = batch_sizes(max_tokens, batch_tokens)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (CONTEXT + sizes[-1],), generator=gen).tolist()
    cache = runner.new_cache()
    began = time.perf_counter()
    runner.forward([Step(cache, tokens[:CONTEXT])])
    best = [float("inf")] * len(sizes)
    for repeat in range(repeats + 1):  # the first pass warms up every size
        for i, size in enumerate(sizes):
            if repeat > 1 and size > max_tokens:
                continue
            t0 = time.perf_counter()
            runner.forward([Step(cache, tokens[CONTEXT:CONTEXT + size], logits=size)])
            best[i] = min(best[i], time.perf_counter() - t0)
            cache.crop(CONTEXT)
    profile = CostProfile(tuple(best), tuple(sizes))
    log.info("cost profile (%.1f s): forward of %s tokens = %s ms; S=%d costs %.2fx S=1",
             time.perf_counter() - began, ",".join(map(str, sizes)), " ".join(f"{s * 1e3:.0f}" for s in best),
             max_tokens, profile.ratio(max_tokens))
    return profile


@dataclass(frozen=True)
class RoundTimeout:
    """The deadline of one hop of one round: `factor`× its expected compute, within [floor, ceiling].

    A hop that misses it is treated as failed: a hung peer degrades service instead of hanging it.
    """

    floor_s: float = 30.0
    ceiling_s: float = 300.0
    factor: float = 20.0

    @classmethod
    def capped(cls, ceiling_s: float) -> "RoundTimeout":
        """The default floor, lowered to `ceiling_s` when the ceiling is below it."""
        return cls(floor_s=min(cls.floor_s, ceiling_s), ceiling_s=ceiling_s)

    def of(self, expected_s: float) -> float:
        return min(self.ceiling_s, max(self.floor_s, self.factor * expected_s))
