"""Log-probabilities: what they are (`specdec.core.logprobs`), and that speculation never changes them."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch
from conftest import PATH_SERVICE, refusal, stack_on, tiny_models

from orchestrator.clients import target_client
from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.cli.client import generate, make_request
from specdec.core.logprobs import token_logprobs
from specdec.core.params import SamplingParams
from specdec.core.sampling import filtered_logits, probs_from_logits
from specdec.engine.models import load_model
from specdec.engine.runner import Step
from specdec.runtime.server import CHANNEL_OPTIONS

PROMPTS = [[40, 41, 42, 43], [7, 99, 3, 3, 120, 64], list(range(60, 90))]


def test_greedy_logprobs_are_the_raw_distribution():
    logits = torch.randn(3, 50)
    out = token_logprobs(logits, [4, 0, 9], SamplingParams(), top=5)
    raw = logits.log_softmax(-1)
    for i, (token, lp) in enumerate(zip([4, 0, 9], out)):
        assert lp.logprob == float(raw[i, token])
        values, ids = raw[i].topk(5)
        assert lp.top == tuple(zip(ids.tolist(), values.tolist()))


def test_a_tokens_rank_counts_the_likelier_tokens_and_ties_share_it():
    logits = torch.tensor([[0.5, 2.0, 0.5, -1.0, 2.0]])
    ranks = [token_logprobs(logits, [token], None, top=0)[0].rank for token in range(5)]
    assert ranks == [3, 1, 3, 5, 1]
    filtered = token_logprobs(logits, [1], SamplingParams(temperature=1.0, top_k=1, seed=0), top=0)[0]
    assert filtered.rank == 1  # under the filters, among what they keep


def test_sampled_logprobs_are_log_p_after_the_filters():
    """log p of the p the rejection sampler uses; filtered tokens (-inf) are never listed."""
    logits = torch.randn(2, 50)
    params = SamplingParams(temperature=0.7, top_k=3, seed=1)
    p = probs_from_logits(logits, params)  # [2, V]
    tokens = [int(p[0].argmax()), int(p[1].argmin() if p[1].min() > 0 else p[1].argmax())]
    out = token_logprobs(logits, tokens, params, top=6)
    for i, lp in enumerate(out):
        assert abs(lp.logprob - float(p[i, tokens[i]].log())) < 1e-5
        assert len(lp.top) == 3, "top_k=3 keeps three tokens; the rest have probability 0"
        assert {t for t, _ in lp.top} == set(p[i].nonzero().squeeze(-1).tolist())
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)


def _processed_logprobs(row: list[float], temperature: float, top_p: float) -> dict[int, float]:
    """Temperature then top-p, written out in float64: log p of every token the filter keeps."""
    scaled = [x / temperature for x in row]
    top = max(scaled)
    weights = [math.exp(x - top) for x in scaled]
    probs = [w / sum(weights) for w in weights]
    kept, mass = [], 0.0
    for token in sorted(range(len(row)), key=lambda t: -probs[t]):
        if mass >= top_p:
            break
        kept.append(token)
        mass += probs[token]
    total = sum(probs[t] for t in kept)
    return {t: math.log(probs[t] / total) for t in kept}


def test_rows_do_not_depend_on_their_neighbours():
    """A row's numbers are the same bits computed alone, among neighbours or after a shuffle, both as
    logprobs and as the batched filter the rejection sampler applies to all γ+1 rows at once; and
    they equal a float64 transcription of the definition."""
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(4))
    params = SamplingParams(temperature=0.9, top_p=0.8)
    tokens = [int(logits[i].argmax()) if i % 2 else int(logits[i].topk(3).indices[-1]) for i in range(5)]
    together = token_logprobs(logits, tokens, params, top=4)
    alone = [token_logprobs(logits[i:i + 1], tokens[i:i + 1], params, top=4)[0] for i in range(5)]
    order = [3, 0, 4, 1, 2]
    shuffled = token_logprobs(logits[order], [tokens[i] for i in order], params, top=4)
    assert together == alone and [together[i] for i in order] == shuffled
    batched = filtered_logits(logits, params)  # [5, V], as the rejection sampler computes p
    for i in range(5):
        assert torch.equal(batched[i:i + 1], filtered_logits(logits[i:i + 1], params))
        assert torch.equal(batched[i].log_softmax(-1)[tokens[i]], torch.tensor(together[i].logprob))
        want = _processed_logprobs(logits[i].tolist(), 0.9, 0.8)
        assert abs(together[i].logprob - want[tokens[i]]) < 1e-5
        assert [t for t, _ in together[i].top] == sorted(want, key=lambda t: -want[t])[:4]


def _run(endpoint: str, prompt: list[int], top: int, **kw):
    result = generate(endpoint, make_request(prompt_token_ids=prompt, max_new_tokens=24, top_logprobs=top, **kw),
                      timeout=120)
    assert len(result.logprobs) == len(result.token_ids)
    return result


def _reference(path: str, prompt: list[int], tokens: list[int], params: SamplingParams, top: int):
    """Each generated token's TokenLogprob from one prefill of prompt + tokens, on a locally loaded target."""
    runner = load_model(tiny_models(path)[1], "cpu", **PATH_SERVICE[path]).runner
    logits = runner.forward([Step(runner.new_cache(), prompt + tokens, logits=len(tokens) + 1)])[0]  # [n+1, V]
    return token_logprobs(logits, tokens, params, top)


def _assert_close(got: list[pb.TokenLogprob], want, tol: float = 1e-5) -> None:
    for g, w in zip(got, want, strict=True):
        assert abs(g.logprob - w.logprob) <= tol
        assert list(g.top_ids) == [t for t, _ in w.top]
        assert max((abs(a - b) for a, (_, b) in zip(g.top_logprobs, w.top)), default=0.0) <= tol


# Each way of proposing, and what a run of it must show for its rounds to have been exercised.
PROPOSALS = {
    "model-gamma3": (dict(gamma=3), lambda r: r.proposer == "model" and r.accepted > 0),
    "model-adaptive": (dict(), None),  # the adaptive policy may rightly choose target-only here
    "ngram": (dict(gamma=3, proposer="ngram"), lambda r: r.proposer == "ngram" and r.accepted > 0),
    "hybrid": (dict(proposer="hybrid"), lambda r: r.proposer == "ngram" and r.accepted > 0),
    "overlap": (dict(gamma=3, overlap="on"), lambda r: r.overlapped and r.accepted > 0),
}


@pytest.mark.parametrize("path", ["fp32", "gguf", "gguf-q8"])
def test_greedy_logprobs_equal_target_only_under_any_gamma_proposer_and_batch(request, path):
    """Bit-identical (protobuf float32 equality) to γ = 0 for fixed and adaptive γ, for lookups (ngram,
    hybrid: the prompts' target-only runs are in the server's memory, so lookups find them), for rounds
    drafted during the last verify (overlap), and for 4 sessions sharing passes; and equal to a local
    prefill's within 1e-5."""
    stack = stack_on(request, path)
    baseline = [_run(stack.endpoint, prompt, 5, gamma=0) for prompt in PROMPTS]
    for name, (fields, exercised) in PROPOSALS.items():
        rounds = []
        for prompt, want in zip(PROMPTS, baseline):
            got = _run(stack.endpoint, prompt, 5, **fields)
            assert got.token_ids == want.token_ids
            assert got.logprobs == want.logprobs, f"logprobs changed under {name}"
            rounds += got.rounds
        assert exercised is None or any(map(exercised, rounds)), f"{name}: no round of its kind was accepted"
    target = target_client(stack.target_address)
    before = target.info()
    with ThreadPoolExecutor(4) as pool:
        batched = list(pool.map(lambda prompt: _run(stack.endpoint, prompt, 5, gamma=0), PROMPTS * 4))
    after = target.info()
    steps, passes = after.forward_steps - before.forward_steps, after.forward_passes - before.forward_passes
    assert steps > passes, f"the 4 sessions never shared a pass: {steps} steps in {passes} passes"
    assert [r.logprobs for r in batched] == [r.logprobs for r in baseline * 4], "logprobs changed under batching"
    for prompt, want in zip(PROMPTS, baseline):
        _assert_close(want.logprobs, _reference(path, prompt, want.token_ids, SamplingParams(), 5))


def test_sampled_logprobs_are_the_targets_processed_distribution(stack):
    """Accepted, recovered and bonus tokens all carry log p under the filtered target distribution."""
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=11)
    for prompt in PROMPTS:
        got = _run(stack.endpoint, prompt, 20, gamma=3, temperature=0.8, top_k=20, top_p=0.9, seed=11)
        rounds = got.rounds
        assert any(r.accepted < r.drafted for r in rounds) and any(r.accepted for r in rounds)
        want = _reference("fp32", prompt, got.token_ids, params, 20)
        _assert_close(got.logprobs, want)
        assert all(len(lp.top_ids) <= 20 for lp in got.logprobs)


def test_no_logprobs_unless_asked(stack):
    result = generate(stack.endpoint, make_request(prompt_token_ids=PROMPTS[0], max_new_tokens=8), timeout=60)
    assert result.logprobs == []
    only = _run(stack.endpoint, PROMPTS[0], 0)
    assert all(not lp.top_ids for lp in only.logprobs)


@pytest.mark.parametrize("fields,message", [
    (dict(logprobs=True, top_logprobs=21), "top_logprobs must be in [0, 20]"),
    (dict(top_logprobs=3), "top_logprobs needs logprobs"),
    (dict(logprobs=True, resume=True, session_id="x"), "not kept in session records"),
    (dict(prompt_logprobs=True, top_logprobs=21), "top_logprobs must be in [0, 20]"),
    (dict(prompt_logprobs=True, resume=True, session_id="x"), "not kept in session records"),
])
def test_bad_logprob_requests_are_refused(stack, fields, message):
    refused = refusal(stack.endpoint, pb.GenerateRequest(prompt_token_ids=PROMPTS[0], max_new_tokens=4, **fields))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in refused.details()


def test_info_reports_the_target_and_the_orchestrators_caps(stack):
    with grpc.insecure_channel(stack.endpoint, options=CHANNEL_OPTIONS) as channel:
        info = pb_grpc.SpecDecStub(channel).Info(pb.ModelInfoRequest(), timeout=10)
    assert info.model == tiny_models("fp32")[1]
    assert (info.max_new_tokens, info.max_gamma) == (1024, 6)
    assert info.vocab_size > 0 and info.max_context > 0

