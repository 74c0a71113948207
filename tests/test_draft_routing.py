"""A chat's next turn goes back to the draft replica that served the last one, where its draft KV is kept
(`orchestrator.draft_pool.Routes`), unless that replica is busier than the least loaded by more than a session."""

from __future__ import annotations

from conftest import tiny_options, wait_until

from orchestrator.draft_pool import ROUTE_MIN_TOKENS, DraftPool, Routes
from protos import specdec_pb2_grpc as pb_grpc
from specdec.cli.client import generate, make_request
from specdec.launch.stack import EmbeddedStack
from specdec.planning.controller import GammaController
from specdec.runtime.security import open_channel
from specdec.runtime.server import CHANNEL_OPTIONS

LONG = list(range(10, 10 + 3 * ROUTE_MIN_TOKENS))


def test_routes_find_the_longest_shared_start_within_a_salt():
    routes = Routes(capacity=3)
    routes.remember("", LONG[:ROUTE_MIN_TOKENS + 4], "a")
    routes.remember("", LONG, "b")
    routes.remember("tenant", LONG, "c")
    assert routes.replica_for("", LONG + [1]) == ("b", len(LONG))
    assert routes.replica_for("", LONG[:ROUTE_MIN_TOKENS + 4] + [1]) == ("b", ROUTE_MIN_TOKENS + 4), "a tie: the latest"
    assert routes.replica_for("tenant", LONG) == ("c", len(LONG)) and routes.replica_for("other", LONG) is None
    assert routes.replica_for("", LONG[:ROUTE_MIN_TOKENS - 1]) is None, "too short a start to route by"
    routes.remember("", [1] * ROUTE_MIN_TOKENS, "d")  # the oldest ("a") goes
    routes.remember("", [2] * (ROUTE_MIN_TOKENS - 1), "e")  # too short to remember
    assert routes.replica_for("", LONG[:ROUTE_MIN_TOKENS + 4])[0] == "b" and routes.replica_for("", [1] * 20)[0] == "d"


def test_a_route_that_only_grows_takes_one_slot():
    """A draft fed piece by piece after a reply (`Drafting.finish`) routes each piece: each replaces the last, so
    other conversations' routes stay."""
    routes = Routes(capacity=2)
    other = [5] * ROUTE_MIN_TOKENS
    routes.remember("", other, "x")
    for end in range(ROUTE_MIN_TOKENS, len(LONG) + 1, 8):
        routes.remember("", LONG[:end], "a")
    assert routes.replica_for("", LONG) == ("a", len(LONG)) and routes.replica_for("", other) == ("x", len(other))
    routes.remember("tenant", LONG + [1], "b")  # another salt's: a slot of its own
    assert routes.replica_for("", LONG) == ("a", len(LONG)) and routes.replica_for("", other) is None


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
    """With the replica, how many of the session's tokens it likely keeps: the route's shared start where the
    session goes back to it, else none."""
    pool = _pool({"a": 0, "b": 1})

    def acquired(tokens, salt=""):
        client, kept = pool.acquire(tokens, salt)
        return client.address, kept

    assert acquired(LONG) == ("a", 0), "nothing remembered: the least loaded"
    pool.remember("", LONG, "b")
    pool._opened.update({"a": 0, "b": 1})
    assert acquired(LONG + [7]) == ("b", len(LONG)), "one session busier: still its replica"
    pool._opened.update({"a": 0, "b": 2})
    assert acquired(LONG + [7]) == ("a", 0), "two busier: the least loaded, which keeps nothing of it"
    pool._opened.update({"a": 0, "b": 0})
    assert acquired(LONG[:20] + [7]) == ("b", 20), "kept: the shared start only"
    assert acquired(LONG + [7], "tenant") == ("a", 0), "another salt's sequence routes nothing"
    pool.failed(_Client("b"))
    assert acquired(LONG + [7]) == ("a", 0), "a failed replica is skipped"


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


def test_a_chats_next_turn_prices_only_what_its_draft_replica_does_not_keep(monkeypatch):
    """Turn 2's first chosen round is told that its draft feeds only what turn 1's draft was never sent
    (`choose(unseen=…)`): its replica keeps turn 1's draft KV. Priced as the whole conversation, a long chat's
    draft would look too dear to probe on every turn. The replica says what it took (`draft_cached_tokens`),
    here on the same turn at a fixed γ (at the tiny pair's α the adaptive turn does not draft)."""
    told = []
    choose = GammaController.choose

    def spy(self, max_useful=None, unseen=1):
        told.append(unseen)
        return choose(self, max_useful, unseen)

    monkeypatch.setattr(GammaController, "choose", spy)  # the embedded orchestrator runs in this process
    with EmbeddedStack(tiny_options(orchestrator=dict(target_chunk_ms=0.0))) as stack:
        one = generate(stack.endpoint, make_request(prompt_token_ids=LONG, max_new_tokens=8, gamma=2, overlap="off"))
        called = [i for i, r in enumerate(one.rounds) if r.drafted]  # a fixed γ: every round that called drafts
        sent = len(LONG) + sum(r.emitted for r in one.rounds[:called[-1]])  # what turn 1's draft was last sent
        told.clear()
        prompt = LONG + one.token_ids + [3, 4]
        two = generate(stack.endpoint, make_request(prompt_token_ids=prompt, max_new_tokens=8, overlap="off"))
        fixed = generate(stack.endpoint, make_request(prompt_token_ids=prompt, max_new_tokens=8, gamma=2,
                                                      overlap="off"))
    assert called and told, "turn 1 drafted, and turn 2 chose γ"
    assert told[0] == len(prompt) + two.rounds[0].emitted - sent + 1 < len(prompt) - len(LONG)
    assert fixed.stats["draft_cached_tokens"] >= sent, "the replica took turn 1's draft KV"
    assert one.stats["draft_cached_tokens"] == 0
