"""Model-free drafting: propose what followed the last earlier occurrence of the sequence's suffix.

Prompt lookup (vLLM's and Hugging Face's n-gram proposers, Saxena's "prompt lookup decoding"): code
repeats itself, and an edit or a refactor copies long runs of the prompt. The longest suffix of the
committed tokens, between `max_n` and `min_n` tokens long, is looked up among the earlier positions
of the same sequence (prompt and output alike); the tokens that followed its last occurrence are the
proposal. A lookup is a dictionary probe per n, and the index grows by `max_n - min_n + 1` entries per
committed token.

A proposal is deterministic: its q is a point mass, q(x) = 1, so the rejection sampler stays exact
at any temperature (`specdec.rejection`: no q sent means a point mass).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lookup:
    """A proposal and the length of the suffix it matched (0: no match, no tokens)."""

    tokens: list[int]
    match: int = 0


class NgramIndex:
    """The committed sequence, and for each n-gram (min_n ≤ n ≤ max_n) the position right after its
    last occurrence that has a token after it."""

    def __init__(self, min_n: int = 1, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._after: dict[tuple[int, ...], int] = {}

    def sync(self, committed: list[int]) -> None:
        """Take in the committed tokens not seen yet (the committed sequence only grows)."""
        for token in committed[len(self.tokens):]:
            end = len(self.tokens)  # the n-grams ending just before `token` now have a continuation
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._after[tuple(self.tokens[end - n:end])] = end
            self.tokens.append(token)

    def propose(self, gamma: int) -> Lookup:
        """Up to `gamma` tokens that followed the longest matching suffix's last earlier occurrence."""
        length = len(self.tokens)
        for n in range(min(self.max_n, length), self.min_n - 1, -1):
            start = self._after.get(tuple(self.tokens[length - n:]))
            if start is not None:
                return Lookup(self.tokens[start:start + gamma], n)
        return Lookup([])
