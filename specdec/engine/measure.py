"""Measuring a model's start-up cost profile (`specdec.planning.cost.CostProfile`) on this machine."""

from __future__ import annotations

import logging
import time

import torch

from specdec.engine.runner import ModelRunner, Step
from specdec.planning.cost import PROFILE_CONTEXT, CostProfile, batch_sizes

log = logging.getLogger(__name__)


def measure(runner: ModelRunner, max_tokens: int, batch_tokens: int = 0, repeats: int = 3,
            vocab: int | None = None) -> CostProfile:
    """Time forwards after a PROFILE_CONTEXT-token prefix; best of `repeats` per size.

    Sizes are 1..max_tokens (one session's verify) and doubling up to `batch_tokens` (a shared pass:
    sessions of max_tokens tokens each, as the batcher forms it). They are interleaved within each
    repeat, so slow drift of the machine affects them alike. The shared-pass sizes are compute-bound
    and steady, so they are timed once after the warm-up: repeating them would add seconds to every
    start-up. A device's queue is drained before each clock reading.
    """
    vocab = vocab or runner.embed.num_embeddings
    sizes = batch_sizes(max_tokens, batch_tokens)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (PROFILE_CONTEXT + max_tokens,), generator=gen).tolist()
    sessions = -(-sizes[-1] // max_tokens)
    caches = [runner.new_cache() for _ in range(sessions)]
    began = time.perf_counter()
    for cache in caches:
        runner.forward([Step(cache, tokens[:PROFILE_CONTEXT])])
    best = [float("inf")] * len(sizes)
    for repeat in range(repeats + 1):  # the first pass warms up every size
        for i, size in enumerate(sizes):
            if repeat > 1 and size > max_tokens:
                continue
            shares = [max_tokens] * (size // max_tokens) + ([size % max_tokens] if size % max_tokens else [])
            steps = [Step(cache, tokens[PROFILE_CONTEXT:PROFILE_CONTEXT + n], logits=n) for cache, n in zip(caches, shares)]
            _synchronize(runner)
            t0 = time.perf_counter()
            runner.forward(steps)
            _synchronize(runner)
            best[i] = min(best[i], time.perf_counter() - t0)
            for cache in caches:
                cache.crop(PROFILE_CONTEXT)
    profile = CostProfile(tuple(best), tuple(sizes))
    log.info("cost profile (%.1f s): forward of %s tokens = %s ms; S=%d costs %.2fx S=1",
             time.perf_counter() - began, ",".join(map(str, sizes)), " ".join(f"{s * 1e3:.0f}" for s in best),
             max_tokens, profile.ratio(max_tokens))
    return profile


def _synchronize(runner: ModelRunner) -> None:
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
