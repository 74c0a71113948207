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

A client's own guess at the output (OpenAI's Predicted Outputs) is a third source: `Prediction` follows it
as the output goes, and is asked first.

A proposal is deterministic: its q is a point mass, q(x) = 1, so the rejection sampler stays exact
at any temperature (`specdec.core.rejection`: no q sent means a point mass).
"""

from __future__ import annotations

import bisect
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


def followed_ngrams(tokens: list[int], min_n: int, max_n: int):
    """(n-gram, position after it) for every n-gram of `min_n`..`max_n` tokens followed by a token."""
    for end in range(1, len(tokens)):
        for n in range(min_n, min(max_n, end) + 1):
            yield tuple(tokens[end - n:end]), end


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

    def add(self, tokens: list[int]) -> None:
        """Keep a finished session's sequence (longer than `capacity`: its last `capacity` tokens)."""
        tokens = list(tokens[-self.capacity:])
        with self._lock:
            while self._sequences and self._size + len(tokens) > self.capacity:
                self._evict()
            sequence = next(self._ids)
            self._sequences[sequence] = tokens
            self._size += len(tokens)
            for key, end in followed_ngrams(tokens, self.min_n, self.max_n):
                self._after[key] = (sequence, end)
                self._seen[key] = self._seen.get(key, 0) + 1

    def _evict(self) -> None:
        sequence, tokens = self._sequences.popitem(last=False)
        self._size -= len(tokens)
        for key, _ in followed_ngrams(tokens, self.min_n, self.max_n):
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


class Prediction:
    """The output a client expects (OpenAI's Predicted Outputs: an edited file's old text, say), followed as the
    output is committed. While the output matches it token for token from a known place, the proposal is what
    comes next there (reported as the match `aligned`, max_n + 1). Where the output writes another token than the
    prediction's, that token is taken to replace the prediction's (`replaced`, max_n + 2) and the prediction is
    followed after it, as long as the output goes on matching it; otherwise its longest suffix of
    `min_n`..`max_n` tokens is looked up in the prediction, at the occurrence nearest after the last place (or,
    if none, the last before it), and followed from there. A proposal, like every lookup, is a point mass:
    what the output is stays the target's alone."""

    def __init__(self, tokens: list[int], start: int, min_n: int, max_n: int):
        """start: where the output begins among the committed tokens (after the prompt)."""
        self.tokens, self.start, self.min_n, self.max_n = list(tokens), start, min_n, max_n
        self.aligned, self.replaced = max_n + 1, max_n + 2  # the matches those proposals report
        self._after: dict[tuple[int, ...], list[int]] = {}  # n-gram -> ascending positions right after it
        for key, end in followed_ngrams(self.tokens, min_n, max_n):
            self._after.setdefault(key, []).append(end)
        self._place: int | None = 0  # the prediction's position the output's end is at, while it follows it
        self._match = self.aligned  # how the place was found: the match its proposals report
        self._checked = 0  # output tokens the place accounts for
        self._last = 0  # the last place found, where a search prefers to continue

    def propose(self, committed: list[int], gamma: int) -> Lookup:
        """Up to `gamma` tokens of the prediction from where the committed output is in it; none if it is in
        no known place or at the prediction's end."""
        output = len(committed) - self.start
        if output < self._checked:  # the committed tokens were cut back: start over
            self._place, self._checked, self._match = 0, 0, self.aligned
        new = committed[self.start + self._checked:]
        self._checked = output
        if new and self._place is not None:  # no new tokens: where the last call left it
            self._place, self._match = self._follow(new)
        if self._place is None:
            self._place, self._match = self._search(committed)
        if self._place is None or self._place >= len(self.tokens):
            return Lookup([])
        self._last = self._place
        return Lookup(self.tokens[self._place:self._place + gamma], self._match, "prediction")

    def _follow(self, new: list[int]) -> tuple[int | None, int]:
        """The place after the `new` output tokens if they follow the prediction from the place, one of them
        replaced at most (the tokens after it matching), and the match to report; else (None, 0)."""
        same = common_prefix(new, self.tokens[self._place:self._place + len(new)])
        if same == len(new):
            return self._place + same, self.aligned
        rest, after = new[same + 1:], self._place + same + 1  # one token replaced: the rest must follow it
        if after + len(rest) <= len(self.tokens) and self.tokens[after:after + len(rest)] == rest:
            return after + len(rest), self.aligned if rest else self.replaced
        return None, 0

    def _search(self, committed: list[int]) -> tuple[int | None, int]:
        """The place after the longest suffix's occurrence nearest after the last place (else the last one
        before it), and the suffix's length; (None, 0) if no suffix occurs."""
        for n in range(min(self.max_n, len(committed)), self.min_n - 1, -1):
            places = self._after.get(tuple(committed[len(committed) - n:]))
            if places:
                later = bisect.bisect_left(places, self._last)
                return (places[later] if later < len(places) else places[-1]), n
        return None, 0


def shared_for(recent: RecentSequences | None, cache_salt: str) -> RecentSequences | None:
    """The memory of other sessions' sequences a session reads and feeds: none for a salted (one tenant's)
    session, so that no tenant's outputs shape another's proposals and speed."""
    return None if cache_salt else recent


class LookupProposer:
    """One session's lookups: the client's prediction of the output where it has one and matches at least as
    long a suffix, else its own sequence, then, for a longer match, the recent sequences of other sessions
    (`shared`, or None; the caller adds each finished sequence to it)."""

    def __init__(self, min_n: int, max_n: int, shared: RecentSequences | None = None,
                 prediction: Prediction | None = None):
        self.index = NgramIndex(min_n, max_n)
        self.shared, self.prediction = shared, prediction

    def sync(self, committed: list[int]) -> None:
        self.index.sync(committed)

    def propose(self, gamma: int) -> Lookup:
        own = self.index.propose(gamma)
        if self.prediction is not None:
            predicted = self.prediction.propose(self.index.tokens, gamma)
            if predicted.tokens and predicted.match >= own.match:
                return predicted
        if self.shared is None or own.match >= self.index.max_n:
            return own
        found = self.shared.propose(self.index.tokens, gamma, longer_than=own.match)
        return found if found.tokens else own
