"""A prompt's log-probabilities (`GenerateRequest.prompt_logprobs`; OpenAI's completions `echo` with
`logprobs`, which evaluation harnesses score answers with): each prompt token's under the target's raw
distribution, from every position of one prefill, the same bits a generation of those tokens reports."""

from __future__ import annotations

import grpc
import pytest
import torch
from conftest import PATH_SERVICE, stack_on, tiny_models

from protos import specdec_pb2_grpc as pb_grpc
from specdec.cli.client import generate, make_request
from specdec.core.errors import InvalidArgument
from specdec.core.logprobs import token_logprobs
from specdec.core.params import SamplingParams
from specdec.engine.model_engine import PREFILL_CHUNK, REUSE_MIN_TOKENS
from specdec.engine.target_engine import TargetEngine
from specdec.engine.models import load_model
from specdec.engine.runner import Step
from specdec.runtime.server import CHANNEL_OPTIONS

PROMPT = [40, 41, 42, 43, 7, 99, 3, 3, 120, 64, 12, 5, 77, 31, 31, 8, 90, 64, 2, 11]
LONG = [(7 * i + 3) % 200 + 1 for i in range(PREFILL_CHUNK + 45)]  # two chunks: 45 tokens, then 256


@pytest.mark.parametrize("path,runner", [("fp32", "ragged"), ("gguf-q8", "ragged"), ("fp32", "static")])
def test_prompt_logprobs_are_the_rows_of_one_whole_prefill(path, runner):
    """The engine's numbers for a prompt fed in chunks equal those of the raw log_softmax of one pass over the
    whole prompt, bit for bit; a kept cache of the same prompt is not taken (every position is computed); the
    numbers come on a session's first call only. On the ragged runner and the static one (the GPU's, here on CPU)."""
    static = {"runner": "static", "slots": 4} if runner == "static" else {}
    loaded = load_model(tiny_models(path)[1], "cpu", **PATH_SERVICE[path], **static)
    runner = loaded.runner
    whole = runner.forward([Step(runner.new_cache(), LONG, logits=len(LONG))])[0]  # [P, V]
    want = token_logprobs(whole, LONG[1:], None, 4)
    with TargetEngine(loaded) as engine:
        engine.open("first", SamplingParams())
        engine.verify("first", 0, LONG, [], None)
        engine.release("first")  # kept: a later session with this prompt could take its cache
        engine.open("scored", SamplingParams(temperature=0.7, top_k=5, seed=3, logit_bias=((9, 5.0),)))
        got = engine.verify("scored", 0, LONG, [5, 6], None, prompt_top=4)
        assert got.reused == 0, "the prompt must be computed, not taken from the kept cache"
        assert got.prompt_logprobs == want, "raw numbers, whatever the session's sampling"
        assert len(got.prompt_logprobs) == len(LONG) - 1 and all(len(lp.top) == 4 for lp in got.prompt_logprobs)
        with pytest.raises(InvalidArgument, match="first call"):
            engine.verify("scored", len(LONG), [int(got.verdict.tokens[-1])], [], None, prompt_top=0)
        engine.open("plain", SamplingParams())
        assert engine.verify("plain", 0, LONG, [], None).prompt_logprobs is None
    assert len(LONG) > PREFILL_CHUNK >= REUSE_MIN_TOKENS


def _scored(endpoint: str, prompt: list[int], top: int, **kw):
    return generate(endpoint, make_request(prompt_token_ids=prompt, max_new_tokens=1, gamma=0, prompt_top=top, **kw),
                    timeout=120)


@pytest.mark.parametrize("path", ["fp32", "gguf-q8"])
def test_a_prompt_scores_the_bits_its_generation_reported(request, path):
    """Greedy generation under speculation reports each token's log-probability; scoring prompt + those tokens
    gives the same float32 numbers and alternatives for them, through the services."""
    stack = stack_on(request, path)
    made = generate(stack.endpoint, make_request(prompt_token_ids=PROMPT, max_new_tokens=24, gamma=3,
                                                 top_logprobs=5), timeout=120)
    assert len(made.logprobs) == 24 and made.prompt_logprobs == []
    assert any(r.accepted for r in made.rounds), "no draft token was accepted: nothing speculative ran"
    scored = _scored(stack.endpoint, PROMPT + made.token_ids, 5)
    assert len(scored.prompt_logprobs) == len(PROMPT) + 24 - 1
    assert scored.prompt_logprobs[len(PROMPT) - 1:] == made.logprobs
    assert scored.stats["cached_prompt_tokens"] == 0
    again = _scored(stack.endpoint, PROMPT + made.token_ids, 5, temperature=0.9, seed=4)
    assert again.prompt_logprobs == scored.prompt_logprobs and again.stats["cached_prompt_tokens"] == 0


def test_prompt_logprobs_come_once_with_n_choices_and_not_unless_asked(stack):
    request = make_request(prompt_token_ids=PROMPT, max_new_tokens=6, temperature=1.0, seed=5, prompt_top=2)
    request.n = 3
    with grpc.insecure_channel(stack.endpoint, options=CHANNEL_OPTIONS) as channel:
        messages = list(pb_grpc.SpecDecStub(channel).Generate(request, timeout=120))
    carrying = [m for m in messages if m.prompt_logprobs]
    assert len(carrying) == 1 and carrying[0].choice == 0 and messages[0] is carrying[0]
    assert list(carrying[0].prompt_token_ids) == PROMPT
    assert list(carrying[0].prompt_logprobs) == _scored(stack.endpoint, PROMPT, 2).prompt_logprobs
    assert {m.choice for m in messages} == {0, 1, 2}
    plain = generate(stack.endpoint, make_request(prompt_token_ids=PROMPT, max_new_tokens=4, top_logprobs=2))
    assert plain.prompt_logprobs == [] and len(plain.logprobs) == 4


def test_reference_is_the_raw_log_softmax():
    """`token_logprobs` without sampling parameters: log_softmax of the logits as they are."""
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(2))
    got = token_logprobs(logits, [3, 9], None, 2)
    raw = logits.log_softmax(-1)
    assert [lp.logprob for lp in got] == [float(raw[0, 3]), float(raw[1, 9])]
    assert got[1].top == tuple(zip(raw[1].topk(2).indices.tolist(), raw[1].topk(2).values.tolist()))
