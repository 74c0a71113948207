"""A chat's next turn goes back to the draft replica that served the last one, where its draft KV is kept
(`orchestrator.draft_pool.Routes`), unless that replica is busier than the least loaded by more than a session."""

from __future__ import annotations

from conftest import tiny_options, wait_until

from orchestrator.draft_pool import ROUTE_MIN_TOKENS, DraftPool, Routes
from protos import specdec_pb2_grpc as pb_grpc
from specdec.cli.client import generate, make_request
from specdec.launch.stack import EmbeddedStack
from specdec.runtime.security import open_channel
from specdec.runtime.server import CHANNEL_OPTIONS

LONG = list(range(10, 10 + 3 * ROUTE_MIN_TOKENS))


def test_routes_find_the_longest_shared_start_within_a_salt():
    routes = Routes(capacity=3)
    routes.remember("", LONG[:ROUTE_MIN_TOKENS + 4], "a")
    routes.remember("", LONG, "b")
    routes.remember("tenant", LONG, "c")
    assert routes.replica_for("", LONG + [1]) == "b"
    assert routes.replica_for("", LONG[:ROUTE_MIN_TOKENS + 4] + [1]) == "b", "a tie: the latest"
    assert routes.replica_for("tenant", LONG) == "c" and routes.replica_for("other", LONG) is None
    assert routes.replica_for("", LONG[:ROUTE_MIN_TOKENS - 1]) is None, "too short a start to route by"
    routes.remember("", [1] * ROUTE_MIN_TOKENS, "d")  # the oldest ("a") goes
    routes.remember("", [2] * (ROUTE_MIN_TOKENS - 1), "e")  # too short to remember
    assert routes.replica_for("", LONG[:ROUTE_MIN_TOKENS + 4]) == "b" and routes.replica_for("", [1] * 20) == "d"


class _Client:
    def __init__(self, address: str):
        self.address = address


def _pool(loads: dict[str, int]) -> DraftPool:
    """A pool of replicas with `loads` sessions each (no RPC: their clients are stand-ins)."""
    pool = DraftPool(list(loads))
    pool._client = _Client
    pool._opened.update(loads)
    return pool


def test_a_session_goes_back_to_its_replica_unless_it_is_busier_by_more_than_one_session():
    pool = _pool({"a": 0, "b": 1})
    assert pool.acquire(LONG, "").address == "a", "nothing remembered: the least loaded"
    pool.remember("", LONG, "b")
    pool._opened.update({"a": 0, "b": 1})
    assert pool.acquire(LONG + [7], "").address == "b", "one session busier: still its replica"
    pool._opened.update({"a": 0, "b": 2})
    assert pool.acquire(LONG + [7], "").address == "a", "two busier: the least loaded"
    pool._opened.update({"a": 0, "b": 0})
    assert pool.acquire(LONG + [7], "tenant").address == "a", "another salt's sequence routes nothing"
    pool.failed(_Client("b"))
    assert pool.acquire(LONG + [7], "").address == "a", "a failed replica is skipped"


def test_a_chats_next_turn_finds_its_draft_replica_through_the_services():
    """Two replicas: turn 1 lands on the second while a generation holds the first; once both are idle the
    least loaded would be the first again, but turn 2 goes where turn 1's draft KV is kept."""
    with EmbeddedStack(tiny_options(draft_replicas=2)) as stack:
        pool = stack.orchestrator.servicer.drafts
        with open_channel(stack.endpoint, CHANNEL_OPTIONS) as channel:
            busy = pb_grpc.SpecDecStub(channel).Generate(make_request(prompt="hold a replica", max_new_tokens=400,
                                                                      gamma=2), timeout=120)
            next(busy)  # running: it holds the first replica
            one = generate(stack.endpoint, make_request(prompt_token_ids=LONG, max_new_tokens=8, gamma=2))
            busy.cancel()
        wait_until(lambda: not any(pool.opened().values()), 30, "the cancelled generation to let go of its replica")
        two = generate(stack.endpoint, make_request(prompt_token_ids=LONG + one.token_ids + [3, 4], max_new_tokens=8,
                                                    gamma=2))
        assert one.stats["draft_replica"] == two.stats["draft_replica"] == max(stack.draft_addresses)
        assert two.stats["cached_prompt_tokens"] >= len(LONG)
