"""Hostile and malformed input: every request gets a specific status, never INTERNAL or UNKNOWN,
and the servers stay healthy. A seeded fuzzer (1,200 requests here; `-m slow` runs 20,000)."""

from __future__ import annotations

import math
import random

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from test_errors import stream_error, wait_for_no_sessions

from orchestrator.clients import draft_client, target_client
from orchestrator.records import resume_request
from protos import specdec_pb2 as pb
from specdec.cli.client import generate, make_request
from specdec.core.errors import NotFound
from specdec.core.rounds import MAX_EXTRA_STEPS
from specdec.core.text import TextStream, printable

SPECIFIC = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE,
            grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED}
GENERATE = "/specdec.v1.SpecDec/Generate"
VERIFY_STREAM = "/specdec.v1.TargetService/Session"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


FLOATS = [-1.0, 1e-38, 1e-5, 50.0, math.inf, -math.inf, math.nan]
MUTATIONS = [
    lambda r, rng: setattr(r, "max_new_tokens", rng.choice([0, 10**6, 2**32 - 5])),
    lambda r, rng: setattr(r, "prompt", rng.choice(["", "x" * (1 << 20 | 1)])),
    lambda r, rng: (r.ClearField("prompt"), r.prompt_token_ids.extend([rng.choice([260, 10**6, -1])])),
    lambda r, rng: r.prompt_token_ids.extend([7] * 600),
    lambda r, rng: setattr(r, "temperature", rng.choice(FLOATS)),
    lambda r, rng: setattr(r, "top_k", rng.choice([-3, -(2**31)])),
    lambda r, rng: setattr(r, "top_p", rng.choice(FLOATS + [0.0, 1.5])),
    lambda r, rng: setattr(r, "gamma", rng.choice([7, 99, -1])),
    lambda r, rng: r.stop.extend(rng.choice([["s"] * 17, ["x" * 300]])),
    lambda r, rng: setattr(r, "session_id", rng.choice(["bad id", "x" * 300, "é", "a/b"])),
    lambda r, rng: (setattr(r, "resume", True), setattr(r, "session_id", "ok-1")),
    lambda r, rng: setattr(r, "seed", 2**64 - 1),
    lambda r, rng: setattr(r, "min_tokens", rng.choice([1, 3, 2**32 - 1])),
    lambda r, rng: setattr(r, "ignore_eos", True),
    lambda r, rng: r.stop_token_ids.extend(rng.choice([[-1], [10**6], [5], list(range(70))])),
    lambda r, rng: (setattr(r, "prompt_logprobs", True), setattr(r, "top_logprobs", rng.choice([0, 3, 21]))),
]


def random_request(rng: random.Random) -> bytes:
    """Raw GenerateRequest bytes: garbage, broken UTF-8, or fields at and past every bound."""
    kind = rng.randrange(4)
    if kind == 0:  # garbage
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    if kind == 1:  # a prompt that is not UTF-8
        return _field(1, b"ok \xff\xfe" + bytes(rng.randrange(128, 256) for _ in range(rng.randrange(1, 8))))
    request = pb.GenerateRequest(max_new_tokens=rng.choice([1, 2, 3]), temperature=rng.choice([0.0, 0.7]),
                                 top_k=rng.choice([0, 5]), seed=rng.randrange(2**63))
    if rng.random() < 0.5:
        request.prompt = rng.choice(["hi", "def f():", "\u0000\u202e", "x" * rng.randrange(1, 3000)])
    else:
        request.prompt_token_ids.extend(rng.randrange(260) for _ in range(rng.randrange(1, 6)))
    for mutate in rng.sample(MUTATIONS, k=rng.choice([0, 0, 1, 1, 2])):  # a valid request, pushed past its bounds
        mutate(request, rng)
    return request.SerializeToString()


def fuzz(stack, count: int, seed: int) -> dict:
    rng = random.Random(seed)
    seen: dict = {}
    with grpc.insecure_channel(stack.endpoint) as channel:
        call = channel.unary_stream(GENERATE)  # raw bytes both ways
        for i in range(count):
            data = random_request(rng)
            try:
                for _ in call(data, timeout=60):
                    pass
                code = grpc.StatusCode.OK
            except grpc.RpcError as error:
                code = error.code()
                assert code in SPECIFIC, (i, data[:80], code, error.details())
            seen[code] = seen.get(code, 0) + 1
    return seen


def assert_healthy(stack) -> None:
    for address in (stack.endpoint, stack.draft_address, stack.target_address):
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, address
    assert len(generate(stack.endpoint, make_request(prompt="still fine", max_new_tokens=4, gamma=3)).token_ids) == 4


def test_fuzzed_requests_get_specific_statuses(stack):
    seen = fuzz(stack, 1200, seed=0)
    assert seen.get(grpc.StatusCode.INVALID_ARGUMENT, 0) > 300 and seen.get(grpc.StatusCode.OK, 0) > 100, seen
    assert_healthy(stack)
    wait_for_no_sessions(draft_client(stack.draft_address), target_client(stack.target_address))


@pytest.mark.slow
def test_fuzzed_requests_long(stack):
    fuzz(stack, 20000, seed=1)
    assert_healthy(stack)


def test_service_streams_reject_garbage_messages(stack):
    with grpc.insecure_channel(stack.target_address) as channel:
        call = channel.stream_stream(VERIFY_STREAM)
        with pytest.raises(grpc.RpcError) as info:
            list(call(iter([b"\xff\xff\xff garbage"]), timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in info.value.details()


def _verify_with_probs(session_id: str, probs: torch.Tensor, drafts: list[int]) -> pb.VerifyRequest:
    return pb.VerifyRequest(session_id=session_id, open=True, sampling=pb.SamplingParams(temperature=1.0, top_p=1.0),
                            commit=pb.Commit(start=0, tokens=[1, 2, 3]), draft_tokens=drafts,
                            draft_probs=pb.DraftProbs(dense_f32=probs.numpy().astype("<f4").tobytes()))


@pytest.mark.parametrize("corrupt, drafts, words", [
    (lambda q: q.index_fill_(1, torch.tensor([7]), math.nan), [4, 4], "finite"),
    (lambda q: q.index_fill_(1, torch.tensor([7]), -0.5), [4, 4], "non-negative"),
    (lambda q: q.mul_(3.0), [4, 4], "sum to 1"),
    (lambda q: q, [4, 5], "probability 0"),  # token 5 has q = 0: the draft could not have drawn it
])
def test_target_trusts_no_draft(stack, corrupt, drafts, words):
    target = target_client(stack.target_address)
    vocab = target.info().vocab_size
    q = torch.full((2, vocab), 1.0 / vocab)
    q[:, 4] += q[:, 5]  # token 4 carries extra mass; token 5 none, still normalised
    q[:, 5] = 0.0
    ok = list(target.stub.Session(iter([_verify_with_probs("fine", q.clone(), [4, 4])]), timeout=30))
    assert len(ok[0].tokens) >= 1
    error = stream_error(target, [_verify_with_probs("rogue", corrupt(q.clone()), drafts)])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and words in error.details()
    wait_for_no_sessions(target)


def test_target_bounds_the_steps_a_call_may_add(stack):
    target = target_client(stack.target_address)
    request = pb.VerifyRequest(session_id="greedy", open=True, sampling=pb.SamplingParams(top_p=1.0),
                               commit=pb.Commit(start=0, tokens=[1, 2, 3]), extra_steps=MAX_EXTRA_STEPS + 1)
    error = stream_error(target, [request])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "extra_steps" in error.details()
    wait_for_no_sessions(target)


@pytest.mark.parametrize("kwargs, code, words", [
    (dict(prompt="p" * (2 << 20)), grpc.StatusCode.INVALID_ARGUMENT, "bytes"),
    (dict(prompt="p" * (5 << 20)), grpc.StatusCode.RESOURCE_EXHAUSTED, ""),  # past the message limit
    (dict(prompt="hi", stop=["s"] * 17), grpc.StatusCode.INVALID_ARGUMENT, "stop strings"),
    (dict(prompt="hi", stop=["s" * 257]), grpc.StatusCode.INVALID_ARGUMENT, "stop string"),
    (dict(prompt="hi", temperature=1e-38), grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
])
def test_input_is_bounded_before_work(stack, kwargs, code, words):
    with pytest.raises(grpc.RpcError) as info:
        generate(stack.endpoint, make_request(max_new_tokens=4, **kwargs), timeout=20)
    assert info.value.code() == code and words in info.value.details()


@pytest.mark.parametrize("session_id", ["x" * 129, "has space", "new\nline", "é"])
def test_session_ids_are_validated(stack, session_id):
    request = make_request(prompt="hi", max_new_tokens=2)
    request.session_id = session_id
    with pytest.raises(grpc.RpcError) as info:
        generate(stack.endpoint, request, timeout=20)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "session_id" in info.value.details()


def test_resume_without_redis_is_a_failed_precondition(stack):
    request = make_request(prompt="hi", max_new_tokens=2)
    request.session_id, request.resume = "abc", True
    with pytest.raises(grpc.RpcError) as info:
        generate(stack.endpoint, request, timeout=20)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "redis" in info.value.details()


def test_target_info_reports_counts_not_session_ids(stack):
    call = None
    with grpc.insecure_channel(stack.endpoint) as channel:
        from protos import specdec_pb2_grpc as pb_grpc

        request = make_request(prompt="secret", max_new_tokens=500, gamma=2)
        request.session_id = "private-session-42"
        call = pb_grpc.SpecDecStub(channel).Generate(request)
        next(call)
        info = target_client(stack.target_address).info()
        call.cancel()
    assert "private-session-42" not in str(info) and info.ranks[0].live_sessions == 1


def test_resume_belongs_to_the_credential_that_started_it():
    record = {"owner": "alice", "finish_reason": "", "generated": [1, 2], "prompt_ids": [5], "max_new_tokens": 8,
              "params": {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0}, "gamma": None, "stop": []}
    assert resume_request(record, "s", 0, "alice").resumed == (1, 2)
    with pytest.raises(NotFound):
        resume_request(record, "s", 0, "mallory")


class _CharTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def test_stop_strings_match_across_pushes_and_only_once():
    stream = TextStream(_CharTokenizer(), ["END", "xyz"])
    out = "".join(stream.push([ord(c)]) for c in "abc EN")
    assert out == "abc " and not stream.stopped  # "EN" is held back: it may begin "END"
    assert stream.push([ord("D"), ord("!")]) == "" and stream.stopped and stream.emitted_text == "abc "


def test_log_strings_are_escaped_and_cut():
    assert printable("a\nb\x1b[31m") == "a\\nb\\x1b[31m"
    assert printable("x" * 1000).endswith("…(1000 chars)") and len(printable("x" * 1000)) < 90


def test_raw_encoding_matches_protobuf():  # the fuzzer's hand-built fields are what protobuf writes
    assert _field(1, b"hi") == pb.GenerateRequest(prompt="hi").SerializeToString()


def test_a_clients_bad_input_never_cools_down_a_draft(stack):
    """A replica that refused a request stays in service; one that failed goes into cool-down."""
    from orchestrator.clients import StreamError
    from orchestrator.draft_pool import DraftPool
    from orchestrator.generation import Generation
    from orchestrator.request import GenerationRequest
    from specdec.core.params import SamplingParams
    from specdec.planning.controller import GammaController
    from specdec.planning.cost import CostProfile

    request = GenerationRequest([5, 6], 8, SamplingParams(), gamma=2)
    for code, usable_after in ((grpc.StatusCode.INVALID_ARGUMENT, True), (grpc.StatusCode.DEADLINE_EXCEEDED, False)):
        pool = DraftPool([stack.draft_address], cooldown_s=60)
        generation = Generation(request, pool, None, None, frozenset(), 64, GammaController(4, CostProfile((0.1, 0.1))))
        generation.drafting.use(*pool.acquire())
        generation.drafting.failed(StreamError(code, "refused"))
        assert (pool.acquire()[0] is not None) == usable_after, code
