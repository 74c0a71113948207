"""KV caches of ended sessions, kept for later sessions whose tokens start the same way.

A chat's next turn resends the whole conversation; an agent's next call resends its tools and
history; many requests share a system prompt. An ended session has already computed the keys and
values of those tokens. `PrefixCache` keeps such caches, least recently kept first out, within a
byte budget; a new session takes the one that shares the longest prefix with its tokens, crops
it there and computes only the rest (`Engine._reuse_prefix`). Taking moves the cache, no copy.

On a row-invariant compute path a position's keys and values are the same bits however they were
computed (alone, in a verify, in a chunk of a prompt, beside other sessions), so a session that
takes them gets exactly what its own prefill would have written: output unchanged, prefill shorter.
Thread-safe; plain Python and numpy, no torch.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from specdec.core.sequence import longest_shared

C = TypeVar("C")
MAX_ENTRIES = 64  # caches kept at most, whatever their size (a lookup scans them all)


@dataclass
class _Kept(Generic[C]):
    tokens: np.ndarray  # int64 [length]: the tokens whose keys and values `cache` holds, in order
    cache: C
    nbytes: int  # what dropping the cache frees
    scope: str  # only a session of the same scope takes it (a tenant's cache salt)


class PrefixCache(Generic[C]):
    """Ended sessions' caches by the tokens they hold, at most `budget_bytes` and MAX_ENTRIES of them."""

    def __init__(self, budget_bytes: int, max_entries: int = MAX_ENTRIES):
        self.budget_bytes, self.max_entries = budget_bytes, max_entries
        self._kept: OrderedDict[int, _Kept[C]] = OrderedDict()  # oldest first
        self._next_key = 0
        self._bytes = 0
        self._lock = threading.Lock()

    def keep(self, tokens: list[int], cache: C, nbytes: int, scope: str = "") -> bool:
        """Keep `cache`, which holds the keys and values of `tokens`, for sessions of `scope`; the oldest
        entries (of any scope) go to make room.
        False (nothing kept) when it alone is over the budget, or the budget is 0 (off)."""
        if self.budget_bytes <= 0 or nbytes > self.budget_bytes or self.max_entries <= 0:
            return False
        with self._lock:
            while self._kept and (self._bytes + nbytes > self.budget_bytes or len(self._kept) >= self.max_entries):
                self._drop(next(iter(self._kept)))
            self._kept[self._next_key] = _Kept(np.asarray(tokens, dtype=np.int64), cache, nbytes, scope)
            self._bytes += nbytes
            self._next_key += 1
        return True

    def reuse(self, tokens: list[int], at_least: int, scope: str, copy: Callable[[C, int], None],
              slack: int) -> tuple[C | None, int] | None:
        """For a new session of `scope` whose tokens are `tokens`: the kept cache of that scope sharing the
        longest prefix with them, if that is `at_least` tokens (the first kept wins a tie), else None.

        A cache that holds at most `slack` positions past the shared prefix is the same conversation going
        on (past it: the last round's rejected drafts): it is taken, removed and returned as (cache, shared).
        One that holds more is another conversation that shares only its start (a system prompt): it stays
        for that conversation's next turn, `copy(cache, shared)` copies the shared prefix out of it under this
        store's lock, and (None, shared) is returned."""
        with self._lock:
            found = longest_shared(tokens, ((key, k.tokens) for key, k in self._kept.items() if k.scope == scope),
                                   at_least)
            if found is None:
                return None
            best, shared = found
            if len(self._kept[best].tokens) - shared <= slack:
                return self._drop(best).cache, shared
            copy(self._kept[best].cache, shared)
            self._kept.move_to_end(best)  # just used: the last to go
            return None, shared

    def evict_oldest(self) -> bool:
        """Drop the oldest entry (its memory, or its KV pool slot, goes back); False if none is kept."""
        with self._lock:
            if not self._kept:
                return False
            self._drop(next(iter(self._kept)))
            return True

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._bytes = 0

    def _drop(self, key: int) -> _Kept[C]:
        kept = self._kept.pop(key)
        self._bytes -= kept.nbytes
        return kept

    @property
    def tokens(self) -> int:
        """Positions held over all kept caches."""
        with self._lock:
            return sum(len(k.tokens) for k in self._kept.values())

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._kept)
