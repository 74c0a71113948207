"""Modified rejection sampler (Leviathan et al. Alg. 1, Chen et al. Alg. 2).

Glossary:
- accepted token: a draft token x_i kept because u_i < p_i(x_i) / q_i(x_i).
- recovered token: drawn from norm(max(0, p_n - q_n)) at the first rejected position n.
- bonus token: drawn from p_{γ+1} when all γ draft tokens are accepted.

Every verification emits the accepted tokens plus exactly one recovered or bonus token,
so a round emits between 1 and γ+1 tokens. A deterministic proposer (no q sent) is a
point-mass q: accept with probability p(x); on rejection sample from p with x removed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.core.errors import InvalidArgument
from specdec.core.sampling import sample


@dataclass(frozen=True)
class Verdict:
    tokens: list[int]  # accepted draft tokens followed by one recovered or bonus token
    num_accepted: int


def verify_greedy(draft_tokens: list[int], target_logits: torch.Tensor) -> Verdict:
    """Accept while the target's argmax equals the draft token.

    draft_tokens: γ ids; target_logits: [γ+1, V]. The argmaxes reach the host in one copy: on a GPU each
    further read of the device waits for it again.
    """
    return verify_choices(draft_tokens, target_logits.argmax(dim=-1).tolist())


def verify_choices(draft_tokens: list[int], choices: list[int]) -> Verdict:
    """Accept while the target's own choice at a position (its argmax, or its coupled draw:
    `specdec.core.coupling`) equals the draft token; then emit the target's choice. choices: γ+1 ids."""
    n = next((i for i, (d, t) in enumerate(zip(draft_tokens, choices)) if d != t), len(draft_tokens))
    return Verdict([*draft_tokens[:n], choices[n]], n)


def _draft_prob_of_tokens(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None) -> torch.Tensor:
    """q_i(x_i): [γ]; ones for a point-mass proposer."""
    if draft_probs is None:
        return torch.ones(draft_tokens.shape[0], dtype=torch.float32, device=draft_tokens.device)
    q_x = draft_probs.gather(-1, draft_tokens[:, None]).squeeze(-1)
    if bool((q_x <= 0).any()):
        raise InvalidArgument("a draft token has zero draft probability; q does not match the proposed tokens")
    return q_x


def residual(p: torch.Tensor, q: torch.Tensor | None, rejected_token: int) -> torch.Tensor:
    """norm(max(0, p - q)): [V]; with a point-mass q, p with the rejected token removed."""
    if q is None:
        rest = p.clone()
        rest[rejected_token] = 0.0
    else:
        rest = (p - q).clamp_min(0.0)
    total = rest.sum()
    if total <= 0:  # p == q up to rounding: the rejection had probability ~0, p itself is the right law
        return p
    return rest / total


def verify_sampled(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> Verdict:
    """Vectorised rejection sampling.

    draft_tokens: [γ] long; draft_probs: [γ, V] or None (point mass); target_probs: [γ+1, V].
    Draws γ uniforms, then one categorical sample, from `generator` in that order.
    """
    gamma = draft_tokens.shape[0]
    p_x = target_probs[:gamma].gather(-1, draft_tokens[:, None]).squeeze(-1)  # [γ]
    q_x = _draft_prob_of_tokens(draft_tokens, draft_probs)  # [γ]
    u = torch.rand(gamma, generator=generator, device=target_probs.device)  # [γ]
    # q <= p: always accept; q > p: accept with probability p/q.
    rejected = (u * q_x >= p_x).nonzero()
    n = int(rejected[0, 0]) if rejected.numel() else gamma
    if n == gamma:
        last = target_probs[gamma]
    else:
        q_n = None if draft_probs is None else draft_probs[n]
        last = residual(target_probs[n], q_n, int(draft_tokens[n]))
    return Verdict(draft_tokens[:n].tolist() + [sample(last, generator)], n)
