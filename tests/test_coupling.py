"""The coupled sampler (`specdec.core.coupling`): exact draws from the target's distribution, keyed by
(seed, position) alone, so that speculation never changes a sampled output."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from conftest import TINY_DRAFT, TINY_TARGET

from specdec.cli.client import generate, make_request
from specdec.core import coupling
from specdec.core.coupling import HEAD_NATS, MAX_HEAD, STREAM, coupled_tokens, uniforms
from specdec.core.params import SamplingParams
from specdec.core.sampling import filtered_logits, position_key, probs_from_logits
from specdec.engine.draft_engine import DraftEngine
from specdec.engine.target_engine import TargetEngine
from specdec.engine.models import load_model

V = 8
DRAWS = 4000


def tv_bound(support: int, draws: int) -> float:
    """A total-variation distance an exact sampler's histogram exceeds with probability < 1e-4."""
    return 0.5 * math.sqrt(support / draws) + math.sqrt(math.log(1e4) / (2 * draws))


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.6, top_k=5),
                                    SamplingParams(temperature=1.3, top_p=0.8)], ids=["plain", "top_k", "top_p"])
@pytest.mark.parametrize("head_nats,max_head", [(HEAD_NATS, MAX_HEAD), (1.0, MAX_HEAD), (0.0, MAX_HEAD),
                                               (HEAD_NATS, 3)])
def test_coupled_draws_follow_the_filtered_distribution(params, head_nats, max_head, monkeypatch):
    """Over seeds (and positions: each is its own noise) the draws' histogram is the softmax of the filtered
    logits, and a token the filters drop never comes up: with every token in the head (each its own noise), with
    most or all but the likeliest in the tail (its maximum drawn first, then its token), and with a head cut to
    the 3 likeliest."""
    monkeypatch.setattr(coupling, "MAX_HEAD", max_head)
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(3)) * 1.5  # [1, V]
    p = probs_from_logits(logits, params)[0]  # [V]
    filtered = filtered_logits(logits, params)
    counts = torch.zeros(V)
    for seed in range(DRAWS):
        counts[coupled_tokens(filtered, seed, seed % 7, head_nats)[0]] += 1
    tv = 0.5 * (counts / DRAWS - p).abs().sum().item()
    assert tv < tv_bound(int((p > 0).sum()), DRAWS), f"TV {tv:.3f}"
    assert counts[p == 0].sum() == 0


def test_the_tail_is_drawn_from_when_it_holds_the_maximum():
    """With a head of the likeliest token alone, the tail's token comes up about as often as its mass."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.0]])
    draws = [coupled_tokens(logits, seed, 0, head_nats=0.0)[0] for seed in range(2000)]
    tail_share = sum(d != 0 for d in draws) / 2000
    assert abs(tail_share - (1 - logits.softmax(-1)[0, 0].item())) < 0.04


def test_noise_is_keyed_by_seed_position_and_token_alone():
    ids = np.arange(1000)
    assert np.array_equal(uniforms(position_key(5, 10, STREAM), ids), uniforms(position_key(5, 10, STREAM), ids))
    assert not np.array_equal(uniforms(position_key(5, 10, STREAM), ids), uniforms(position_key(5, 11, STREAM), ids))
    assert not np.array_equal(uniforms(position_key(5, 10, STREAM), ids), uniforms(position_key(6, 10, STREAM), ids))
    # A token's noise does not depend on which other tokens draw theirs (the draft's head is not the target's).
    assert np.array_equal(uniforms(7, ids)[[3, 500, 999]], uniforms(7, np.array([3, 500, 999])))
    u = uniforms(7, np.arange(200_000))
    assert 0.0 <= u.min() and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.003
    # A block of rows draws what each position alone draws: a verify of γ + 1 rows is one-token steps' sampling.
    rows = torch.randn(3, 100) * 4
    assert coupled_tokens(rows, 5, 10) == [coupled_tokens(rows[i:i + 1], 5, 10 + i)[0] for i in range(3)]


def test_a_draft_sampled_alike_agrees_where_the_distributions_do():
    """Draft and target perturb a position with the same noise: equal distributions give the same token
    always, and close ones mostly (at least (1 - TV) / (1 + TV) in expectation)."""
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(400, V, generator=gen)
    close = p + 0.3 * torch.randn(400, V, generator=gen)
    same = sum(coupled_tokens(p[i:i + 1], i, 0) == coupled_tokens(p[i:i + 1], i, 0) for i in range(400))
    assert same == 400
    agree = sum(coupled_tokens(p[i:i + 1], i, 0) == coupled_tokens(close[i:i + 1], i, 0) for i in range(400))
    tv = 0.5 * (p.softmax(-1) - close.softmax(-1)).abs().sum(-1).mean().item()
    assert agree / 400 > (1 - tv) / (1 + tv) - 0.08, (agree, tv)


# -- through the engines --------------------------------------------------------------------------------------
PROMPT = [40, 41, 42, 43, 7, 99]
COUPLED = SamplingParams(temperature=0.9, top_k=40, seed=11, coupled=True)


@pytest.fixture(scope="module")
def engines():
    with DraftEngine(load_model(TINY_DRAFT, "cpu")) as draft, TargetEngine(load_model(TINY_TARGET, "cpu")) as target:
        yield draft, target


def speculate(draft: DraftEngine, target: TargetEngine, params: SamplingParams, gammas, new: int,
              session: str) -> tuple[list[int], int]:
    """(tokens, drafts accepted) of a generation whose rounds draft gammas[i % len] tokens (0: target-only)."""
    draft.open(session, params)
    target.open(session, params)
    tokens, told_draft, told_target, accepted = list(PROMPT), 0, 0, 0
    for i in range(new):
        if len(tokens) - len(PROMPT) >= new:
            break
        gamma = gammas[i % len(gammas)]
        proposal = draft.propose(session, told_draft, tokens[told_draft:], gamma) if gamma else None
        told_draft = len(tokens) if gamma else told_draft
        drafts = proposal.tokens if proposal else []
        verdict = target.verify(session, told_target, tokens[told_target:], drafts,
                                proposal.probs if proposal else None).verdict
        told_target = len(tokens)
        accepted += verdict.num_accepted
        tokens += verdict.tokens
    out = tokens[len(PROMPT):]
    draft.release(session)
    target.release(session)
    return out[:new], accepted


def test_coupled_output_is_target_only_output_under_any_gamma(engines):
    """The sampled output is the target-only output for the seed, whatever the rounds draft; the rejection
    sampler's is not (its sample depends on the round boundaries), which shows the comparison can fail."""
    draft, target = engines
    alone, _ = speculate(draft, target, COUPLED, [0], 40, "alone")
    for gammas in ([1], [3], [6], [2, 0, 5, 1]):
        out, accepted = speculate(draft, target, COUPLED, gammas, 40, f"coupled-{gammas}")
        assert out == alone, gammas
        assert accepted > 0, "no draft was ever accepted: nothing was compared"
    rejection = SamplingParams(temperature=0.9, top_k=40, seed=11)
    outputs = {tuple(speculate(draft, target, rejection, gammas, 40, f"rejection-{gammas}")[0])
               for gammas in ([0], [1], [3], [6])}
    assert len(outputs) > 1


def test_the_draft_sends_no_q_and_a_twin_draft_is_always_accepted(engines):
    """A coupled draft needs no q on the wire; with the target's own model as the draft every token is
    accepted, so the draft's positions and noise are the target's."""
    _, target = engines
    with DraftEngine(load_model(TINY_TARGET, "cpu")) as twin:
        twin.open("t", COUPLED)
        proposal = twin.propose("t", 0, PROMPT, 4)
        assert proposal.probs is None and len(proposal.tokens) == 4
        twin.release("t")
        out, accepted = speculate(twin, target, COUPLED, [4], 30, "twin")
    assert accepted == len(out) - len(out) // 5  # every round: 4 accepted and the bonus


# -- through the services -------------------------------------------------------------------------------------
def test_a_seeded_sample_is_the_same_whatever_the_speculation(stack):
    """Through the real services: one seed's sampled output under target-only decoding, fixed γ, the adaptive
    policy, each proposer, drafting during verification and six sessions at once is one output."""
    prompt = [40, 41, 42, 43, 40, 41, 42, 43, 40, 41]  # repeats, so that lookups propose too

    def run(seed: int, **speculation) -> tuple[list[int], int]:
        request = make_request(prompt_token_ids=prompt, max_new_tokens=40, temperature=0.9, top_k=40, seed=seed,
                               sampler="coupled", **speculation)
        result = generate(stack.endpoint, request, timeout=60)
        return result.token_ids, sum(r.accepted for r in result.rounds)

    ways = [dict(gamma=1), dict(gamma=4), dict(), dict(proposer="ngram"), dict(proposer="hybrid"),
            dict(gamma=3, overlap="on")]
    for seed in (1, 2):
        alone, _ = run(seed, gamma=0)
        accepted = 0
        for way in ways:
            tokens, taken = run(seed, **way)
            assert tokens == alone, way
            accepted += taken
        assert accepted > 0, "no draft was accepted: nothing was compared"
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda seed: run(seed, gamma=2)[0], range(6)))
    assert together == [run(seed, gamma=0)[0] for seed in range(6)]
