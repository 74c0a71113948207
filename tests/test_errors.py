"""Bad input gets a clear status through gRPC; the services keep serving; cancellation frees caches."""

from __future__ import annotations

import time

import grpc
import pytest
from conftest import tiny_options, wait_until

from orchestrator.clients import draft_client, target_client
from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.cli.client import generate, make_request
from specdec.launch.stack import EmbeddedStack

INVALID, OUT_OF_RANGE, NOT_FOUND = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE,
                                    grpc.StatusCode.NOT_FOUND)


@pytest.mark.parametrize("kwargs, code, words", [
    (dict(prompt=""), INVALID, "prompt is empty"),
    (dict(prompt_token_ids=[1] * 600), OUT_OF_RANGE, "context"),
    (dict(prompt_token_ids=[1, 99999]), INVALID, "vocabulary"),
    (dict(prompt="hi", max_new_tokens=0), INVALID, "max_new_tokens"),
    (dict(prompt="hi", max_new_tokens=10**6), INVALID, "max_new_tokens"),
    (dict(prompt="hi", temperature=-1.0), INVALID, "temperature"),
    (dict(prompt="hi", temperature=1.0, top_p=0.0), INVALID, "top_p"),
    (dict(prompt="hi", temperature=1.0, top_p=1.5), INVALID, "top_p"),
    (dict(prompt="hi", top_k=-3), INVALID, "top_k"),
    (dict(prompt="hi", gamma=-1), INVALID, "gamma"),
    (dict(prompt="hi", gamma=99), INVALID, "gamma"),
    (dict(prompt="hi", temperature=float("nan")), INVALID, "temperature"),
])
def test_generate_rejects_bad_input(stack, kwargs, code, words):
    kwargs.setdefault("max_new_tokens", 8)
    with pytest.raises(grpc.RpcError) as info:
        generate(stack.endpoint, make_request(**kwargs))
    assert info.value.code() == code
    assert words in info.value.details()
    assert len(generate(stack.endpoint, make_request(prompt="still serving", max_new_tokens=4)).token_ids) == 4


def stream_error(client, requests) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        for _ in client.stub.Session(iter(requests), timeout=30):
            pass
    return info.value


def draft_round(session_id, start, tokens, gamma=2, open_=False):
    return pb.DraftRequest(session_id=session_id, open=open_, sampling=pb.SamplingParams(top_p=1.0),
                           commit=pb.Commit(start=start, tokens=tokens), gamma=gamma)


def test_service_stream_errors(stack):
    draft, target = draft_client(stack.draft_address), target_client(stack.target_address)
    err = stream_error(draft, [draft_round("ghost", 0, [1, 2])])
    assert err.code() == NOT_FOUND and "ghost" in err.details()
    err = stream_error(draft, [draft_round("a", 0, [1, 2], open_=True), draft_round("a", 7, [3])])
    assert err.code() == OUT_OF_RANGE and "out-of-order" in err.details()
    err = stream_error(draft, [draft_round("b", 0, [1, 2], gamma=1000, open_=True)])  # 0 feeds, proposing nothing
    assert err.code() == INVALID and "gamma" in err.details()
    bad_sampling = pb.VerifyRequest(session_id="c", open=True, sampling=pb.SamplingParams(top_p=0.0),
                                    commit=pb.Commit(start=0, tokens=[1]))
    err = stream_error(target, [bad_sampling])
    assert err.code() == INVALID and "top_p" in err.details()
    bad_probs = pb.VerifyRequest(session_id="d", open=True, sampling=pb.SamplingParams(temperature=1.0, top_p=1.0),
                                 commit=pb.Commit(start=0, tokens=[1]), draft_tokens=[3],
                                 draft_probs=pb.DraftProbs(dense_f32=b"\0" * 12))
    err = stream_error(target, [bad_probs])
    assert err.code() == INVALID and "float32" in err.details()
    # The services keep serving, and the failed streams left no sessions behind.
    ok = list(target.stub.Session(iter([pb.VerifyRequest(session_id="e", open=True, sampling=pb.SamplingParams(top_p=1.0),
                                                         commit=pb.Commit(start=0, tokens=[1, 2, 3]))]), timeout=30))
    assert len(ok) == 1 and len(ok[0].tokens) == 1
    wait_for_no_sessions(draft, target)


def wait_for_no_sessions(*clients, timeout: float = 10.0) -> None:
    wait_until(lambda: not any(c.info().live_sessions for c in clients), timeout, "the sessions to be released")


def test_cancelled_stream_frees_caches_on_both_services(stack):
    draft, target = draft_client(stack.draft_address), target_client(stack.target_address)
    with grpc.insecure_channel(stack.endpoint) as channel:
        from protos import specdec_pb2_grpc as pb_grpc

        call = pb_grpc.SpecDecStub(channel).Generate(make_request(prompt="long", max_new_tokens=1000, gamma=3))
        next(call), next(call)
        # The draft may still hold an earlier reply's feed (`Drafting.finish`), which ends after its current call.
        assert draft.info().live_sessions >= 1 and target.info().live_sessions == 1
        call.cancel()
    wait_for_no_sessions(draft, target)
    assert len(generate(stack.endpoint, make_request(prompt="after cancel", max_new_tokens=4)).token_ids) == 4


def test_a_call_cancelled_mid_round_frees_its_slot_at_once():
    """The client cancels while a round is in flight (here the target is 3 s away; in life a long prompt going in):
    the orchestrator ends that call's service streams then, not when the round would have come back, so its slot
    (max_concurrent 1) takes the next call within a second, and the target frees the session."""
    options = tiny_options(delay_proxies=True, orchestrator=dict(target_chunk_ms=0.0, max_concurrent=1))
    with EmbeddedStack(options) as stack, grpc.insecure_channel(stack.endpoint) as channel:
        stack.set_rtt_ms(0, 3000)
        stub = pb_grpc.SpecDecStub(channel)
        held = stub.Generate(make_request(prompt="long", max_new_tokens=50, gamma=0))
        time.sleep(0.5)  # its first round is on its way to the target
        held.cancel()
        cancelled_at = time.monotonic()
        while True:  # refused at once while the slot is held; admitted, the next call's round outlasts 1 s
            tried_at = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                list(stub.Generate(make_request(prompt="next", max_new_tokens=1, gamma=0), timeout=1.0))
            if info.value.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                break
            time.sleep(0.02)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert tried_at - cancelled_at < 1.0, f"the slot was held {tried_at - cancelled_at:.1f} s past the cancel"
        stack.set_rtt_ms(0, 0)
        wait_for_no_sessions(target_client(stack.target_address))


def test_retried_round_is_idempotent(stack):
    """Replaying a round (same session and position) gives the same answer and leaves the cache consistent."""
    target = target_client(stack.target_address)

    def verify(start, tokens, drafts, open_=False, session_id="retry"):
        return pb.VerifyRequest(session_id=session_id, open=open_, sampling=pb.SamplingParams(temperature=1.0, top_p=1.0, seed=5),
                                commit=pb.Commit(start=start, tokens=tokens), draft_tokens=drafts)

    prompt = [7, 8, 9, 10]
    requests = [verify(0, prompt, [11, 12], open_=True), verify(0, prompt, [11, 12]), verify(0, prompt, [11, 12])]
    first, second, third = list(target.stub.Session(iter(requests), timeout=30))
    assert first.tokens == second.tokens == third.tokens
    # The same continuation reached without the retries matches.
    fresh = list(target.stub.Session(iter([verify(0, prompt, [11, 12], True, "fresh")]), timeout=30))
    assert fresh[0].tokens == first.tokens
