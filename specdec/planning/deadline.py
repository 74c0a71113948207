"""The deadline of one hop of one round, from its expected compute."""

from __future__ import annotations

from dataclasses import dataclass


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
