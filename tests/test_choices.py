"""n choices from one prompt: the prompt's KV computed once and copied into the other sessions
(`Engine._reuse_prefix`), each choice its own generation with seed + i, interleaved on one stream."""

from __future__ import annotations

import grpc
import pytest
import torch
from conftest import TINY_TARGET, choices, count_fed

from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.cli.client import generate, make_request
from specdec.core.params import SamplingParams
from specdec.engine.model_engine import REUSE_MIN_TOKENS
from specdec.engine.target_engine import TargetEngine
from specdec.engine.models import load_model
from specdec.runtime.server import CHANNEL_OPTIONS

PROMPT = [(3 * i) % 250 for i in range(40)]


@pytest.mark.parametrize("runner", ["ragged", "static"])
def test_a_session_with_a_live_sessions_prefix_copies_its_kv(runner):
    engine = TargetEngine(load_model(TINY_TARGET, "cpu", runner=runner, slots=4))
    fed = count_fed(engine.runner)
    try:
        engine.open("a", SamplingParams())
        first = engine.verify("a", 0, PROMPT, [7, 8], None).verdict
        engine.open("b", SamplingParams())
        fed.clear()
        second = engine.verify("b", 0, PROMPT, [7, 8], None).verdict
        assert sum(fed) == 3, f"fed {fed}: the prompt's last token and the two drafts, nothing more"
        assert engine.cached("b") == len(PROMPT) + 2
        assert second == first
        engine.open("c", SamplingParams())  # shares only REUSE_MIN_TOKENS - 1 tokens: computed
        fed.clear()
        engine.verify("c", 0, PROMPT[:REUSE_MIN_TOKENS - 1] + [1, 2, 3], [], None)
        assert sum(fed) == REUSE_MIN_TOKENS + 2
    finally:
        engine.close()


def test_copied_kv_gives_the_same_bits(stack):
    """Greedy n = 3 (the others copy choice 0's prompt KV): every choice equals the n = 1 output, logprobs
    to the bit, under speculation."""
    prompt = dict(prompt_token_ids=PROMPT)
    single = generate(stack.endpoint, make_request(**prompt, max_new_tokens=24, gamma=3, top_logprobs=2))
    chosen = choices(stack.endpoint, make_request(**prompt, max_new_tokens=24, gamma=3, top_logprobs=2), 3)
    for tokens, logprobs, stats in chosen:
        assert tokens == single.token_ids and logprobs == single.logprobs
        assert stats.finish_reason == pb.FINISH_REASON_LENGTH and stats.generated_tokens == 24


def test_sampled_choices_use_seed_plus_their_index(stack):
    request = make_request(prompt="hello", max_new_tokens=16, temperature=1.0, seed=5, gamma=2)
    chosen = choices(stack.endpoint, request, 3)
    for i, (tokens, _, _) in enumerate(chosen):
        alone = make_request(prompt="hello", max_new_tokens=16, temperature=1.0, seed=5 + i, gamma=2)
        assert tokens == generate(stack.endpoint, alone).token_ids, f"choice {i} is not seed {5 + i}'s generation"
    assert len({tuple(tokens) for tokens, _, _ in chosen}) == 3


@pytest.mark.parametrize("fields,message", [(dict(n=9), "n must be in [1, 8]"),
                                            (dict(n=2, session_id="s1"), "not resumable")])
def test_bad_choice_counts_are_refused(stack, fields, message):
    request = make_request(prompt="x", max_new_tokens=4)
    for key, value in fields.items():
        setattr(request, key, value)
    with grpc.insecure_channel(stack.endpoint, options=CHANNEL_OPTIONS) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            list(pb_grpc.SpecDecStub(channel).Generate(request, timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in caught.value.details()


def test_the_prefix_copy_is_exact_on_the_static_runner():
    """The static runner's slot copy: a copied prefix scores the next token to the bit."""
    runner = load_model(TINY_TARGET, "cpu", runner="static", slots=3).runner
    from specdec.engine.runner import Step

    source, copy, fresh = runner.new_cache(), runner.new_cache(), runner.new_cache()
    runner.forward([Step(source, PROMPT)])
    runner.copy_prefix(source, copy, len(PROMPT))
    runner.forward([Step(fresh, PROMPT)])
    a, b = (runner.forward([Step(c, [9])])[0] for c in (copy, fresh))
    assert torch.equal(a, b)
