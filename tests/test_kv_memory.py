"""A CPU session's KV cache grows only into memory the machine has (`KVCache.reserve`): where it has not, kept caches
go first, then the session alone is refused with ResourceExhausted (RESOURCE_EXHAUSTED through the services), its
pass's other sessions untouched; before, the allocation ended in the OOM killer, the service gone for every session.
The machine's memory is what `memory_budget.available_bytes` reads; these tests set it."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_TARGET

from specdec.core.errors import ResourceExhausted
from specdec.core.params import SamplingParams
from specdec.engine import memory_budget
from specdec.engine.kvcache import HEADROOM_BYTES, KVCache
from specdec.engine.models import load_model
from specdec.engine.target_engine import TargetEngine

PROMPT = [(11 * i + 5) % 250 for i in range(40)]


def storage_bytes(cache: KVCache, capacity: int) -> int:
    layers, kv_heads, head_dim = cache.shape
    return 2 * layers * kv_heads * capacity * head_dim * cache.dtype.itemsize


def test_growth_past_the_available_memory_is_refused_and_changes_nothing(monkeypatch):
    cache = KVCache(2, 2, 16, torch.float32, torch.device("cpu"), 4096)
    cache.reserve(100)
    cache.length, capacity, keys = 100, cache.capacity, cache.keys
    need = storage_bytes(cache, 2 * capacity) + HEADROOM_BYTES  # the next growth doubles
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: need - 1)
    with pytest.raises(ResourceExhausted, match=f"a KV cache of {2 * capacity} positions needs about"):
        cache.reserve(capacity + 1)
    assert cache.capacity == capacity and cache.keys is keys and cache.length == 100
    cache.reserve(capacity)  # room it has needs no memory
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: need)
    cache.reserve(capacity + 1)
    assert cache.capacity == 2 * capacity and cache.length == 100
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: None)  # no /proc/meminfo: no check
    cache.reserve(2 * capacity + 1)
    assert cache.capacity == 4 * capacity


def test_a_session_short_of_memory_takes_kept_caches_first_then_is_refused_alone(monkeypatch):
    engine = TargetEngine(load_model(TINY_TARGET, "cpu"), max_sessions=4)
    try:
        engine.open("ended", SamplingParams())
        engine.verify("ended", 0, PROMPT, [5, 6, 7], None)
        engine.release("ended")
        assert len(engine.prefix_cache) == 1
        engine.open("a", SamplingParams())
        short = engine.verify("a", 0, [1, 2, 3], [], None).verdict.tokens  # a cache of one block
        monkeypatch.setattr(memory_budget, "available_bytes",  # short until the kept cache goes
                            lambda: 10**15 if len(engine.prefix_cache) == 0 else 0)
        tokens = [1, 2, 3] + short + list(range(30, 100))  # past a's first block: it grows
        engine.verify("a", 0, tokens, [], None)
        assert len(engine.prefix_cache) == 0, "the kept cache went first"

        monkeypatch.setattr(memory_budget, "available_bytes", lambda: 0)
        engine.open("b", SamplingParams())
        with pytest.raises(ResourceExhausted, match="KV cache of 64 positions needs about"):
            engine.verify("b", 0, PROMPT, [], None)
        more = engine.verify("a", 0, tokens, [40, 41], None).verdict.tokens  # room it has: a goes on
        assert more and engine.release("b") and engine.release("a")
    finally:
        engine.close()
