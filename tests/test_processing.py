"""Penalties and logit bias (`specdec.core.processing`): the definition against a plain transcription,
and exactness under speculation through the services: greedy identity with target-only for every γ and
proposer, and sampled tokens that follow the processed target distribution at each position."""

from __future__ import annotations

from collections import Counter

import grpc
import pytest
import torch
from conftest import assert_speculated, tiny_models
from test_lossless_e2e import SAMPLES, assert_follows, sampled_runs

from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.cli.client import generate, make_request
from specdec.core.errors import InvalidArgument
from specdec.core.params import SamplingParams
from specdec.core.processing import process_logits
from specdec.core.sampling import probs_from_logits
from specdec.engine.models import load_model
from specdec.engine.runner import Step
from specdec.runtime.server import CHANNEL_OPTIONS

PROCESSING = dict(presence_penalty=1.5, frequency_penalty=1.0, repetition_penalty=1.3,
                  logit_bias={65: 1.5, 32: -100.0})
# After LOOP the tiny target's likeliest token is 22, and then 22 again (p = 0.63 at T = 0.8, top-k 8):
# the penalties must act at the second position, on a count a draft accepted in the same round makes.
# LOOP is in the prompt twice, 22 after the first, so that the lookup proposes 22.
LOOP = [40, 41, 42, 198, 22, 40, 41, 42, 198]


def reference(row: list[float], params: SamplingParams, before: list[int]) -> list[float]:
    """The definition, one logit at a time: repetition over everything before, then frequency and
    presence over the output before, then the bias."""
    seen, counts, bias = set(before), Counter(before[params.prompt_tokens:]), dict(params.logit_bias)
    out = []
    for token, x in enumerate(row):
        if params.repetition_penalty != 1.0 and token in seen:
            x = x / params.repetition_penalty if x > 0 else x * params.repetition_penalty
        x -= params.frequency_penalty * counts[token] + params.presence_penalty * (counts[token] > 0)
        out.append(x + bias.get(token, 0.0))
    return out


def test_each_row_is_processed_with_the_tokens_before_it():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(5, 40, generator=gen) * 3
    history, drafts = [3, 3, 7, 1, 9, 9, 9, 4], [9, 4, 30, 30]
    params = SamplingParams(presence_penalty=0.7, frequency_penalty=-0.4, repetition_penalty=1.8,
                            logit_bias=((4, 2.5), (30, -1.0)), prompt_tokens=3)
    out = process_logits(logits, params, history, drafts)
    for i in range(5):
        want = reference(logits[i].tolist(), params, history + drafts[:i])
        assert out[i].tolist() == pytest.approx(want, abs=1e-5), f"row {i}"
    assert process_logits(logits, SamplingParams(), history, drafts) is logits, "nothing to do: untouched"


@pytest.mark.parametrize("fields,message", [(dict(presence_penalty=2.5), "presence_penalty"),
                                            (dict(repetition_penalty=0.0), "repetition_penalty"),
                                            (dict(logit_bias=((3, 101.0),)), "logit_bias")])
def test_out_of_range_processing_is_refused(fields, message):
    with pytest.raises(InvalidArgument, match=message):
        SamplingParams(**fields).validate()


def processed_request(**kw) -> pb.GenerateRequest:
    request = make_request(**kw)
    request.presence_penalty = PROCESSING["presence_penalty"]
    request.frequency_penalty = PROCESSING["frequency_penalty"]
    request.repetition_penalty = PROCESSING["repetition_penalty"]
    request.logit_bias.update(PROCESSING["logit_bias"])
    return request


@pytest.mark.parametrize("proposer", ["model", "ngram"])
def test_greedy_with_penalties_and_bias_equals_target_only(stack, proposer):
    prompt = dict(prompt_token_ids=LOOP)
    plain = generate(stack.endpoint, make_request(**prompt, max_new_tokens=40, gamma=0)).token_ids
    baseline = generate(stack.endpoint, processed_request(**prompt, max_new_tokens=40, gamma=0)).token_ids
    assert plain[:2] == [22, 22] and baseline[0] == 22 and baseline[1] != 22, "the penalties break the loop"
    assert 32 not in baseline, "a bias of -100 keeps a token out"
    for gamma in (1, 3, None):
        result = generate(stack.endpoint, processed_request(**prompt, max_new_tokens=40, gamma=gamma,
                                                            proposer=proposer, top_logprobs=1))
        assert result.token_ids == baseline, f"γ={gamma} ({proposer}) diverged from target-only"
        if gamma is not None and proposer == "model":
            assert_speculated(result, f"at γ={gamma}")
        assert all(lp.logprob == lp.top_logprobs[0] for lp in result.logprobs), "greedy: the likeliest processed"


def test_bias_outside_the_vocabulary_is_refused(stack):
    request = make_request(prompt="x", max_new_tokens=4)
    request.logit_bias[10**6] = 1.0
    with grpc.insecure_channel(stack.endpoint, options=CHANNEL_OPTIONS) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            list(pb_grpc.SpecDecStub(channel).Generate(request, timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "vocabulary" in caught.value.details()


def _two_tokens(endpoint: str, prompt: list[int], proposer: int, **sampling) -> list[tuple[int, int, int]]:
    """(first token, second token, drafts accepted) of a γ = 2 generation per seed."""
    def request_of(seed: int) -> pb.GenerateRequest:
        request = processed_request(prompt_token_ids=prompt, max_new_tokens=2, seed=seed, gamma=2, **sampling)
        request.proposer = proposer
        return request

    return [(tokens[0], tokens[1], accepted) for tokens, accepted in sampled_runs(endpoint, request_of, range(SAMPLES))]


@pytest.mark.parametrize("proposer", [pb.PROPOSER_MODEL, pb.PROPOSER_NGRAM], ids=["model", "ngram"])
def test_sampled_tokens_follow_the_processed_target_at_each_position(stack, proposer):
    """At T = 0.8, top-k 8: the first token's law is p processed with the prompt (repetition, bias);
    the second's, given the likeliest first token v, is p processed with v counted once more
    (frequency, presence, repetition). After the prompt the unprocessed target would loop on 22."""
    prompt = LOOP
    params = SamplingParams(temperature=0.8, top_k=8, presence_penalty=PROCESSING["presence_penalty"],
                            frequency_penalty=PROCESSING["frequency_penalty"],
                            repetition_penalty=PROCESSING["repetition_penalty"],
                            logit_bias=tuple(PROCESSING["logit_bias"].items()), prompt_tokens=len(prompt))
    target = load_model(tiny_models("fp32")[1], "cpu").runner

    def p_after(tokens: list[int]) -> torch.Tensor:  # [V]
        logits = target.forward([Step(target.new_cache(), tokens)])[0]
        return probs_from_logits(process_logits(logits, params, tokens), params)[0]

    drawn = _two_tokens(stack.endpoint, prompt, proposer, temperature=0.8, top_k=8)
    accepted = sum(a for _, _, a in drawn)
    assert 0 < accepted < 2 * SAMPLES, "want both acceptances and rejections"
    assert_follows([(t, None) for t, _, _ in drawn], p_after(prompt))
    first = Counter(t for t, _, _ in drawn).most_common(1)[0][0]
    seconds = [(t2, None) for t1, t2, _ in drawn if t1 == first]
    assert first == 22 and len(seconds) > SAMPLES / 4
    assert_follows(seconds, p_after([*prompt, first]))
    unprocessed = probs_from_logits(target.forward([Step(target.new_cache(), [*prompt, first])])[0],
                                    SamplingParams(temperature=0.8, top_k=8))[0]
    assert unprocessed[first] > 0.15 > p_after([*prompt, first])[first], "the premise: penalties move the repeat"
