"""EOS inside a speculative round: a round whose accepted drafts run past an EOS is cut there, the
generation ends with finish reason `stop`, and the output equals target-only decoding's, through gRPC
and through the HTTP API."""

from __future__ import annotations

import pytest
from conftest import TINY_DRAFT, TINY_TARGET, assert_speculated, set_fields, tiny_options
from test_http_api import Serve

from specdec.cli.client import generate, make_request
from specdec.launch.stack import EmbeddedStack

PROMPT = "The quick brown fox"
# Target-only greedy output of TINY_TARGET after PROMPT starts 59 217 187 165 3 141 141 192 248 239 …:
# 248 first appears at index 8, which a γ = 3 round starting at index 7 proposes as its second draft,
# and accepts with the third.
EOS = 248
EOS_TARGET = f"{TINY_TARGET},eos={EOS}"
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def eos_stack():
    with EmbeddedStack(tiny_options(target=EOS_TARGET)) as running:
        yield running


def test_the_premise_eos_is_in_the_target_only_output(stack):
    """Without the EOS option the same model goes on past token 248: the cut below is the EOS's doing."""
    tokens = generate(stack.endpoint, make_request(prompt=PROMPT, max_new_tokens=NEW_TOKENS, gamma=0)).token_ids
    assert len(tokens) == NEW_TOKENS and tokens.index(EOS) == 8


@pytest.mark.parametrize("gamma", [1, 3, None], ids=["gamma1", "gamma3", "adaptive"])
def test_eos_inside_an_accepted_round_stops_like_target_only(eos_stack, gamma):
    baseline = generate(eos_stack.endpoint, make_request(prompt=PROMPT, max_new_tokens=NEW_TOKENS, gamma=0))
    assert baseline.stats["finish_reason"] == "stop" and EOS not in baseline.token_ids
    assert len(baseline.token_ids) == 8 and baseline.stats["generated_tokens"] == 8
    result = generate(eos_stack.endpoint, make_request(prompt=PROMPT, max_new_tokens=NEW_TOKENS, gamma=gamma,
                                                       top_logprobs=1))
    assert result.token_ids == baseline.token_ids and result.text == baseline.text
    assert result.stats["finish_reason"] == "stop"
    assert result.stats["generated_tokens"] == sum(r.emitted for r in result.rounds) == 8
    assert len(result.logprobs) == 8, "no log-probability for the EOS or for tokens after it"
    last = result.rounds[-1]
    if gamma is not None:
        # The verdict held accepted + 1 tokens; the round emitted fewer: it was cut at the EOS.
        assert last.emitted < last.accepted + 1, f"the last round was not cut at the EOS: {last}"
    if gamma == 3:
        assert last.emitted < last.accepted, "the EOS should be an accepted draft, with tokens after it"
        assert last.emitted >= 1, "tokens before the EOS in the same round are emitted"


@pytest.mark.parametrize("gamma", [3, None], ids=["gamma3", "adaptive"])
def test_ignore_eos_runs_past_it_and_min_tokens_holds_it_off(stack, eos_stack, gamma):
    """ignore_eos: the output goes on past the EOS at index 8, token for token the output of the same model
    without an EOS. min_tokens 12: no EOS in the first 12 tokens. Both the same under speculation as
    target-only."""
    without = generate(stack.endpoint, make_request(prompt=PROMPT, max_new_tokens=NEW_TOKENS, gamma=0)).token_ids
    for policy in (0, gamma):
        request = make_request(prompt=PROMPT, max_new_tokens=NEW_TOKENS, gamma=policy)
        request.ignore_eos = True
        result = generate(eos_stack.endpoint, request)
        assert result.token_ids == without and result.stats["finish_reason"] == "length"
        if policy == 3:
            assert_speculated(result, "past the EOS")
    held = []
    for policy in (0, gamma):
        request = make_request(prompt=PROMPT, max_new_tokens=NEW_TOKENS, gamma=policy)
        request.min_tokens = 12
        result = generate(eos_stack.endpoint, request)
        held.append((result.token_ids, result.stats["finish_reason"]))
        assert EOS not in result.token_ids and len(result.token_ids) >= 12
        assert result.token_ids[:8] == without[:8] and result.token_ids[8] != EOS
    assert held[0] == held[1]


@pytest.fixture(scope="module")
def eos_serve():
    running = Serve(target=EOS_TARGET, draft=TINY_DRAFT)
    yield running
    running.stop()


@pytest.mark.parametrize("gamma", [0, 1, 3, None], ids=["target-only", "gamma1", "gamma3", "adaptive"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_eos_through_the_http_api(eos_serve, gamma, stream):
    extra = {"proposer": "model", "overlap": "off", **({} if gamma is None else {"gamma": gamma})}
    client = eos_serve.client()
    args = dict(model=EOS_TARGET, prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0, extra_body=extra)
    expected = generate(eos_serve.grpc, make_request(prompt=PROMPT, max_new_tokens=NEW_TOKENS, gamma=0)).text
    if stream:
        chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **args))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        usage = chunks[-1].usage
    else:
        reply = client.completions.create(**args)
        text, finish, usage = reply.choices[0].text, [reply.choices[0].finish_reason], reply.usage
    assert text == expected and finish == ["stop"]
    assert usage.completion_tokens == 8


def test_ending_fields_through_the_http_api(eos_serve):
    """vLLM's `ignore_eos`, `min_tokens` and `stop_token_ids` reach the generation: the same text as gRPC."""
    client = eos_serve.client()
    args = dict(model=EOS_TARGET, prompt=PROMPT, max_tokens=20, temperature=0)
    for fields in ({"ignore_eos": True}, {"min_tokens": 12}, {"stop_token_ids": [187]}):
        want = generate(eos_serve.grpc, set_fields(make_request(prompt=PROMPT, max_new_tokens=20, gamma=0), **fields))
        reply = client.completions.create(**args, extra_body={**fields, "gamma": 3})
        assert reply.choices[0].text == want.text and reply.usage.completion_tokens == len(want.token_ids)
        assert reply.choices[0].finish_reason == want.stats["finish_reason"]
    assert len(client.completions.create(**args, extra_body={"ignore_eos": True}).choices[0].text) > \
        len(client.completions.create(**args).choices[0].text)
