"""Cost curves: what a forward pass of S new tokens costs, and the arithmetic the γ controller does with them.

A `CostProfile` is measured once per service at start-up (`specdec.engine.measure`), after a context of
`PROFILE_CONTEXT` tokens, on that service's machine and compute path. The γ controller plans with the
curve from the first round (the verify of γ drafts is one forward of γ+1 tokens); it only learns a
scale for drift and load online. Plain arithmetic: no model, no clock, no OS.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

PROFILE_CONTEXT = 128  # tokens in the cache before the profiled forwards


@dataclass(frozen=True)
class CostProfile:
    """seconds[i]: one forward of tokens[i] new tokens (tokens ascending; empty means 1, 2, …, len(seconds)).

    The dense head (1..γ_max+1) prices one session's verify; the sparse tail prices a pass shared by
    many sessions, whose linear layers see the tokens of all of them. per_position_s: what attention adds
    to a pass per new token and cached position past PROFILE_CONTEXT (0: not measured), so that a pass at
    depth d costs forward_s(S) + depth_s(S · (d − PROFILE_CONTEXT)).
    """

    seconds: tuple[float, ...]
    tokens: tuple[int, ...] = ()
    per_position_s: float = 0.0

    def __post_init__(self):
        if not self.tokens:
            object.__setattr__(self, "tokens", tuple(range(1, len(self.seconds) + 1)))
        if len(self.tokens) != len(self.seconds) or list(self.tokens) != sorted(set(self.tokens)):
            raise ValueError(f"cost profile sizes {self.tokens} do not match {len(self.seconds)} timings")
        # Each segment's slope, once: a round's pricing reads the curve some 30 times (no max, no division each).
        sizes, seconds = self.tokens, self.seconds
        object.__setattr__(self, "_slopes", tuple(max(seconds[i + 1] - seconds[i], 0.0) / (sizes[i + 1] - sizes[i])
                                                  for i in range(len(sizes) - 1)))

    def forward_s(self, tokens: float) -> float:
        """Seconds for `tokens` new tokens: interpolated between measured sizes, linear past the last."""
        sizes, seconds = self.tokens, self.seconds
        if tokens <= sizes[0]:
            return seconds[0]
        at = bisect.bisect_left(sizes, tokens)
        if at < len(sizes) and sizes[at] == tokens:
            return seconds[at]
        lo = at - 1 if at < len(sizes) else at - 2  # past the measured range: extend the last segment's slope
        if lo < 0:  # one size measured
            return seconds[0]
        return seconds[lo] + self._slopes[lo] * (tokens - sizes[lo])

    def upper_bound_s(self, tokens: int) -> float:
        """A generous estimate for any size: past the measured range, the largest forward per chunk."""
        largest = self.tokens[-1]
        return self.forward_s(tokens) if tokens <= largest else self.seconds[-1] * -(-tokens // largest)

    def depth_s(self, token_positions: float) -> float:
        """Seconds attention at depth adds to a pass: token_positions is Σ over its new tokens of the cached
        positions each sees past PROFILE_CONTEXT (`positions_past`)."""
        return self.per_position_s * max(token_positions, 0.0)

    def ratio(self, tokens: int) -> float:
        """forward(S) / forward(1): 1 means scoring S tokens costs no more than scoring one."""
        return self.forward_s(tokens) / self.seconds[0]


def batch_sizes(max_tokens: int, batch_tokens: int) -> list[int]:
    """The profiled sizes: every size 1..max_tokens, then doubling up to `batch_tokens`."""
    sizes = list(range(1, max_tokens + 1))
    while sizes[-1] * 2 <= batch_tokens:
        sizes.append(sizes[-1] * 2)
    return sizes


def positions_past(tokens: float, cached: float) -> float:
    """Σ over `tokens` new tokens fed after `cached` positions of the positions each sees past PROFILE_CONTEXT
    (the profile's own passes see PROFILE_CONTEXT and their own tokens: that much is in forward_s)."""
    return tokens * max(cached - PROFILE_CONTEXT, 0)


def shared_prompt_chunk(profile: CostProfile, others: int, longest: int, slowdown: float,
                        others_past: int = 0, prompt_cached: int = 0) -> int:
    """Tokens of a prompt to feed per pass beside `others` sessions' decode steps (a row each): the most whose
    shared pass the profile prices within `slowdown` × the others' pass alone, so that a prompt arriving
    leaves each of them at least 1/slowdown of its speed, and the prompt goes in as fast as that allows.
    At depth both are priced with attention: others_past, Σ over the others of their positions past
    PROFILE_CONTEXT; prompt_cached, the prompt's positions already cached. At least 1, at most `longest`."""
    others_s = profile.forward_s(others) + profile.depth_s(others_past)
    budget = slowdown * others_s
    lo, hi = 1, max(longest, 1)
    while lo < hi:  # the cost does not fall as the chunk grows: the largest chunk within the budget
        mid = (lo + hi + 1) // 2
        cost = profile.forward_s(others + mid) + profile.depth_s(others_past + positions_past(mid, prompt_cached))
        lo, hi = (mid, hi) if cost <= budget else (lo, mid - 1)
    return lo


def expected_tokens(alpha: float, gamma: int) -> float:
    """E(γ): expected tokens emitted by one round with acceptance rate α."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def batch_fill(rows: float, sessions: int) -> float:
    """f: the share of a service's live sessions that one pass served (1 = all of them)."""
    return min(max(rows, 1.0) / max(sessions, 1), 1.0)


def pass_rows(sessions: float, fill: float | None) -> float:
    """f·n: the sessions in one pass (at least one; f unmeasured counts as 1)."""
    return max(sessions * (1.0 if fill is None else fill), 1.0)


def pass_cost(profile: CostProfile, sessions: float, fill: float | None, tokens: float) -> float:
    """C(k) = P(f·n·k)/f: the passes that give each of n sessions k tokens, a share f of them per pass."""
    rows = pass_rows(sessions, fill)
    return sessions / rows * profile.forward_s(rows * tokens)
