"""The speedups the theory predicts, printed beside the measured ones by `specdec bench`."""

from __future__ import annotations

from specdec.planning.cost import CostProfile, expected_tokens


def theorem_speedup(alpha: float, gamma: int, c: float) -> float:
    """Leviathan et al. Theorem 3.8: E(γ) / (γ·c + 1), network ignored, verify assumed to cost one step."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


def profile_speedup(alpha: float, gamma: int, draft: CostProfile, target: CostProfile) -> float:
    """Theorem 3.8 with the measured verify cost: E(γ)·P_t(1) / (γ·P_d(1) + P_t(γ+1))."""
    if gamma == 0:
        return 1.0
    return expected_tokens(alpha, gamma) * target.forward_s(1) / (gamma * draft.forward_s(1)
                                                                 + target.forward_s(gamma + 1))
