"""EOS inside a speculative round: a round whose accepted drafts run past an EOS is cut there, the
generation ends with finish reason `stop`, and the output equals target-only decoding's, through gRPC
and through the HTTP API."""

from __future__ import annotations

import pytest
from conftest import TINY_DRAFT, TINY_TARGET, tiny_options
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
