"""The coupled sampler: a sampled output that speculation cannot change.

The rejection sampler (`specdec.core.rejection`) emits tokens distributed exactly as the target's, but
*which* sample a seed gives depends on the round boundaries: on γ, on the proposer, on the adaptive
policy's timing. The coupled sampler fixes the sample itself. The token at position t is

    x_t = argmax_v (l_t[v] + G_t[v]),

where l_t are the filtered logits (`filtered_logits`: processing, temperature, top-k, top-p) and G_t is
standard Gumbel noise keyed by (seed, t) alone (`gumbel_noise`). By the Gumbel-max trick x_t is an exact
draw from softmax(l_t), so the output law is the target's; and x_t is a function of (seed, t, l_t) only, so
target-only decoding, any γ, any proposer and any batch emit the very same tokens wherever the target's
logits are the same bits (every row-invariant path).

Speculation then is greedy verification on the perturbed logits: a drafted token is accepted iff it equals
x_t. The draft model draws its own tokens with the same noise, argmax(l^q_t + G_t), so the two agree
whenever the noise lands both on one token: with probability at least (1 − TV)/(1 + TV) for the total
variation TV between q_t and p_t, against 1 − TV for the rejection sampler (Daliri, Musco and Suresh,
"Coupling without communication and drafter-invariant speculative decoding", 2025). A lookup's token x is
accepted with probability p_t(x), as under the rejection sampler. The draft's q is never needed.

The noise is drawn on the CPU in float64 from a generator keyed by (seed, t), so every service, device and
tensor-parallel rank perturbs a position alike.
"""

from __future__ import annotations

import torch

from specdec.core.sampling import position_generator

STREAM = "coupled"  # the key's stream: one noise per position, shared by the draft and the target


def gumbel_noise(seed: int, position: int, vocab: int) -> torch.Tensor:
    """G_t: [vocab] float64 standard Gumbel noise for the token at `position`, keyed by (seed, position)."""
    u = torch.rand(vocab, dtype=torch.float64, generator=position_generator(seed, position, STREAM))
    # u in [0, 1): -log(-log(u)) maps u = 0 to -inf, a token that never wins (probability 2^-53 a token).
    return u.log_().neg_().log_().neg_()


def perturbed(filtered: torch.Tensor, seed: int, first_position: int) -> torch.Tensor:
    """filtered: [N, V] filtered logits of positions first_position.. -> [N, V] float64 l + G, on the CPU."""
    rows, vocab = filtered.shape
    noise = torch.stack([gumbel_noise(seed, first_position + i, vocab) for i in range(rows)])  # [N, V]
    return filtered.detach().to("cpu", torch.float64) + noise


def coupled_tokens(filtered: torch.Tensor, seed: int, first_position: int) -> list[int]:
    """filtered: [N, V] -> the coupled sample x_t of each row, row i at position first_position + i."""
    return perturbed(filtered, seed, first_position).argmax(dim=-1).tolist()
