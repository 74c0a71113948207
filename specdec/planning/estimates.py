"""The running estimates the γ controller learns from rounds: an exponentially weighted mean, and a
service's cost scale per pass size."""

from __future__ import annotations

import bisect
from collections import deque

FIRST_SAMPLES = 3  # a pass size's samples that keep their least before they are averaged (`SizeScales`)
# A target's compute scale's update takes the median of its last SCALE_MEDIAN_OF samples (`Ewma.filtered`): one or
# two stalled passes are not the device slowing. Taken whole, one target step stalled at 2.8x on a Zen 1 moved its
# scale by half, priced the draft at 0.195 of a step against 0.306, and a lone session drafted at a loss for the rest
# of its reply (adaptive 0.93x target-only). Over 10,471 target-only steps of that day's runs, slow ones (over 1.5x
# the reply's median) came alone 150 times and two in a row 12 times, and under a median of three two in a row did
# the same (docs/PERFORMANCE.md). A lasting change is learned two samples later.
SCALE_MEDIAN_OF = 5


class Ewma:
    """Exponentially weighted mean. A `provisional` initial value (a prior) gives way to the first sample. With
    `median_of` n > 1, each update takes the median of the last n samples (`filtered`) for its own."""

    def __init__(self, weight: float = 0.2, initial: float | None = None, provisional: bool = False,
                 median_of: int = 1):
        self.weight = weight
        self.value = initial
        self.provisional = provisional
        self.floor = float("-inf")  # samples below it count as it (`LoadEstimates`: the live sessions it knows of)
        self.recent: deque[float] = deque(maxlen=median_of)

    def update(self, sample: float, share: float = 1.0) -> float:
        """Move toward `sample` (`filtered`) by the weight, times `share` (a sample worth less than a whole one)."""
        sample = max(self.filtered(sample), self.floor)
        if self.value is None or self.provisional:
            self.value, self.provisional = sample, False
        else:
            weight = self.weight * share
            self.value = (1 - weight) * self.value + weight * sample
        return self.value

    def seed(self, value: float | None) -> None:
        """Start from `value` (a prior) until the first sample replaces it."""
        if value is not None:
            self.value, self.provisional = value, True

    def filtered(self, sample: float) -> float:
        """Remember `sample`, and return the lower median of the last `median_of` samples (the sample itself
        where that is 1): of 2k + 1, k samples far off in a row move nothing, k + 1 do."""
        if self.recent.maxlen == 1:
            return sample
        self.recent.append(sample)
        return sorted(self.recent)[(len(self.recent) - 1) // 2]


class SizeScales:
    """Measured over profiled compute of one service's passes, learned per pass size (new tokens in the pass).

    One scale for every size cannot follow a CPU host whose memory bandwidth drifts: a pass of one token is
    bound by reading the weights, a pass of several by arithmetic, so when the bandwidth falls the first slows
    and the others hardly do. Measured on a Zen 4 whose start-up profile said 25.2 / 32.4 / 40.0 ms for 1 / 2 /
    3 tokens: 31.9 / 36.1 / 41.0 ms in the service an hour later, scales 1.27 / 1.11 / 1.03. One scale learned
    from rounds of both kinds priced target-only steps low after verifies and verifies high after target-only
    steps, and either way speculation looked worse than it was. A size never measured takes the scales of the
    sizes measured around it (linear in between, the nearest one past either end); with none measured, the
    caller's default (the one scale of every size).

    Noise only ever slows a pass, and a size priced high is not run again, so not measured again. So a size's
    first FIRST_SAMPLES samples keep their least (then each moves its average), and until it has that many it
    is priced at no more than the caller's default. One slow first sample of a verify of 2 (a scheduler's hiccup
    on a loaded host: 2.8× the one-token step's scale) once priced every verify out of a generation for good. A
    seed (`seed`: earlier sessions' scale) counts as one of those samples: replaced whole by a first sample, one
    pass slowed by another session's draft catching up on the same cores (a one-token step at 2.6×, 8 users on a
    Zen 1) priced the session's target-only rounds as if the device had slowed, and it drafted. After the first
    samples, with `median_of` 5 (`SCALE_MEDIAN_OF`), each update is the median of the size's last five samples.

    A seed is measured at the speed of the minute its sessions ran in, and a size priced high is not run, so not
    measured. Priced `at_own_level`, a size this session has not measured is priced at its seed times `level`:
    how this session's own samples stand against the seeds at the sizes it measured (never above 1). Handed a
    one-token scale learned in a warm-up's slow minute (1.6x what the reply before it had measured), a session on
    a Zen 1 drafted at a loss to the end of its reply and never ran the one-token pass that would have told it."""

    def __init__(self, weight: float = 0.3, median_of: int = 1):
        self.weight, self.median_of = weight, median_of  # `Ewma`'s, of each size's estimate
        self.sizes: dict[int, Ewma] = {}
        self.samples: dict[int, int] = {}  # samples taken of each size (a seed is none)
        self.seeds: tuple[list[int], list[float]] = ([], [])  # the sizes `seed` was handed, ascending, and scales
        # `at`'s sizes and prices for one default (by `at_own_level`), until a size changes: a round prices every γ
        self._known: tuple[float, dict[bool, tuple[list[int], list[float]]]] | None = None

    def update(self, tokens: int, sample: float) -> None:
        """One pass of `tokens` new tokens took `sample` times its profiled time."""
        size = int(tokens)
        taken = self.samples[size] = self.samples.get(size, 0) + 1
        estimate = self._at(size)
        if taken <= FIRST_SAMPLES and estimate.value is not None:  # an earlier sample's value, or a seed's
            estimate.filtered(sample)  # remembered, for the medians of the samples after the first
            estimate.value, estimate.provisional = min(estimate.value, sample), False
        else:
            estimate.update(sample)

    def at(self, tokens: float, default: float, at_own_level: bool = False) -> float:
        """The scale of a pass of `tokens` new tokens (`default` until some size is measured or seeded); with
        `at_own_level`, sizes this session has not measured are priced at their seed times `level()`."""
        sizes, scales = self._priced_sizes(default, at_own_level)
        return interpolate(sizes, scales, tokens) if sizes else default

    def level(self) -> float:
        """This session's own scales over its seeds' (interpolated) at the sizes it measured: the lower median of
        those ratios, at most 1; 1 without a seed or a measured size."""
        ratios = sorted(e.value / interpolate(*self.seeds, size) for size, e in self.sizes.items()
                        if self.samples.get(size, 0) > 0) if self.seeds[0] else []
        return min(ratios[(len(ratios) - 1) // 2], 1.0) if ratios else 1.0

    def _priced_sizes(self, default: float, at_own_level: bool) -> tuple[list[int], list[float]]:
        """The sizes with a scale, ascending, and each one's as `at` prices it under `default` (`at_own_level`)."""
        if self._known is None or self._known[0] != default:
            self._known = (default, {})
        prices = self._known[1]
        if at_own_level not in prices:
            level = self.level() if at_own_level else 1.0
            known = sorted((size, self._priced(size, e.value, default, level)) for size, e in self.sizes.items()
                           if e.value is not None)
            prices[at_own_level] = ([size for size, _ in known], [scale for _, scale in known])
        return prices[at_own_level]

    def _priced(self, size: int, value: float, default: float, level: float) -> float:
        """A size's scale as `at` prices it: capped by `default` while it has 1..FIRST_SAMPLES - 1 samples, times
        `level` while it has none (a seed)."""
        taken = self.samples.get(size, 0)
        return value * level if taken == 0 else min(value, default) if taken < FIRST_SAMPLES else value

    def seed(self, prior: SizeScales) -> None:
        """Start from `prior`'s scales, each one of the first samples of its size (`update`)."""
        seeded = sorted((size, e.value) for size, e in prior.sizes.items() if e.value is not None)
        self.seeds = ([size for size, _ in seeded], [value for _, value in seeded])
        for size, value in seeded:
            self._at(size).seed(value)

    def absorb(self, learned: SizeScales) -> None:
        """Fold in what `learned` measured (its samples' averages, not its seeds)."""
        for size, estimate in learned.sizes.items():
            if estimate.value is not None and not estimate.provisional:
                self._at(size).update(estimate.value)

    def snapshot(self) -> dict[str, float]:
        """The scales as plain data (JSON-ready: string keys)."""
        return {str(size): e.value for size, e in sorted(self.sizes.items()) if e.value is not None}

    def load(self, snapshot: dict) -> None:
        """Adopt a snapshot's scales (another orchestrator's view of the same service)."""
        for size, value in snapshot.items():
            if value is not None:
                self._at(int(size)).value = float(value)

    def _at(self, tokens: int) -> Ewma:
        """A size's estimate, to change: every change goes through here, which forgets `at`'s prices."""
        self._known = None
        return self.sizes.setdefault(int(tokens), Ewma(self.weight, median_of=self.median_of))


def interpolate(sizes: list[int], scales: list[float], tokens: float) -> float:
    """The scale at `tokens` of a curve known at `sizes` (ascending, at least one): linear in between, the nearest
    size's past either end."""
    at = bisect.bisect_left(sizes, tokens)
    if at < len(sizes) and sizes[at] == tokens:
        return scales[at]
    if at == 0 or at == len(sizes):
        return scales[min(at, len(sizes) - 1)]
    lo, hi = at - 1, at
    return scales[lo] + (scales[hi] - scales[lo]) * (tokens - sizes[lo]) / (sizes[hi] - sizes[lo])
