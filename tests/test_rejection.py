"""Rejection sampler: greedy tables, losslessness (total variation), reference agreement, seeding."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.core.errors import InvalidArgument
from specdec.core.params import SamplingParams
from specdec.core.rejection import Verdict, verify_greedy, verify_sampled
from specdec.core.sampling import probs_from_logits

V = 8


def peaked_logits(wanted: list[int], vocab: int = V) -> torch.Tensor:
    """[len(wanted), V] logits with +100 at each wanted id."""
    logits = torch.zeros(len(wanted), vocab)
    logits[torch.arange(len(wanted)), torch.tensor(wanted)] = 100.0
    return logits


@pytest.mark.parametrize(
    "drafts, target_ids, expected, accepted",
    [
        ([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4], 3),  # all accepted + bonus
        ([1, 2, 3], [1, 5, 3, 4], [1, 5], 1),  # first mismatch recovers the target's token
        ([1, 2, 3], [7, 2, 3, 4], [7], 0),  # nothing accepted
        ([], [6], [6], 0),  # γ = 0: a plain decoding step
    ],
)
def test_greedy_table(drafts, target_ids, expected, accepted):
    verdict = verify_greedy(drafts, peaked_logits(target_ids))
    assert verdict.tokens == expected
    assert verdict.num_accepted == accepted


def random_dist(gen: torch.Generator, rows: int, params: SamplingParams, scale: float = 2.0) -> torch.Tensor:
    return probs_from_logits(torch.randn(rows, V, generator=gen) * scale, params)


def tv_bound(samples: int, vocab: int = V, confidence: float = 1e-4) -> float:
    """A bound on TV(empirical, true) that holds with probability >= 1 - confidence.

    E[TV] <= 0.5*sqrt(V/n) and TV is 1/n-Lipschitz per sample (McDiarmid), so
    TV <= 0.5*sqrt(V/n) + sqrt(ln(1/δ)/(2n)).
    """
    return 0.5 * math.sqrt(vocab / samples) + math.sqrt(math.log(1 / confidence) / (2 * samples))


def first_token_histogram(q: torch.Tensor | None, p: torch.Tensor, draw_draft, samples: int) -> torch.Tensor:
    """Run the sampler `samples` times; histogram of the first emitted token."""
    counts = torch.zeros(V)
    gen = torch.Generator().manual_seed(1234)
    for _ in range(samples):
        drafts = draw_draft(gen)
        verdict = verify_sampled(drafts, q, p, gen)
        counts[verdict.tokens[0]] += 1
    return counts / samples


SAMPLING_CASES = {
    "temperature": SamplingParams(temperature=0.8),
    "top_k": SamplingParams(temperature=1.0, top_k=3),
    "top_p": SamplingParams(temperature=1.0, top_p=0.7),
}


@pytest.mark.parametrize("case", sorted(SAMPLING_CASES))
@pytest.mark.parametrize("relation", ["random", "equal", "disjoint"])
def test_output_matches_target_distribution(case, relation):
    params = SAMPLING_CASES[case]
    gen = torch.Generator().manual_seed(7)
    gamma, samples = 2, 6000
    p = random_dist(gen, gamma + 1, params)  # [γ+1, V]
    if relation == "random":
        q = random_dist(gen, gamma, params)
    elif relation == "equal":
        q = p[:gamma].clone()
    else:  # q puts all its mass where p has none at position 0
        q = torch.zeros(gamma, V)
        outside = (p[0] == 0).nonzero().flatten()
        if outside.numel() == 0:  # unfiltered p has full support: make p zero on half the vocabulary
            p[:, V // 2:] = 0
            p = p / p.sum(-1, keepdim=True)
            outside = torch.arange(V // 2, V)
        q[:, outside] = 1.0 / outside.numel()

    def draw(g):
        return torch.stack([torch.multinomial(q[i], 1, generator=g)[0] for i in range(gamma)])

    hist = first_token_histogram(q, p, draw, samples)
    tv = 0.5 * (hist - p[0]).abs().sum().item()
    assert tv < tv_bound(samples), f"TV {tv:.4f} exceeds bound {tv_bound(samples):.4f}"
    assert hist[p[0] == 0].sum() == 0, "a token the target's filter masks was emitted"


def test_equal_distributions_accept_everything():
    gen = torch.Generator().manual_seed(3)
    p = random_dist(gen, 4, SamplingParams(temperature=1.0))
    drafts = torch.tensor([0, 1, 2])
    assert verify_sampled(drafts, p[:3].clone(), p, gen).num_accepted == 3


def test_disjoint_supports_accept_nothing():
    p = torch.zeros(3, V)
    p[:, :4] = 0.25
    q = torch.zeros(2, V)
    q[:, 4:] = 0.25
    for seed in range(50):
        verdict = verify_sampled(torch.tensor([5, 6]), q, p, torch.Generator().manual_seed(seed))
        assert verdict.num_accepted == 0 and verdict.tokens[0] < 4


def test_point_mass_proposer_is_lossless():
    gen = torch.Generator().manual_seed(11)
    p = random_dist(gen, 2, SamplingParams(temperature=1.0))
    samples = 6000
    hist = first_token_histogram(None, p, lambda g: torch.tensor([2]), samples)
    assert 0.5 * (hist - p[0]).abs().sum().item() < tv_bound(samples)


def residual_reference(p: torch.Tensor, q: torch.Tensor | None, rejected: int) -> torch.Tensor:
    """norm(max(0, p − q)) written out element by element; a point-mass q (None) removes the rejected token."""
    values = p.tolist()
    if q is None:
        rest = [0.0 if i == rejected else v for i, v in enumerate(values)]
    else:
        rest = [max(v - w, 0.0) for v, w in zip(values, q.tolist(), strict=True)]
    if sum(rest) <= 0:  # p == q: the rejection had probability 0 up to rounding
        return p
    rest = torch.tensor(rest, dtype=torch.float32)
    return rest / rest.sum()


def verify_reference(
    draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> Verdict:
    """Slow, literal transcription of the algorithm; draws random numbers like `verify_sampled`."""
    gamma = len(draft_tokens)
    u = torch.rand(gamma, generator=generator, device=target_probs.device).tolist()
    for i, x in enumerate(draft_tokens):
        p = float(target_probs[i, x])
        q = 1.0 if draft_probs is None else float(draft_probs[i, x])
        if u[i] < p / q:
            continue
        q_row = None if draft_probs is None else draft_probs[i]
        last = residual_reference(target_probs[i], q_row, x)
        return Verdict(list(draft_tokens[:i]) + [draw_reference(last, generator)], i)
    return Verdict(list(draft_tokens) + [draw_reference(target_probs[gamma], generator)], gamma)


def draw_reference(probs: torch.Tensor, generator: torch.Generator) -> int:
    """A categorical draw, literally: the first token whose running sum of weights passes u · the total."""
    u = float(torch.rand((), dtype=torch.float64, generator=generator))
    weights = probs.double().tolist()
    point, running = u * sum(weights), 0.0
    for token, weight in enumerate(weights):
        running += weight
        if running > point:
            return token
    return max(t for t, w in enumerate(weights) if w > 0)


@pytest.mark.parametrize("with_q", [True, False])
def test_reference_agrees_with_vectorised(with_q):
    gen = torch.Generator().manual_seed(5)
    params = SamplingParams(temperature=1.0, top_k=5)
    for seed in range(300):
        p = random_dist(gen, 4, params)
        q = random_dist(gen, 3, params) if with_q else None
        support = q if with_q else p[:3]
        drafts = torch.stack([torch.multinomial(support[i], 1, generator=gen)[0] for i in range(3)])
        fast = verify_sampled(drafts, q, p, torch.Generator().manual_seed(seed))
        slow = verify_reference(drafts.tolist(), q, p, torch.Generator().manual_seed(seed))
        assert fast == slow


def test_seeded_runs_reproduce():
    gen = torch.Generator().manual_seed(9)
    p, q = random_dist(gen, 5, SamplingParams(temperature=1.0)), random_dist(gen, 4, SamplingParams(temperature=1.0))
    drafts = torch.tensor([1, 2, 3, 4])
    runs = [[verify_sampled(drafts, q, p, torch.Generator().manual_seed(s)).tokens for s in range(20)] for _ in range(2)]
    assert runs[0] == runs[1]
    assert len({tuple(t) for t in runs[0]}) > 1, "different seeds should give different outcomes"


def test_zero_draft_probability_is_refused():
    q = torch.zeros(1, V)
    q[0, 0] = 1.0
    with pytest.raises(InvalidArgument):
        verify_sampled(torch.tensor([3]), q, torch.full((2, V), 1.0 / V), torch.Generator())


class ToyModel:
    """A next-token distribution for every prefix (drawn once, then kept): a stand-in for a model."""

    def __init__(self, seed: int, params: SamplingParams, vocab: int = 3):
        self.gen, self.params, self.vocab, self.table = torch.Generator().manual_seed(seed), params, vocab, {}

    def __call__(self, prefix: tuple[int, ...]) -> torch.Tensor:  # [V]
        if prefix not in self.table:
            logits = torch.randn(1, self.vocab, generator=self.gen) * 1.5
            self.table[prefix] = probs_from_logits(logits, self.params)[0]
        return self.table[prefix]


def speculative_prefix(p: ToyModel, q: ToyModel, gamma: int, length: int, gen: torch.Generator) -> tuple[int, ...]:
    """The first `length` tokens of speculative decoding: rounds of γ drafts from q, verified against p."""
    out: list[int] = []
    while len(out) < length:
        drafts, q_rows = [], []
        for _ in range(gamma):
            row = q((*out, *drafts))
            q_rows.append(row)
            drafts.append(int(torch.multinomial(row, 1, generator=gen)))
        p_rows = torch.stack([p((*out, *drafts[:i])) for i in range(gamma + 1)])  # [γ+1, V]
        out += verify_sampled(torch.tensor(drafts), torch.stack(q_rows), p_rows, gen).tokens
    return tuple(out[:length])


def test_the_joint_law_of_the_first_tokens_is_the_targets():
    """Not only the first token: the first three tokens of speculative decoding with γ = 2 (drafts
    accepted, a recovered token, the bonus token after two accepted drafts, and the next round's
    tokens) have the target's joint law p(x1)·p(x2|x1)·p(x3|x1,x2), over all 27 sequences."""
    p = ToyModel(11, SamplingParams(temperature=1.0, top_k=2))  # masks one token per position
    q = ToyModel(12, SamplingParams(temperature=1.0))
    samples, gen = 12000, torch.Generator().manual_seed(5)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(samples):
        seq = speculative_prefix(p, q, 2, 3, gen)
        counts[seq] = counts.get(seq, 0) + 1
    sequences = [(a, b, c) for a in range(3) for b in range(3) for c in range(3)]
    law = {s: float(p(())[s[0]] * p(s[:1])[s[1]] * p(s[:2])[s[2]]) for s in sequences}
    tv = 0.5 * sum(abs(counts.get(s, 0) / samples - law[s]) for s in sequences)
    assert tv < tv_bound(samples, vocab=len(sequences)), f"TV {tv:.4f}"
    assert all(law[s] > 0 for s in counts), "a sequence the target's filter excludes was emitted"


def test_the_bonus_token_follows_the_target_after_every_draft_is_accepted():
    """Given that all γ drafts were accepted, the last emitted token is drawn from p[γ] alone."""
    gen = torch.Generator().manual_seed(9)
    gamma, samples = 2, 6000
    params = SamplingParams(temperature=1.0)
    p, q = random_dist(gen, gamma + 1, params), random_dist(gen, gamma, params)
    p[:gamma] = 0.5 * p[:gamma] + 0.5 * q  # accept often, so that many rounds end with a bonus token
    bonus = torch.zeros(V)
    for _ in range(samples):
        drafts = torch.stack([torch.multinomial(q[i], 1, generator=gen)[0] for i in range(gamma)])
        verdict = verify_sampled(drafts, q, p, gen)
        if verdict.num_accepted == gamma:
            bonus[verdict.tokens[gamma]] += 1
    n = int(bonus.sum())
    assert n > samples / 4, f"only {n} rounds accepted every draft"
    tv = 0.5 * (bonus / n - p[gamma]).abs().sum().item()
    assert tv < tv_bound(n), f"TV {tv:.4f} over {n} bonus tokens"
