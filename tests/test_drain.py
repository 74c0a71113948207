"""Stopping as a rolling update wants (`RunningServer.drain`, the HTTP API's `RunningHttp.drain`): health says
NOT_SERVING and new calls are refused with UNAVAILABLE at once, the calls in flight run on for the drain's time,
and those still running then end with UNAVAILABLE at their next message, their sessions freed on every service.
First on a bare gRPC server with a handler of our own, then through the services with the target 40 ms away (a
long reply takes seconds), and through `python -m specdec.http` stopped by SIGTERM."""

from __future__ import annotations

import json
import signal
import threading
import time

import grpc
import httpx2 as httpx
import pytest
from conftest import LETTERS, TINY_TARGET, slow_target_stack, start_gateway, wait_until
from grpc_health.v1 import health_pb2, health_pb2_grpc
from test_errors import wait_for_no_sessions

from orchestrator.clients import draft_client, target_client
from protos import specdec_pb2_grpc as pb_grpc
from specdec.cli.client import make_request
from specdec.runtime.guards import CUT, SHUTTING_DOWN
from specdec.runtime.server import start_server

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
STEP_S = 0.02  # the bare handler's time between messages


class Ticker:
    """A streaming handler that sends `count` messages, one every STEP_S, and notes when its cleanup ran."""

    def __init__(self):
        self.cleaned = threading.Event()

    def stream(self, request: bytes, context):
        try:
            for i in range(int(request or b"0")):
                time.sleep(STEP_S)
                yield str(i).encode()
        finally:
            self.cleaned.set()


@pytest.fixture
def ticker_server():
    ticker = Ticker()
    handlers = {"Stream": grpc.unary_stream_rpc_method_handler(ticker.stream)}
    running = start_server(lambda server: server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("test.Ticker", handlers)]), ["test.Ticker"], "127.0.0.1", 0,
        max_concurrent=4)
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    stream = channel.unary_stream("/test.Ticker/Stream")
    yield running, ticker, stream, channel
    channel.close()
    running.stop(0)


def drain_in_background(running, timeout_s: float, hurry: threading.Event | None = None) -> threading.Thread:
    thread = threading.Thread(target=running.drain, args=(timeout_s, hurry))
    thread.start()
    wait_until(lambda: running.guard.closed, 5, "the drain to begin")
    return thread


def test_a_drain_lets_a_call_in_flight_finish_and_refuses_new_ones(ticker_server):
    running, ticker, stream, channel = ticker_server
    call = stream(b"40", timeout=30)  # 0.8 s
    assert next(call) == b"0"
    began = time.monotonic()
    drain = drain_in_background(running, 60)
    with pytest.raises(grpc.RpcError) as refused:
        list(stream(b"1", timeout=5))
    assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
    status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1).status
    assert status == NOT_SERVING
    assert [int(m) for m in call] == list(range(1, 40))  # the whole reply
    drain.join(10)
    assert not drain.is_alive() and time.monotonic() - began < 10  # once the call ended, not after 60 s


@pytest.mark.parametrize("hurried", [False, True])
def test_a_call_still_running_when_the_drain_ends_is_cut_at_its_next_message_after_its_cleanup(ticker_server, hurried):
    """Past the drain's time (or at a second signal: `hurry`), a streaming call ends with UNAVAILABLE; its handler is
    closed first, so what it holds (a session on every service) is freed before its client hears."""
    running, ticker, stream, _ = ticker_server
    call = stream(b"100000", timeout=60)
    assert next(call) == b"0"
    hurry = threading.Event()
    began = time.monotonic()
    drain = drain_in_background(running, 60 if hurried else 0.3, hurry)
    if hurried:
        hurry.set()
    with pytest.raises(grpc.RpcError) as cut:
        for _ in call:
            pass
    assert ticker.cleaned.is_set()
    assert (cut.value.code(), cut.value.details()) == (grpc.StatusCode.UNAVAILABLE, CUT)
    drain.join(10)
    assert not drain.is_alive() and time.monotonic() - began < 10


# -- through the services ---------------------------------------------------------------------------------------
CHAT = {"model": TINY_TARGET, "messages": [{"role": "user", "content": "fib"}], "temperature": 0, "gamma": 0,
        "logit_bias": LETTERS}


@pytest.fixture(scope="module")
def slow_stack():
    with slow_target_stack() as stack:
        yield stack


@pytest.fixture
def services(slow_stack):
    draft, target = draft_client(slow_stack.draft_address), target_client(slow_stack.target_address)
    yield draft, target
    draft.close(), target.close()


def restart_orchestrator(stack) -> None:
    stack.orchestrator = stack.start_another_orchestrator()


def long_request(prompt: str, max_new_tokens: int):
    """Target-only (a round trip a token), no end before `max_new_tokens`."""
    request = make_request(prompt=prompt, max_new_tokens=max_new_tokens, gamma=0)
    request.ignore_eos = True
    return request


def test_a_drained_orchestrator_finishes_a_short_generation_then_cuts_a_long_one_and_frees_its_sessions(
        slow_stack, services):
    with grpc.insecure_channel(slow_stack.endpoint) as channel:
        stub = pb_grpc.SpecDecStub(channel)
        short = stub.Generate(long_request("short", 12), timeout=60)  # about 0.5 s
        long = stub.Generate(long_request("long", 300), timeout=60)  # 12 s unless cut
        short_tokens = list(next(short).token_ids)
        next(long)
        drain = threading.Thread(target=slow_stack.drain, args=(2.0,))
        drain.start()
        wait_until(lambda: slow_stack.orchestrator.guard.closed, 5, "the drain to begin")
        with pytest.raises(grpc.RpcError) as refused:
            next(stub.Generate(make_request(prompt="new", max_new_tokens=4), timeout=10))
        assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
        short_tokens += [t for message in short for t in message.token_ids]
        assert len(short_tokens) == 12 and short.code() == grpc.StatusCode.OK
        with pytest.raises(grpc.RpcError) as cut:
            for _ in long:
                pass
        assert (cut.value.code(), cut.value.details()) == (grpc.StatusCode.UNAVAILABLE, CUT)
        drain.join(20)
        assert not drain.is_alive()
    try:
        wait_for_no_sessions(*services)
    finally:
        restart_orchestrator(slow_stack)


def events(lines) -> list:
    """A streamed chat's server-sent events from its lines: each JSON object, and "[DONE]"."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def stop_gateway_while_streaming(stack, max_tokens: int, *flags: str) -> tuple[list, float]:
    """SIGTERM to a `python -m specdec.http` in front of `stack` once a streamed chat of `max_tokens` has begun:
    (the stream's events, seconds from the signal to the gateway's exit)."""
    proc, url = start_gateway(stack.endpoint, *flags)
    try:
        with httpx.Client(timeout=60) as client:
            with client.stream("POST", f"{url}/chat/completions",
                               json={**CHAT, "max_tokens": max_tokens, "stream": True}) as response:
                assert response.status_code == 200
                lines = response.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                proc.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
                rest = events(lines)
        assert proc.wait(30) == 0
        return [json.loads(first.removeprefix("data: ")), *rest], time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_stopped_http_server_lets_a_stream_in_flight_finish(slow_stack):
    got, _ = stop_gateway_while_streaming(slow_stack, 30)  # about 1.2 s
    chunks = [e for e in got if isinstance(e, dict)]
    assert got[-1] == "[DONE]" and not any("error" in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)


def test_a_stopped_http_server_ends_a_stream_past_its_drain_with_an_error_event_and_frees_its_sessions(
        slow_stack, services):
    got, took = stop_gateway_while_streaming(slow_stack, 300, "--drain-timeout-s", "0.5")  # 12 s unless cut
    assert got[-1] == "[DONE]"
    error = got[-2]["error"]
    assert (error["code"], error["type"], error["message"]) == (503, "service_unavailable", CUT)
    assert took < 10
    wait_for_no_sessions(*services)
