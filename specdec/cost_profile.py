"""The start-up cost profile: how long a forward pass of S new tokens takes, S = 1..N.

Measured once per service at start-up, after a context of `CONTEXT` tokens, on this machine and
compute path. The γ controller plans with this curve from the first round (the verify of γ drafts
is one forward of γ+1 tokens); it only learns a scale for drift and load online.
"""

from __future__ import annotations

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
    seconds: tuple[float, ...]  # seconds[S - 1]: one forward of S new tokens

    def forward_s(self, tokens: int) -> float:
        """Seconds for `tokens` new tokens; past the measured range, extrapolated linearly."""
        if tokens <= len(self.seconds):
            return self.seconds[max(tokens, 1) - 1]
        last, slope = self.seconds[-1], max(self.seconds[-1] - self.seconds[-2], 0.0) if len(self.seconds) > 1 else 0
        return last + slope * (tokens - len(self.seconds))

    def upper_bound_s(self, tokens: int) -> float:
        """A generous estimate for any size: past the measured range, the largest forward per chunk."""
        measured = len(self.seconds)
        return self.forward_s(tokens) if tokens <= measured else self.seconds[-1] * -(-tokens // measured)

    def ratio(self, tokens: int) -> float:
        """forward(S) / forward(1): 1 means scoring S tokens costs no more than scoring one."""
        return self.forward_s(tokens) / self.seconds[0]


def measure(runner: ModelRunner, max_tokens: int, repeats: int = 3, vocab: int | None = None) -> CostProfile:
    """Time forwards of 1..max_tokens tokens after a CONTEXT-token prefix; best of `repeats`.

    The sizes are interleaved within each repeat, so slow drift of the machine affects them alike.
    """
    vocab = vocab or runner.embed.num_embeddings
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (CONTEXT + max_tokens,), generator=gen).tolist()
    cache = runner.new_cache()
    began = time.perf_counter()
    runner.forward([Step(cache, tokens[:CONTEXT])])
    best = [float("inf")] * max_tokens
    for _ in range(repeats + 1):  # the first pass warms up every size
        for size in range(1, max_tokens + 1):
            t0 = time.perf_counter()
            runner.forward([Step(cache, tokens[CONTEXT:CONTEXT + size], logits=size)])
            best[size - 1] = min(best[size - 1], time.perf_counter() - t0)
            cache.crop(CONTEXT)
    profile = CostProfile(tuple(best))
    log.info("cost profile (%.1f s): forward of 1..%d tokens = %s ms; S=%d costs %.2fx S=1", time.perf_counter() - began,
             max_tokens, " ".join(f"{s * 1e3:.0f}" for s in best), max_tokens, profile.ratio(max_tokens))
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
