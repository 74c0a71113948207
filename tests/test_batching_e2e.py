"""Many sessions at once through real processes and gRPC: they share forward passes, and each one's
output is what it is alone; a cancelled or failing session touches no other."""

from __future__ import annotations

import threading

import grpc
import pytest
from test_errors import wait_for_no_sessions

from orchestrator.clients import target_client
from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.cli.client import generate, make_request
from specdec.runtime.server import CHANNEL_OPTIONS

LONG_PROMPT = [(7 * i) % 250 + 3 for i in range(300)]  # 300 tokens: a chunked prefill beside other sessions' decoding

# Different γ (fixed and adaptive), lengths, prompts and sampling parameters. Sampled sessions use a
# fixed γ and the draft model: with a seed, their output is then a function of the request alone
# (lookups depend on what earlier requests left in the server's memory).
REQUESTS = {
    "greedy target-only": make_request(prompt_token_ids=[40, 41, 42], max_new_tokens=40, gamma=0),
    "greedy γ=3": make_request(prompt_token_ids=[7, 8, 9, 10], max_new_tokens=64, gamma=3),
    "greedy adaptive": make_request(prompt_token_ids=[100, 5], max_new_tokens=50),
    "greedy long prompt": make_request(prompt_token_ids=LONG_PROMPT, max_new_tokens=24, gamma=2),
    "sampled top-k γ=2": make_request(prompt_token_ids=[40, 41, 42], max_new_tokens=48, temperature=1.0,
                                      top_k=8, seed=7, gamma=2, proposer="model"),
    "sampled top-p γ=4": make_request(prompt_token_ids=[11, 12], max_new_tokens=30, temperature=0.7,
                                      top_p=0.9, seed=3, gamma=4, proposer="model"),
}


def run_together(endpoint: str, requests: dict[str, pb.GenerateRequest]) -> dict:
    """Start every generation at once (a barrier), each on its own thread; results by name."""
    results, barrier = {}, threading.Barrier(len(requests))

    def run(name: str, request: pb.GenerateRequest) -> None:
        barrier.wait()
        results[name] = generate(endpoint, request, timeout=120)

    threads = [threading.Thread(target=run, args=item) for item in requests.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def sharing(target) -> tuple[int, int]:
    info = target.info()
    return info.forward_passes, info.forward_steps


def test_mixed_sessions_share_passes_and_each_equals_its_solo_run(stack):
    target = target_client(stack.target_address)
    solo = {name: generate(stack.endpoint, request, timeout=120) for name, request in REQUESTS.items()}
    passes, steps = sharing(target)
    together = run_together(stack.endpoint, REQUESTS)
    passes, steps = sharing(target)[0] - passes, sharing(target)[1] - steps
    assert steps > passes, f"no pass was shared: {steps} steps in {passes} passes"
    for name in REQUESTS:
        assert together[name].token_ids == solo[name].token_ids, f"{name}: batched output differs from solo"
    rolled_back = sum(r.drafted > r.accepted for result in together.values() for r in result.rounds)
    assert rolled_back > 0, "no session rolled back a rejected draft: the mix is too easy"
    # Each round's target time splits into its forward passes, the wait for them, and the service's own work.
    rounds = [r for result in together.values() for r in result.rounds if r.target_compute_s > 0]
    assert all(r.target_forward_s > 0 and r.target_wait_s >= 0 for r in rounds)
    assert all(r.target_forward_s + r.target_wait_s <= r.target_compute_s for r in rounds)
    assert any(r.target_wait_s > 0 for r in rounds), "no round waited for a shared pass"


def test_a_cancelled_session_leaves_its_batch_intact(stack):
    target = target_client(stack.target_address)
    requests = {f"s{i}": make_request(prompt_token_ids=[20 + i, 30, 31], max_new_tokens=200, gamma=i % 3)
                for i in range(3)}
    solo = {name: generate(stack.endpoint, request, timeout=120).token_ids for name, request in requests.items()}
    with grpc.insecure_channel(stack.endpoint, options=CHANNEL_OPTIONS) as channel:
        doomed = pb_grpc.SpecDecStub(channel).Generate(make_request(prompt_token_ids=[9, 9, 9], max_new_tokens=1000,
                                                                    gamma=2))
        next(doomed)  # its sessions are open on both services
        cancel = threading.Timer(0.05, doomed.cancel)
        cancel.start()
        together = run_together(stack.endpoint, requests)
        cancel.join()
    with pytest.raises(grpc.RpcError) as info:
        list(doomed)
    assert info.value.code() == grpc.StatusCode.CANCELLED
    for name in requests:
        assert together[name].token_ids == solo[name], f"{name} changed when a session beside it was cancelled"
    wait_for_no_sessions(target)


def test_an_error_in_one_session_reaches_only_that_session(stack):
    """A client that speaks to the target directly sends a malformed verify mid-load: its stream gets
    INVALID_ARGUMENT, and the generations running beside it finish unchanged."""
    requests = {f"s{i}": make_request(prompt_token_ids=[50 + i, 51], max_new_tokens=60, gamma=2) for i in range(3)}
    solo = {name: generate(stack.endpoint, request, timeout=120).token_ids for name, request in requests.items()}
    errors = []

    def bad_client() -> None:
        with grpc.insecure_channel(stack.target_address, options=CHANNEL_OPTIONS) as channel:
            opening = pb.VerifyRequest(session_id="bad-one", open=True, sampling=pb.SamplingParams(top_p=1.0),
                                       commit=pb.Commit(start=0, tokens=[1, 2, 3]))
            bad = pb.VerifyRequest(session_id="bad-one", commit=pb.Commit(start=3),
                                   draft_tokens=[1, 10**6])  # a token id far outside the vocabulary
            try:
                list(pb_grpc.TargetServiceStub(channel).Session(iter([opening, bad]), timeout=60))
            except grpc.RpcError as error:
                errors.append(error)

    bad = threading.Timer(0.05, bad_client)
    bad.start()
    together = run_together(stack.endpoint, requests)
    bad.join()
    for name in requests:
        assert together[name].token_ids == solo[name]
    wait_for_no_sessions(target_client(stack.target_address))
    assert len(errors) == 1 and errors[0].code() == grpc.StatusCode.INVALID_ARGUMENT, errors
    assert "vocabulary" in errors[0].details()
