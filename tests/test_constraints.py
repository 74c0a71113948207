"""Structured output (`specdec.core.grammar`, `specdec.engine.constraint`): every verified position is
masked with the grammar's state after the tokens before it, so constrained speculative decoding equals
constrained target-only decoding, greedy token for token and sampled in law."""

from __future__ import annotations

import json
import re

import grpc
import pytest
import torch
from conftest import assert_speculated, tiny_models
from test_lossless_e2e import SAMPLES, assert_follows, sampled_runs

from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.cli.client import generate, make_request
from specdec.core.grammar import compile_constraint
from specdec.core.params import SamplingParams
from specdec.core.sampling import probs_from_logits
from specdec.engine.constraint import Grammars
from specdec.engine.models import load_model
from specdec.engine.runner import Step
from specdec.runtime.server import CHANNEL_OPTIONS
from specdec.runtime.wire import constraint_to_pb

CODE = r"[a-f]{2,4}-[0-9]{3}"
OPTIONS = ["dead-beef", "cafe-123", "ab-9"]
SCHEMA = {"type": "object", "properties": {"pick": {"enum": ["red", "green", "blue"]}, "n": {"type": "boolean"}},
          "required": ["pick", "n"], "additionalProperties": False}


def constrained(**kw) -> pb.GenerateRequest:
    constraint = kw.pop("constraint", ("regex", CODE))
    request = make_request(**kw)
    request.constraint.CopyFrom(constraint_to_pb(*constraint))
    return request


@pytest.mark.parametrize("vocab", [260, 288], ids=["260", "multiple-of-32"])
def test_masks_follow_the_grammar_row_by_row_and_rest_on_the_committed_tokens(vocab):
    """Also for a vocabulary whose size is a multiple of 32, as real models' are (Qwen2.5's 151,936): there
    llguidance's bitmask has a word more than the vocabulary needs."""
    state = Grammars("tiny:seed=0", vocab).state(compile_constraint("regex", "ab[0-9]"))
    a, b, one = ord("a"), ord("b"), ord("1")
    masks = state.masks([], [a, b, one], 4)  # [4, V]
    assert masks.shape == (4, vocab)
    assert masks[0].nonzero().flatten().tolist() == [a]
    assert masks[1].nonzero().flatten().tolist() == [b]
    assert masks[2].nonzero().flatten().tolist() == list(range(ord("0"), ord("9") + 1))
    assert masks[3].nonzero().flatten().tolist() == [256], "complete: only the EOS"
    assert state.consumed == [], "the drafts are rolled back"
    refused = state.masks([a], [ord("x"), b], 3)  # a refused draft: the rows after it are unused
    assert refused[0].nonzero().flatten().tolist() == [b] and refused[1:].all()
    assert state.masks([a, b], [], 1)[0][one] and state.consumed == [a, b]


def test_an_added_token_that_is_not_special_is_text_to_the_grammar():
    """As Qwen2.5's <tool_call>: an added token the tokenizer does not call special is the text it stands for. A
    grammar that forces that text allows the token and takes it once sampled (llguidance's own reading marked it
    special: allowed by the mask, refused by the matcher, an INTERNAL error on every forced tool call)."""
    import llguidance

    from specdec.engine.constraint import guidance_tokenizer
    from specdec.weights.sources import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    tokenizer.add_tokens(["<tool_call>"])  # not special
    call = tokenizer.convert_tokens_to_ids("<tool_call>")
    ids = tokenizer.encode("<tool_call>ok")
    assert ids[0] == call and len(ids) == 3
    matcher = llguidance.LLMatcher(guidance_tokenizer(tokenizer, 288), compile_constraint("lark", 'start: "<tool_call>ok"'))
    words = torch.frombuffer(bytearray(matcher.compute_bitmask()), dtype=torch.int32)
    assert (int(words[call // 32]) >> (call % 32)) & 1, "the mask allows the token"
    assert matcher.consume_tokens(ids) and matcher.is_accepting(), matcher.get_error()
    eos = tokenizer.eos_token_id
    assert guidance_tokenizer(tokenizer, 288).is_special_token(eos) and not guidance_tokenizer(tokenizer, 288).is_special_token(call)


def test_a_choice_allows_exactly_its_strings_whole():
    """vLLM's guided_choice: after any prefix only the options' next bytes are allowed, and EOS only once an
    option is whole; quotes, backslashes, line breaks and non-ASCII text are matched as written, not read as
    grammar (the tiny vocabulary's ids 0-255 are the bytes)."""
    options = ['say "hi"', "a\\b\n", "ü", "say"]
    state = Grammars("tiny:seed=0", 260).state(compile_constraint("choice", options))

    def allowed(text: bytes) -> set[int]:
        return set(state.masks([], list(text), len(text) + 1)[-1].nonzero().flatten().tolist())

    assert allowed(b"") == {ord("s"), ord("a"), 0xC3}
    assert allowed(b"say") == {ord(" "), 256}, "an option that is a prefix of another may end there"
    assert allowed(b'say "hi') == {ord('"')} and allowed(b'say "hi"') == {256}
    assert allowed(b"a") == {ord("\\")} and allowed(b"a\\b") == {ord("\n")} and allowed(b"a\\b\n") == {256}
    assert allowed("ü".encode()) == {256}
    assert compile_constraint("choice", ["x", "x"]) == compile_constraint("choice", ["x"])


def test_rolling_back_gives_the_masks_a_fresh_matcher_gives():
    """200 rounds of random drafts (EOS among them) and commits on one matcher: every row that can be
    used equals the mask of a new matcher fed the same tokens. (A draft EOS is never consumed: a stopped
    matcher does not roll back.)"""
    import random

    grammar = compile_constraint("regex", r"[0-9]{2}:[0-9]{2}")
    grammars = Grammars("tiny:seed=0", 260)
    state, rng, committed = grammars.state(grammar), random.Random(0), []

    def fresh(tokens: list[int]) -> torch.Tensor:
        other = grammars.state(grammar)
        other.sync(tokens)
        return other.masks(tokens, [], 1)[0]

    for _ in range(200):
        drafts = [rng.choice([*range(48, 59), 256, 65]) for _ in range(2)]
        masks = state.masks(committed, drafts, 3)
        for i in range(3):
            before = committed + drafts[:i]
            if any(t == 256 or not fresh(before[:j])[t] for j, t in enumerate(before) if j >= len(committed)):
                break  # the row after a refused draft or an EOS is never used
            assert torch.equal(masks[i], fresh(before)), (committed, drafts, i)
        token = rng.choice(masks[0].nonzero().flatten().tolist())
        committed, state = ([], grammars.state(grammar)) if token == 256 else (committed + [token], state)


@pytest.mark.parametrize("kind,value,message", [("json_schema", "{oops", "invalid json schema"),
                                                ("regex", "[0-", "invalid regex"),
                                                ("lark", "start: x(", "invalid lark"),
                                                ("choice", [], "invalid choice: give at least one option")])
def test_a_bad_constraint_is_refused_before_any_round(stack, kind, value, message):
    with grpc.insecure_channel(stack.endpoint, options=CHANNEL_OPTIONS) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            list(pb_grpc.SpecDecStub(channel).Generate(constrained(prompt="x", max_new_tokens=4,
                                                                   constraint=(kind, value)), timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in caught.value.details()


@pytest.mark.parametrize("proposer", ["model", "ngram"])
def test_greedy_constrained_speculation_equals_constrained_target_only(stack, proposer):
    colours = ("red", "green", "blue")
    for constraint, check in ((("regex", CODE), lambda t: re.fullmatch(CODE, t)),
                              (("json_schema", json.dumps(SCHEMA)), lambda t: json.loads(t)["pick"] in colours),
                              (("choice", OPTIONS), lambda t: t in OPTIONS)):
        base = generate(stack.endpoint, constrained(prompt="id: ", max_new_tokens=40, gamma=0, constraint=constraint))
        assert base.stats["finish_reason"] == "stop" and check(base.text), base.text
        for gamma in (1, 3, None):
            result = generate(stack.endpoint, constrained(prompt="id: ", max_new_tokens=40, gamma=gamma,
                                                          constraint=constraint, proposer=proposer))
            assert result.token_ids == base.token_ids, f"γ={gamma} ({proposer}) diverged under {constraint[0]}"
            if gamma is not None and proposer == "model":
                assert_speculated(result, f"at γ={gamma} under {constraint[0]}")


@pytest.mark.parametrize("proposer", [pb.PROPOSER_MODEL, pb.PROPOSER_NGRAM], ids=["model", "ngram"])
def test_sampled_constrained_tokens_follow_the_masked_target(stack, proposer):
    """T = 0.8: the first token is the target's p masked to [a-f], renormalised; the third (after two
    letters) may be a letter or '-': masked with the state after the two tokens before it. The prompt
    repeats [40..43] with "ca" after it, so the lookup proposes "ca"."""
    prompt = [40, 41, 42, 43, ord("c"), ord("a"), 40, 41, 42, 43]
    target = load_model(tiny_models("fp32")[1], "cpu").runner
    params = SamplingParams(temperature=0.8)
    letters = torch.zeros(260, dtype=torch.bool)
    letters[ord("a"):ord("f") + 1] = True

    def p_masked(tokens: list[int], allowed: torch.Tensor) -> torch.Tensor:
        logits = target.forward([Step(target.new_cache(), tokens)])[0].masked_fill(~allowed, float("-inf"))
        return probs_from_logits(logits, params)[0]

    def request_of(seed: int) -> pb.GenerateRequest:
        request = constrained(prompt_token_ids=prompt, max_new_tokens=3, seed=seed, gamma=2, temperature=0.8)
        request.proposer = proposer
        return request

    drawn = sampled_runs(stack.endpoint, request_of, range(SAMPLES))
    assert 0 < sum(a for _, a in drawn) < 2 * SAMPLES, "want acceptances and rejections"
    assert_follows([(t[0], None) for t, _ in drawn], p_masked(prompt, letters), support=6)
    pair = max({tuple(t[:2]) for t, _ in drawn}, key=lambda p: sum(tuple(t[:2]) == p for t, _ in drawn))
    thirds = [(t[2], None) for t, _ in drawn if tuple(t[:2]) == pair]
    assert len(thirds) > 40
    allowed = letters.clone()
    allowed[ord("-")] = True
    assert_follows(thirds, p_masked(prompt + list(pair), allowed), support=7)


def test_logprobs_are_those_of_the_masked_distribution(stack):
    """Greedy under a grammar: each token's logprob is the log-softmax of the masked logits, so the listed
    alternatives are tokens the grammar allows there and, when all are listed, their probabilities sum to 1."""
    result = generate(stack.endpoint, constrained(prompt="id: ", max_new_tokens=20, gamma=3, top_logprobs=20))
    assert re.fullmatch(CODE, result.text) and len(result.logprobs) == len(result.token_ids)
    grammars = Grammars("tiny:seed=0", 260)
    for k, lp in enumerate(result.logprobs):
        state = grammars.state(compile_constraint("regex", CODE))
        allowed = set(state.masks(result.token_ids[:k], [], 1)[0].nonzero().flatten().tolist())
        assert set(lp.top_ids) <= allowed and lp.logprob == lp.top_logprobs[0]
        if len(allowed) <= 20:
            assert float(torch.tensor(list(lp.top_logprobs)).exp().sum()) == pytest.approx(1.0, abs=1e-4)
