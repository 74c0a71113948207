"""The coupled sampler: a sampled output that speculation cannot change.

The rejection sampler (`specdec.core.rejection`) emits tokens distributed exactly as the target's, but
*which* sample a seed gives depends on the round boundaries: on γ, on the proposer, on the adaptive
policy's timing. The coupled sampler fixes the sample itself. The token at position t is

    x_t = argmax_v (l_t[v] + G_t[v]),

where l_t are the filtered logits (`filtered_logits`: processing, temperature, top-k, top-p) and G_t[v] is
standard Gumbel noise keyed by (seed, t, v) alone. By the Gumbel-max trick x_t is an exact draw from
softmax(l_t), so the output law is the target's; and x_t is a function of (seed, t, l_t) only, so target-only
decoding, any γ, any proposer and any batch emit the very same tokens wherever the target's logits are the
same bits (every row-invariant path).

Speculation then is greedy verification on the perturbed logits: a drafted token is accepted iff it equals
x_t. The draft model draws its own tokens with the same noise, argmax(l^q_t + G_t), so the two agree
whenever the noise lands both on one token: with probability at least (1 − TV)/(1 + TV) for the total
variation TV between q_t and p_t, against 1 − TV for the rejection sampler (Daliri, Musco and Suresh,
"Coupling without communication and drafter-invariant speculative decoding", 2025). A lookup's token x is
accepted with probability p_t(x), as under the rejection sampler. The draft's q is never needed.

Drawing V Gumbels a position would cost more than a CPU step's sampling should (0.5 ms a row for 151,936
tokens), so only the *head*, the tokens within HEAD_NATS of the likeliest (at most the MAX_HEAD likeliest),
get noise of their own, each from a counter-based hash of (seed, t, v): the same value for v whatever else is
in the head, so the draft and the target perturb a shared token alike. The tail's tokens share two draws,
exactly: the largest of their l + G is Gumbel-distributed around their log-sum-exp (Gumbel max-stability),
independent of which tail token holds it, which is softmax-distributed over the tail. So the tail's maximum
is drawn first, and only if it beats the head's best is the tail token drawn (by inverse CDF). The law stays
softmax(l_t), exactly. On the packaged target's logits the head holds 2-32 tokens a position at temperature
0.7 and 18-1,722 at 1.0 (MAX_HEAD caps it), and 9 positions take 1.6-3 ms.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from specdec.core.sampling import inverse_cdf, position_key

HEAD_NATS = 20.0  # tokens within this many nats of the likeliest draw noise of their own (a choice of speed only)
MAX_HEAD = 1024  # … at most this many of them: a flatter row's head is its MAX_HEAD likeliest
STREAM = "coupled"  # the keys' stream: one noise a position, the draft's and the target's alike
_TAIL_MAX, _TAIL_PICK = 1 << 40, (1 << 40) + 1  # hash counters of the tail's two draws: past every token id
_GOLDEN, _MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def uniforms(key: int, counters: np.ndarray) -> np.ndarray:
    """Uniforms in [0, 1), float64, one per counter (a token id, or a tail draw's counter): splitmix64 of
    key + counter · golden, its top 53 bits."""
    with np.errstate(over="ignore"):
        x = np.uint64(key) + counters.astype(np.uint64) * _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _MIX1
        x = (x ^ (x >> np.uint64(27))) * _MIX2
        x ^= x >> np.uint64(31)
    return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53


def gumbel(u: np.ndarray) -> np.ndarray:
    """Standard Gumbel noise from uniforms (u = 0, probability 2^-53, gives -inf: that token never wins)."""
    with np.errstate(divide="ignore"):
        return -np.log(-np.log(u))


def coupled_tokens(filtered: torch.Tensor, seed: int, first_position: int, head_nats: float = HEAD_NATS) -> list[int]:
    """filtered: [N, V] filtered logits (-inf where the filters drop a token) of positions first_position.. ->
    the coupled draw x_t of each row, row i at position first_position + i. `head_nats` changes which draws
    are shared, not the law."""
    logits = filtered.detach().float()
    vocab = logits.shape[-1]
    floor = logits.max(dim=-1, keepdim=True).values - head_nats  # [N, 1]: every tail logit is below it
    in_head = logits >= floor  # [N, V]
    crowded = (in_head.sum(dim=-1) > MAX_HEAD).nonzero().flatten().tolist()
    if crowded:  # a flat row: its head is its MAX_HEAD likeliest (and their ties)
        floor[crowded] = torch.topk(logits[crowded], MAX_HEAD, dim=-1).values[:, -1:]
        in_head[crowded] = logits[crowded] >= floor[crowded]
    rows, cols = in_head.nonzero(as_tuple=True)  # the head's (row, token) pairs, row-major
    values = logits[rows, cols].cpu().double().numpy()  # [H]
    rows, cols, floor = rows.cpu().numpy(), cols.cpu().numpy(), floor[:, 0].tolist()
    drawn = []
    for i, row_floor in enumerate(floor):
        key = position_key(seed, first_position + i, STREAM)
        mine = rows == i
        tokens = cols[mine]
        scores = values[mine] + gumbel(uniforms(key, tokens))
        best = int(scores.argmax())
        tail = vocab - len(tokens)
        # The tail's maximum is its log-sum-exp plus a Gumbel draw. Every tail logit is below the floor, so the
        # log-sum-exp is below floor + log(tail): where the head's best beats even that bound (all but about 3e-4
        # of positions with a floor 20 nats down), the log-sum-exp, a pass over the row, is not needed.
        lift = float(gumbel(uniforms(key, np.array([_TAIL_MAX])))[0])
        if tail == 0 or scores[best] >= row_floor + math.log(tail) + lift:
            drawn.append(int(tokens[best]))
            continue
        tail_lse = float(torch.logsumexp(logits[i].masked_fill(in_head[i], float("-inf")).double(), dim=-1))
        head_wins = scores[best] >= tail_lse + lift
        drawn.append(int(tokens[best]) if head_wins else _tail_token(logits[i], in_head[i], key))
    return drawn


def _tail_token(row: torch.Tensor, in_head: torch.Tensor, key: int) -> int:
    """The tail's token, given that the tail holds the maximum: softmax over the tail, by inverse CDF."""
    weights = (row.double() - row.max()).exp().masked_fill(in_head, 0.0)  # [V]
    return inverse_cdf(weights, float(uniforms(key, np.array([_TAIL_PICK]))[0]))
