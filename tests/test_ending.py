"""How an output may end (vLLM's fields): `stop_token_ids` end it as EOS does, `ignore_eos` runs past EOS,
and `min_tokens` keeps both out of its first tokens, a per-position mask (`specdec.core.processing`) that
draft and target apply alike, so speculation stays exact."""

from __future__ import annotations

import grpc
import pytest
import torch
from conftest import assert_speculated, refusal, set_fields, tiny_models
from test_lossless_e2e import assert_follows, sampled_runs

from protos import specdec_pb2 as pb
from specdec.cli.client import generate, make_request
from specdec.core.params import SamplingParams
from specdec.core.processing import process_logits
from specdec.core.sampling import probs_from_logits
from specdec.core.text import TextStream
from specdec.engine.models import load_model
from specdec.engine.runner import Step
from specdec.weights.sources import build_byte_tokenizer

PROMPT = [40, 41, 42, 43, 7, 99, 3, 3, 120, 64]


def test_min_tokens_masks_the_ending_ids_at_the_outputs_first_positions_only():
    """Row i is output position len(output) + i; the mask comes after the penalties, which would otherwise
    give a masked id seen before a finite logit again."""
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    params = SamplingParams(repetition_penalty=1.3, logit_bias=((7, 5.0),), prompt_tokens=3, min_tokens=4,
                            ending_ids=(7, 9))
    out = process_logits(logits, params, history=[7, 1, 2, 5, 9], proposed=[7, 7, 7])  # 2 output tokens so far
    assert torch.isinf(out[:2, [7, 9]]).all() and (out[:2, [7, 9]] < 0).all()
    assert torch.isfinite(out[2:]).all(), "output positions 4 and 5 are past min_tokens"
    assert torch.equal(out[2:], process_logits(logits, SamplingParams(repetition_penalty=1.3, logit_bias=((7, 5.0),),
                                                                      prompt_tokens=3), [7, 1, 2, 5, 9], [7, 7, 7])[2:])
    plain = SamplingParams(min_tokens=2, ending_ids=(0,), prompt_tokens=1)
    assert process_logits(logits, plain, [5, 6, 8]) is logits, "nothing to do once min_tokens are out"


def test_stop_strings_count_from_min_tokens():
    text = TextStream(build_byte_tokenizer(), ["ab"], min_tokens=3)
    assert text.push([97]) + text.push([98]) == "ab", "'ab' ends at the second token: not a stop yet"
    assert text.push([97]) == "" and not text.stopped, "held back: it may begin a stop"
    assert text.push([98]) == "" and text.stopped and text.emitted_text == "ab"


def _run(stack, gamma, **fields) -> tuple[list[int], str]:
    request = set_fields(make_request(prompt_token_ids=PROMPT, max_new_tokens=24, gamma=gamma), **fields)
    result = generate(stack.endpoint, request, timeout=120)
    if gamma:
        assert_speculated(result, f"at γ={gamma} with {fields}")
    return result.token_ids, result.stats["finish_reason"]


def test_stop_token_ids_and_min_tokens_greedy_under_speculation_equal_target_only(stack):
    plain, _ = _run(stack, 0)
    stop = plain[5]
    first = plain.index(stop)
    for gamma in (0, 3, None):
        assert _run(stack, gamma, stop_token_ids=[stop]) == (plain[:first], "stop")
    late, finish = _run(stack, 0, stop_token_ids=[stop], min_tokens=first + 3)
    assert stop not in late[:first + 3] and late[:first] == plain[:first] and late[first] != stop
    for gamma in (3, None):
        assert _run(stack, gamma, stop_token_ids=[stop], min_tokens=first + 3) == (late, finish)


def test_sampled_first_tokens_follow_the_masked_targets_law(stack):
    """min_tokens over the target's likeliest first token, a stop id: under speculation (γ = 3, the draft
    masking alike) the first tokens follow the target's law with that token removed, and it never comes."""
    params = SamplingParams(temperature=0.8, top_k=8)
    runner = load_model(tiny_models("fp32")[1], "cpu").runner
    logits = runner.forward([Step(runner.new_cache(), PROMPT)])[0]  # [1, V]
    stop = int(logits[0].argmax())
    masked = SamplingParams(temperature=0.8, top_k=8, prompt_tokens=len(PROMPT), min_tokens=2, ending_ids=(stop,))
    p = probs_from_logits(process_logits(logits, masked, PROMPT), params)[0]
    assert p[stop] == 0 and probs_from_logits(logits, params)[0, stop] > 0.2

    def request_of(seed: int) -> pb.GenerateRequest:
        request = make_request(prompt_token_ids=PROMPT, max_new_tokens=2, temperature=0.8, top_k=8, seed=seed, gamma=3)
        request.min_tokens = 2
        request.stop_token_ids.append(stop)
        return request

    runs = sampled_runs(stack.endpoint, request_of, range(600))
    assert sum(accepted for _, accepted in runs) > 50, "the draft's proposals were hardly ever accepted"
    assert all(len(tokens) == 2 and stop not in tokens for tokens, _ in runs)
    assert_follows([(tokens[0], None) for tokens, _ in runs], p, support=8)


@pytest.mark.parametrize("fields,message", [
    (dict(min_tokens=30), "min_tokens (30) must be at most max_new_tokens (24)"),
    (dict(stop_token_ids=[10**6]), "stop_token_ids outside the vocabulary"),
    (dict(stop_token_ids=list(range(65))), "at most 64 stop_token_ids"),
])
def test_bad_ending_requests_are_refused(stack, fields, message):
    refused = refusal(stack.endpoint, set_fields(make_request(prompt_token_ids=PROMPT, max_new_tokens=24), **fields))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and message in refused.details()
    constrained = make_request(prompt_token_ids=PROMPT, max_new_tokens=8)
    constrained.ignore_eos = True
    constrained.constraint.regex = "[a-z]+"
    assert "cannot be combined with a constraint" in refusal(stack.endpoint, constrained).details()
