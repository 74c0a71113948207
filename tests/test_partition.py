"""A peer that goes silent without closing its connection (a host gone, a partition): the servers' keepalive
pings go unanswered, they close the connection, and every session the silent peer held is freed; the
orchestrator's channels ping too, so once the partition heals it connects afresh instead of waiting on dead
connections.

A partition is a delay proxy whose delay is set to days: the connections stay open and every byte is held.
"""

from __future__ import annotations

import time

import grpc
import pytest
from conftest import tiny_options, wait_until
from grpc_health.v1 import health_pb2
from test_errors import wait_for_no_sessions
from test_faults import SERVING, health

from orchestrator.clients import draft_client, target_client
from protos import specdec_pb2_grpc as pb_grpc
from specdec.cli.client import generate, make_request
from specdec.launch.delay_proxy import DelayProxy
from specdec.launch.stack import EmbeddedStack

KEEPALIVE_S = 1.0
FOREVER_MS = 1e9  # a delay no test outlives
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
ROUND_RTT_MS = 200.0  # each hop: a 1,000-token reply takes minutes, so it cannot end (and free) on its own


@pytest.fixture(scope="module")
def partitioned_stack():
    """Proxies on both of the orchestrator's hops, slow rounds, pings after 1 s of silence (every server, the
    orchestrator's channels), a 2-minute round deadline (longer than any wait here)."""
    opts = tiny_options(delay_proxies=True, service=dict(keepalive_s=KEEPALIVE_S),
                        orchestrator=dict(round_timeout_s=120.0, target_chunk_ms=0.0))
    with EmbeddedStack(opts) as stack:
        stack.set_rtt_ms(ROUND_RTT_MS, ROUND_RTT_MS)
        yield stack


def _sessions_freed_after_partition(stack: EmbeddedStack, client_address: str, partition) -> float:
    """Start a long reply at `client_address`, call `partition()` once both services hold its sessions, and
    return how long until neither does."""
    draft, target = draft_client(stack.draft_address), target_client(stack.target_address)
    with grpc.insecure_channel(client_address) as channel:
        call = pb_grpc.SpecDecStub(channel).Generate(make_request(prompt="silent", max_new_tokens=1000, gamma=2))
        try:
            next(call)
            assert draft.info().live_sessions >= 1 and target.info().live_sessions == 1
            partition()
            began = time.monotonic()
            wait_for_no_sessions(draft, target, timeout=20 * KEEPALIVE_S)
            return time.monotonic() - began
        finally:
            call.cancel()


def test_a_client_gone_silent_frees_its_sessions_on_both_services(partitioned_stack):
    """The orchestrator pings the client, closes the connection, and the generation ends at its next round."""
    host, port = partitioned_stack.endpoint.rsplit(":", 1)
    with DelayProxy(host, int(port)) as to_orchestrator:
        def partition():
            to_orchestrator.delay_ms = FOREVER_MS

        freed_s = _sessions_freed_after_partition(partitioned_stack, to_orchestrator.address, partition)
    assert freed_s < 8 * KEEPALIVE_S


def test_an_orchestrator_gone_silent_has_its_sessions_freed_and_serves_again_once_healed(partitioned_stack):
    """Each service pings the orchestrator and closes the connection, which ends the session's stream; the
    orchestrator, waiting on its round, has not given up. Its own pings close its dead connections, and its
    health says NOT_SERVING while the target cannot be reached. Healed (the proxies still hold the old
    connections' bytes), a new request connects afresh and is answered, where it would wait out its round's
    deadline on the dead connections, and health says SERVING again."""
    stack = partitioned_stack

    def partition():
        stack.set_rtt_ms(FOREVER_MS, FOREVER_MS)

    freed_s = _sessions_freed_after_partition(stack, stack.endpoint, partition)
    assert freed_s < 8 * KEEPALIVE_S
    wait_until(lambda: health(stack.endpoint) == NOT_SERVING, 10 * KEEPALIVE_S,
               "the orchestrator's health to say its target is out of reach")
    stack.set_rtt_ms(0.0, 0.0)
    healed = time.monotonic()

    def answered() -> bool:
        try:
            return len(generate(stack.endpoint, make_request(prompt="healed", max_new_tokens=4, gamma=2),
                                timeout=3 * KEEPALIVE_S).token_ids) == 4
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE), exc
            return False

    wait_until(answered, 20 * KEEPALIVE_S, "a request answered once the partition healed")
    assert time.monotonic() - healed < 10 * KEEPALIVE_S
    assert health(stack.endpoint) == SERVING
