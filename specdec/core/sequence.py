"""KV-position bookkeeping for one session on one service (no tensors here).

The orchestrator owns the committed token list. Each round it tells a service
`start` (a committed length the service already holds) and the committed tokens
from there on. The service then holds `tokens[:start] + new_tokens`, keeps the KV
entries of the longest prefix that still matches, and feeds the rest.

This makes every round idempotent by (session, start): replaying a round leaves
the same state, and a rejected draft token is rolled back simply because it no
longer matches the committed sequence.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from specdec.core.errors import InvalidArgument, OutOfRange


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def shared_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """`common_prefix` of two int arrays, vectorised (for long sequences compared often)."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


T = TypeVar("T")


def longest_shared(tokens: Sequence[int], candidates: Iterable[tuple[T, Sequence[int]]],
                   at_least: int) -> tuple[T, int] | None:
    """Of `candidates`, (item, its tokens) pairs, the first whose tokens share the longest prefix with `tokens`,
    if that is `at_least` tokens: (item, how many it shares); else None."""
    wanted = np.asarray(tokens, dtype=np.int64)
    best, shared = None, at_least - 1
    for item, sequence in candidates:
        common = shared_prefix(np.asarray(sequence, dtype=np.int64), wanted)
        if common > shared:
            best, shared = (item,), common
    return None if best is None else (best[0], shared)


def prefix_digests(salt: str, tokens: Sequence[int], block: int) -> list[str]:
    """One digest per whole block of `tokens`: digest k names the first (k + 1)·block tokens under `salt`
    (chained: each hashes the one before it and its block's tokens), so two sequences share digest k exactly
    when they share those tokens (and the salt)."""
    ids = np.asarray(tokens, dtype=np.int64)
    digests, previous = [], hashlib.blake2b(salt.encode(), digest_size=16).digest()
    for end in range(block, len(ids) + 1, block):
        previous = hashlib.blake2b(previous + ids[end - block:end].tobytes(), digest_size=16).digest()
        digests.append(previous.hex())
    return digests


@dataclass
class SequenceState:
    tokens: list[int] = field(default_factory=list)  # committed tokens, then any speculative ones
    committed: int = 0  # how many of `tokens` the orchestrator has confirmed
    cached: int = 0  # how many of `tokens` have their KV entries in the cache

    def commit(self, start: int, new_tokens: list[int]) -> int:
        """Apply a committed update; returns the cache length to crop to (<= old `cached`).

        Raises OutOfRange if `start` lies past what this session has confirmed (a lost or
        out-of-order round).
        """
        if start > self.committed:
            raise OutOfRange(f"round starts at position {start}, but this session holds only "
                             f"{self.committed} committed tokens (out-of-order or lost round)")
        if start + len(new_tokens) == 0:
            raise InvalidArgument("a round must leave at least one committed token")
        match = common_prefix(self.tokens[start:], new_tokens)
        self.tokens = self.tokens[:start] + list(new_tokens)
        self.committed = len(self.tokens)
        # Always leave at least one token to feed: its logits start the next step.
        self.cached = min(self.cached, start + match, self.committed - 1)
        return self.cached

    def pending(self) -> list[int]:
        """Tokens whose KV entries are not cached yet: [cached:]."""
        return self.tokens[self.cached:]

    def extend(self, speculative: list[int], cached: int) -> None:
        """Record tokens proposed or scored past the committed end, and the new cache length."""
        self.tokens.extend(speculative)
        assert cached <= len(self.tokens)
        self.cached = cached
