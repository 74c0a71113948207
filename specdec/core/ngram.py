"""Model-free drafting: propose what followed the last earlier occurrence of the sequence's suffix.

Prompt lookup (vLLM's and Hugging Face's n-gram proposers, Saxena's "prompt lookup decoding"): code
repeats itself, and an edit or a refactor copies long runs of the prompt. The longest suffix of the
committed tokens, between `max_n` and `min_n` tokens long, is looked up among the earlier positions
of the same sequence (prompt and output alike); the tokens that followed its last occurrence are the
proposal. A lookup is a dictionary probe per n, and the index grows by `max_n - min_n + 1` entries per
committed token.

Beyond one sequence (SuffixDecoding, arXiv 2411.04975): `RecentSequences` keeps the sequences of
finished sessions, bounded, so a session also finds what earlier sessions wrote (a retried request,
an agent's loop, an answer pasted back into the next prompt). `LookupProposer` asks both and keeps
the longer match; each proposal says where it came from, how long its match is and how often that
context was seen, so the γ controller can price it.

A proposal is deterministic: its q is a point mass, q(x) = 1, so the rejection sampler stays exact
at any temperature (`specdec.core.rejection`: no q sent means a point mass).
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass

from specdec.core.sequence import common_prefix

LOOKUP_MEMORY_TOKENS = 100_000  # finished sequences a server keeps for lookups across sessions


@dataclass(frozen=True)
class Lookup:
    """A proposal, the length of the suffix it matched (0: no match, no tokens), where it was found
    ("self": this sequence, "shared": an earlier session's) and how many times that suffix was seen."""

    tokens: list[int]
    match: int = 0
    source: str = "self"
    frequency: int = 1

    @property
    def kind(self) -> tuple[str, int, bool]:
        """What its acceptance is learned under: source, match length, and whether the matched suffix
        was seen more than once (a context that recurs across sessions)."""
        return self.source, self.match, self.frequency > 1


class NgramIndex:
    """The committed sequence, and for each n-gram (min_n ≤ n ≤ max_n) the position right after its
    last occurrence that has a token after it."""

    def __init__(self, min_n: int = 1, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._after: dict[tuple[int, ...], int] = {}
        self._undo: list[list[tuple[tuple[int, ...], int | None]]] = []  # per token: the entries it replaced

    def sync(self, committed: list[int]) -> None:
        """Take in the committed tokens not seen yet; a committed sequence that no longer starts with
        the indexed one (a service's rollback) first truncates the index to their common prefix."""
        if committed[:len(self.tokens)] != self.tokens:
            self.truncate(common_prefix(self.tokens, committed))
        for token in committed[len(self.tokens):]:
            end = len(self.tokens)  # the n-grams ending just before `token` now have a continuation
            replaced = []
            for n in range(self.min_n, min(self.max_n, end) + 1):
                key = tuple(self.tokens[end - n:end])
                replaced.append((key, self._after.get(key)))
                self._after[key] = end
            self._undo.append(replaced)
            self.tokens.append(token)

    def truncate(self, length: int) -> None:
        """Forget every token from `length` on, as if they had never been synced."""
        while len(self.tokens) > length:
            self.tokens.pop()
            for key, previous in reversed(self._undo.pop()):
                if previous is None:
                    del self._after[key]
                else:
                    self._after[key] = previous

    def propose(self, gamma: int) -> Lookup:
        """Up to `gamma` tokens that followed the longest matching suffix's last earlier occurrence."""
        length = len(self.tokens)
        for n in range(min(self.max_n, length), self.min_n - 1, -1):
            start = self._after.get(tuple(self.tokens[length - n:]))
            if start is not None:
                return Lookup(self.tokens[start:start + gamma], n)
        return Lookup([])


class RecentSequences:
    """The sequences of finished sessions, at most `capacity` tokens in all (the oldest dropped first),
    indexed by n-gram: for each, where it last occurred with a token after it, and how often. Thread-safe."""

    def __init__(self, capacity: int = LOOKUP_MEMORY_TOKENS, min_n: int = 2, max_n: int = 4):
        self.capacity, self.min_n, self.max_n = capacity, min_n, max_n
        self._sequences: OrderedDict[int, list[int]] = OrderedDict()
        self._after: dict[tuple[int, ...], tuple[int, int]] = {}  # n-gram -> (sequence, position after it)
        self._seen: dict[tuple[int, ...], int] = {}  # n-gram -> occurrences with a continuation
        self._size = 0
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def _ngrams(self, tokens: list[int]):
        """(n-gram, position after it) for every n-gram followed by a token."""
        for end in range(1, len(tokens)):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                yield tuple(tokens[end - n:end]), end

    def add(self, tokens: list[int]) -> None:
        """Keep a finished session's sequence (longer than `capacity`: its last `capacity` tokens)."""
        tokens = list(tokens[-self.capacity:])
        with self._lock:
            while self._sequences and self._size + len(tokens) > self.capacity:
                self._evict()
            sequence = next(self._ids)
            self._sequences[sequence] = tokens
            self._size += len(tokens)
            for key, end in self._ngrams(tokens):
                self._after[key] = (sequence, end)
                self._seen[key] = self._seen.get(key, 0) + 1

    def _evict(self) -> None:
        sequence, tokens = self._sequences.popitem(last=False)
        self._size -= len(tokens)
        for key, _ in self._ngrams(tokens):
            if self._after.get(key, (None,))[0] == sequence:
                del self._after[key]
            self._seen[key] -= 1
            if not self._seen[key]:
                del self._seen[key]

    def propose(self, suffix: list[int], gamma: int, longer_than: int = 0) -> Lookup:
        """Up to `gamma` tokens that followed the longest n-gram ending `suffix` (n > `longer_than`)
        at its last occurrence in a kept sequence."""
        with self._lock:
            for n in range(min(self.max_n, len(suffix)), max(self.min_n, longer_than + 1) - 1, -1):
                key = tuple(suffix[len(suffix) - n:])
                found = self._after.get(key)
                if found is not None:
                    sequence, start = found
                    return Lookup(self._sequences[sequence][start:start + gamma], n, "shared", self._seen[key])
        return Lookup([])


def shared_for(recent: RecentSequences | None, cache_salt: str) -> RecentSequences | None:
    """The memory of other sessions' sequences a session reads and feeds: none for a salted (one tenant's)
    session, so that no tenant's outputs shape another's proposals and speed."""
    return None if cache_salt else recent


class LookupProposer:
    """One session's lookups: its own sequence first, then, for a longer match, the recent sequences
    of other sessions (`shared`, or None; the caller adds each finished sequence to it)."""

    def __init__(self, min_n: int, max_n: int, shared: RecentSequences | None = None):
        self.index = NgramIndex(min_n, max_n)
        self.shared = shared

    def sync(self, committed: list[int]) -> None:
        self.index.sync(committed)

    def propose(self, gamma: int) -> Lookup:
        own = self.index.propose(gamma)
        if self.shared is None or own.match >= self.index.max_n:
            return own
        found = self.shared.propose(self.index.tokens, gamma, longer_than=own.match)
        return found if found.tokens else own
