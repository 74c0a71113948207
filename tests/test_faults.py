"""Faults and load on real processes: hung and killed services mid-stream, health under 40 open
streams, capacity refused at once, and `specdec serve` stopping every child on SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from concurrent import futures

import grpc
import pytest
from conftest import TINY_DRAFT, TINY_TARGET, tiny_options, wait_until
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import HealthServicer
from test_errors import wait_for_no_sessions

from orchestrator.clients import target_client
from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.cli.client import generate, make_request
from specdec.launch.stack import EmbeddedStack
from specdec.runtime.server import CHANNEL_OPTIONS, PARENT_PID_ENV, free_port

SERVING = health_pb2.HealthCheckResponse.SERVING


def health(address: str, timeout: float = 1.0) -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout).status


def open_streams(endpoint: str, count: int, max_new_tokens: int = 1000):
    channel = grpc.insecure_channel(endpoint)
    stub = pb_grpc.SpecDecStub(channel)
    return channel, [stub.Generate(make_request(prompt=f"load {i}", max_new_tokens=max_new_tokens)) for i in range(count)]


def test_health_answers_within_a_second_under_40_open_streams(stack):
    channel, calls = open_streams(stack.endpoint, 40)
    try:
        for call in calls:
            next(call)  # every generation is running
        for _ in range(10):
            for address in (stack.endpoint, stack.draft_address, stack.target_address):
                assert health(address, timeout=1.0) == SERVING
    finally:
        for call in calls:
            call.cancel()
        channel.close()


@pytest.fixture(scope="module")
def small_stack():
    """A stack with room for 3 sessions and a 3 s round deadline (faults are injected into it)."""
    opts = tiny_options(service=dict(max_sessions=3), orchestrator=dict(max_concurrent=3, round_timeout_s=3.0))
    with EmbeddedStack(opts) as running:
        yield running


def test_over_capacity_is_refused_at_once_and_health_still_answers(small_stack):
    channel, calls = open_streams(small_stack.endpoint, 3)
    try:
        for call in calls:
            next(call)
        with pytest.raises(grpc.RpcError) as info:
            generate(small_stack.endpoint, make_request(prompt="one too many", max_new_tokens=4), timeout=30)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "capacity" in info.value.details()
        # At once: refused while the three 1000-token generations still hold their slots, not queued behind them.
        assert not any(call.done() for call in calls), "the refusal waited for a slot to free"
        assert health(small_stack.endpoint) == SERVING
    finally:
        for call in calls:
            call.cancel()
        channel.close()


def test_the_session_cap_is_reachable(small_stack):
    from test_errors import stream_error

    target = target_client(small_stack.target_address)
    wait_for_no_sessions(target)  # streams cancelled by earlier tests are released asynchronously
    opened = [target.open_stream() for _ in range(3)]
    request = lambda i: pb.VerifyRequest(session_id=f"cap{i}", open=True, sampling=pb.SamplingParams(top_p=1.0),  # noqa: E731
                                         commit=pb.Commit(start=0, tokens=[1, 2]))
    for i, stream in enumerate(opened):
        stream.call(request(i), timeout=30)
    error = stream_error(target, [request(99)])
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "cap of 3" in error.details()
    for stream in opened:
        stream.close()
    wait_for_no_sessions(target)


def _reference(stack, prompt: str) -> list[int]:
    return generate(stack.endpoint, make_request(prompt=prompt, max_new_tokens=60, gamma=0)).token_ids


@pytest.mark.parametrize("overlap", [pb.OVERLAP_OFF, pb.OVERLAP_ON], ids=["plain", "overlap"])
@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL])
def test_a_hung_or_dead_draft_degrades_to_target_only(small_stack, sig, overlap, caplog):
    """The output is target-only's; after the fault every round runs target-only; the pool skips the
    replica (docs/RELIABILITY.md). With overlap the fault usually strikes while a branch is drafting
    beside a verify."""
    prompt = f"draft fault {sig.name}"
    reference = _reference(small_stack, prompt)
    probe = make_request(prompt="probe", max_new_tokens=8, gamma=3)
    probe.proposer = pb.PROPOSER_MODEL
    wait_until(lambda: generate(small_stack.endpoint, probe).stats["draft_tokens"] > 0, 30,
               "the pool to route to the draft again (an earlier fault's cool-down over)", every_s=0.2)
    request = make_request(prompt=prompt, max_new_tokens=60, gamma=3)
    request.proposer, request.overlap = pb.PROPOSER_MODEL, overlap
    drafted_after_fault = []
    caplog.set_level(logging.WARNING, logger="orchestrator")
    with grpc.insecure_channel(small_stack.endpoint) as channel:
        call = pb_grpc.SpecDecStub(channel).Generate(request)
        tokens, drafted_before = [], []
        while not any(drafted_before):  # kill once a round has verified drafts
            reply = next(call)
            tokens += reply.token_ids
            drafted_before.append(reply.round.drafted)
        assert len(tokens) < 30, f"no drafts in the first rounds: {drafted_before}"
        os.kill(small_stack.draft.proc.pid, sig)
        began = time.monotonic()
        try:
            for reply in call:
                tokens += reply.token_ids
                drafted_after_fault.append(reply.round.drafted)
        finally:
            if sig == signal.SIGSTOP:
                os.kill(small_stack.draft.proc.pid, signal.SIGCONT)
    assert tokens == reference, "a draft fault changed the output"
    assert time.monotonic() - began < 30
    # Rounds already drafted when the fault struck may still verify drafts; once one runs target-only,
    # every later one does (the replica is skipped and the session retries only after draft_retry_s).
    assert 0 in drafted_after_fault, f"no target-only round after the fault: {drafted_after_fault}"
    fallback = drafted_after_fault.index(0)
    assert not any(drafted_after_fault[fallback:]), f"a round drafted after the fallback: {drafted_after_fault}"
    assert len(drafted_after_fault) - fallback >= 10, "most of the generation ran after the fallback"
    skipped = [r.getMessage() for r in caplog.records if "skipping it for" in r.getMessage()]
    assert any(small_stack.draft_address in message for message in skipped), "the pool did not skip the replica"
    if sig == signal.SIGKILL:
        small_stack.draft.proc.wait()
        small_stack.restart_draft()


def test_a_hung_target_ends_the_stream_and_frees_the_session(small_stack):
    target_pid = small_stack.target.proc.pid
    with grpc.insecure_channel(small_stack.endpoint) as channel:
        call = pb_grpc.SpecDecStub(channel).Generate(make_request(prompt="hung target", max_new_tokens=1000, gamma=2))
        next(call)
        os.kill(target_pid, signal.SIGSTOP)
        began = time.monotonic()
        try:
            with pytest.raises(grpc.RpcError) as info:
                for _ in call:
                    pass
        finally:
            os.kill(target_pid, signal.SIGCONT)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - began < 15
    wait_for_no_sessions(target_client(small_stack.target_address))
    assert len(generate(small_stack.endpoint, make_request(prompt="after", max_new_tokens=4)).token_ids) == 4


def test_a_dead_target_ends_the_stream_and_health_says_so(small_stack):
    """Last in this module: it kills the stack's target."""
    with grpc.insecure_channel(small_stack.endpoint) as channel:
        call = pb_grpc.SpecDecStub(channel).Generate(make_request(prompt="dead target", max_new_tokens=1000, gamma=2))
        next(call)
        small_stack.target.proc.kill()
        with pytest.raises(grpc.RpcError) as info:
            for _ in call:
                pass
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    wait_until(lambda: health(small_stack.endpoint) != SERVING, 10, "health to stop SERVING with the target gone",
               every_s=0.1)
    assert health(small_stack.endpoint) == health_pb2.HealthCheckResponse.NOT_SERVING


def _descendants(pid: int) -> set[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    children = {int(p) for p in out}
    return children.union(*(_descendants(c) for c in children)) if children else children


STOP_BOUND_S = 30.0  # generous for a machine whose cores are busy; an orphan would live forever


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_serve_stops_every_child(sig):
    """SIGTERM drains and stops every child; even after SIGKILL no child outlives serve.

    Waits on the condition itself (every child gone), bounded by STOP_BOUND_S; on an idle
    machine it takes about a second."""
    serve = subprocess.Popen([sys.executable, "-m", "specdec.cli.main", "serve", "--port", "0", "--device", "cpu",
                              "--draft-model", TINY_DRAFT, "--target-model", TINY_TARGET, "--draft-replicas", "2"],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = serve.stdout.readline()
        assert line.startswith("specdec serving on"), line
        children = _descendants(serve.pid)
        assert len(children) >= 3, children  # two drafts and a target
        serve.send_signal(sig)
        serve.wait(timeout=STOP_BOUND_S)
        deadline = time.monotonic() + STOP_BOUND_S
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in children if _alive(pid)], f"orphaned children after {STOP_BOUND_S:.0f} s"
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# A process waiting for its stop signal (`announce_and_wait`, as every service does), with nothing in flight; a
# helper thread sends SIGTERM to itself, so the signal lands on that thread rather than on the main one.
SIGNALLED_ELSEWHERE = """
import signal, threading, time
from specdec.runtime.server import announce_and_wait

class Idle:
    port = 0
    def drain(self, timeout_s, hurry=None):
        print("drained", flush=True)

def stop_from_this_thread():
    time.sleep(0.3)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

threading.Thread(target=stop_from_this_thread, daemon=True).start()
announce_and_wait(Idle(), "idle")
"""


def test_a_stop_signal_handed_to_another_thread_still_drains_and_stops_the_service():
    """POSIX lets a process's SIGTERM go to any thread that does not block it (gRPC's and torch's among them;
    Linux prefers the main thread, not always). The service still drains and exits: with a bare wait, its main
    thread slept through the signal until a second one came."""
    env = {k: v for k, v in os.environ.items() if k != PARENT_PID_ENV}
    proc = subprocess.Popen([sys.executable, "-c", SIGNALLED_ELSEWHERE], stdout=subprocess.PIPE, text=True, env=env)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    assert "drained" in out and proc.returncode == 0, f"exit {proc.returncode}, output {out!r}"


def test_a_new_channel_reaches_a_server_restarted_where_an_old_channel_failed():
    """A channel opened after a server came back on an address connects at once, whatever an older channel of
    this process saw there (gRPC's shared subchannels handed the old one's failure and backoff to the new one:
    "Connection refused" from a listening port, seen in CI when a new server drew a dead one's port)."""
    port = free_port()

    def serve() -> grpc.Server:
        server = grpc.server(futures.ThreadPoolExecutor(2))
        health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        return server

    def check(channel: grpc.Channel) -> None:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)

    first = serve()
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS) as old:
        check(old)
        first.stop(0)
        time.sleep(0.6)  # the old channel fails to reconnect and backs off
        with pytest.raises(grpc.RpcError):
            check(old)
        second = serve()
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS) as new:
                check(new)
        finally:
            second.stop(0)
