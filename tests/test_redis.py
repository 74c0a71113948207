"""Distributed mode against a real redis-server: replica registry and failover, resumable
session records, and the γ prior shared between orchestrators."""

from __future__ import annotations

import threading
import time

import grpc
import openai
import pytest
import redis
from conftest import holds_for, redis_server, start_gateway, tiny_options, wait_until

from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.cli.client import generate, make_request
from specdec.core.params import SamplingParams
from specdec.core.rounds import RoundRecord
from specdec.core.sequence import prefix_digests
from specdec.launch.stack import EmbeddedStack
from specdec.planning.cost import CostProfile
from specdec.planning.prior import SharedPrior
from orchestrator.records import RecordWriter, resume_request
from orchestrator.request import GenerationRequest
from specdec.runtime.redis_state import DraftRegistration, PriorStore, SessionStore, SharedRoutes, registered_drafts
from specdec.runtime.server import free_port

TTL_S = 1.5


@pytest.fixture(scope="module")
def redis_url():
    with redis_server() as url:
        yield url


@pytest.fixture
def client(redis_url):
    connection = redis.Redis.from_url(redis_url, decode_responses=True)
    connection.flushdb()
    return connection


def test_registration_expires_without_heartbeats(client):
    registration = DraftRegistration(client, "10.0.0.7:50061", lambda: (3, 64), ttl_s=TTL_S).start()
    (record,) = registered_drafts(client)
    assert (record["address"], record["live_sessions"], record["max_sessions"]) == ("10.0.0.7:50061", 3, 64)
    holds_for(lambda: len(registered_drafts(client)) == 1, TTL_S * 1.5, "heartbeats keeping the record alive")
    registration.stop(deregister=False)  # as a crash: no more beats, no deregistration
    stopped = time.monotonic()
    wait_until(lambda: registered_drafts(client) == [], TTL_S + 10, "the record to expire")
    assert time.monotonic() - stopped > TTL_S / 3, "the record outlived its last beat by less than a beat"


def test_shared_prior_survives_the_trip_through_redis(client):
    profile = CostProfile((0.3, 0.31, 0.32, 0.33, 0.34, 0.35, 0.36))
    first = SharedPrior(gamma_max=6)
    session = first.new_controller(profile, profile)
    for _ in range(12):
        session.observe(RoundRecord(gamma=4, drafted=4, accepted=3, emitted=4, wall_s=0.49, draft_wall_s=0.09,
                                    draft_compute_s=0.08, target_wall_s=0.40, target_compute_s=0.38))
    first.absorb(session)
    store = PriorStore(client, "pair")
    store.save(first.snapshot())
    second = SharedPrior(gamma_max=6)
    second.load(store.load())
    assert second.snapshot() == first.snapshot()
    a, b = first.new_controller(profile, profile), second.new_controller(profile, profile)
    assert (a.acceptance.alpha, a.round_time(4)) == (b.acceptance.alpha, b.round_time(4))
    assert [a.choose(8) for _ in range(3)] == [b.choose(8) for _ in range(3)]


def test_shared_routes_find_the_longest_remembered_start_within_a_salt(client):
    long = list(range(10, 58))  # three blocks of 16
    routes = SharedRoutes(client, block=16)
    routes.remember("", long[:20], "a")  # one whole block
    routes.remember("", long, "b")  # three: the first block's route is now "b" too (the latest wins)
    routes.remember("tenant", long, "c")
    assert routes.replica_for("", long + [1]) == ("b", 48) and routes.replica_for("", long[:40]) == ("b", 32)
    routes.remember("", long[:16] + [0] * 16, "a")
    assert routes.replica_for("", long[:16] + [0] * 20) == ("a", 32) and routes.replica_for("", long[:33]) == ("b", 32)
    assert routes.replica_for("", long[:16] + [5] * 20) == ("a", 16), "whole blocks shared: the first"
    assert routes.replica_for("tenant", long) == ("c", 48) and routes.replica_for("other", long) is None
    assert routes.replica_for("", long[:15]) is None, "too short a start to route by"
    assert prefix_digests("", long, 16)[:1] == prefix_digests("", long[:16] + [9], 16)
    assert prefix_digests("", long, 16)[1] != prefix_digests("", long[:16] + [9] * 16, 16)[1]
    assert all(ttl > 0 for ttl in (client.ttl(key) for key in client.keys("specdec:route:*")))
    gone = SharedRoutes(redis.Redis(port=free_port(), socket_timeout=1, socket_connect_timeout=1), block=16)
    gone.remember("", long, "a")  # Redis away: nothing remembered, nothing routed, no error
    assert gone.replica_for("", long) is None


def _bytes_sent_to(client) -> int:
    return int(client.info("stats")["total_net_input_bytes"])


def test_a_rounds_record_costs_its_new_tokens_not_the_prompt(client):
    """A 20,000-token prompt is written once; each later round sends Redis a few hundred bytes, and the record
    read back is the request with every token committed."""
    request = GenerationRequest(list(range(20_000)), 64, SamplingParams(temperature=0.7, seed=5), None, ("\n\n",))
    writer = RecordWriter(SessionStore(client), "long-prompt", request, owner="alice")
    generated = [7, 8]
    writer(generated, "")
    first = _bytes_sent_to(client)
    for round_ in range(10):
        generated += [100 + round_, 200 + round_, 300 + round_]
        writer(generated, "length" if round_ == 9 else "")
    per_round = (_bytes_sent_to(client) - first) / 10
    assert per_round < 1_000, f"{per_round:.0f} bytes a round: the prompt went again"
    record = SessionStore(client).load("long-prompt")
    assert record["generated"] == generated and record["finish_reason"] == "length"
    assert record["prompt_ids"] == request.prompt_ids and record["stop"] == ["\n\n"]
    assert resume_request({**record, "finish_reason": ""}, "long-prompt", 2, "alice").params == request.params


def test_a_resumed_record_refuses_its_old_writers_late_rounds(client):
    """The resume's writer takes the record over; a round the cut generation still writes is dropped, never
    appended after the resume's tokens."""
    store = SessionStore(client)
    cut, resumed = store.record("s", {"prompt_ids": [5, 6]}), store.record("s", {"prompt_ids": [5, 6]})
    cut.save([1, 2, 3], "")
    resumed.save([1, 2, 3, 9], "")
    cut.save([1, 2, 3, 4, 5], "")  # the cut generation's last round, late
    assert store.load("s")["generated"] == [1, 2, 3, 9]
    resumed.save([1, 2, 3, 9, 10], "stop")
    assert (store.load("s")["generated"], store.load("s")["finish_reason"]) == ([1, 2, 3, 9, 10], "stop")


def test_a_record_not_as_its_writer_left_it_is_written_whole_again(client):
    """A record lost with Redis, or whose last write landed unseen (here one token more than the writer knows
    of), is rewritten whole at the next round, request and all."""
    store = SessionStore(client)
    writer = store.record("s", {"prompt_ids": [5]})
    writer.save([1, 2], "")
    client.flushdb()
    writer.save([1, 2, 3], "")
    assert store.load("s") == {"prompt_ids": [5], "generated": [1, 2, 3], "finish_reason": ""}
    client.rpush("specdec:session:s:tokens", 4)
    writer.save([1, 2, 3, 4, 5], "")
    assert store.load("s")["generated"] == [1, 2, 3, 4, 5]
    assert store.load("never-written") is None


def _cluster(redis_url):
    opts = tiny_options(service=dict(redis_url=redis_url, heartbeat_ttl_s=TTL_S), draft_replicas=2)
    return EmbeddedStack(opts)


@pytest.fixture(scope="module")
def cluster(redis_url):
    with _cluster(redis_url) as stack:
        yield stack


@pytest.fixture
def two_replicas(redis_url):
    """A cluster of its own, on a Redis database of its own, both replicas alive and registered (`cluster`
    loses one in a test, and its live one would be a third replica): (the stack, its Redis URL)."""
    url = redis_url.removesuffix("/0") + "/1"
    with _cluster(url) as stack:
        registry = redis.Redis.from_url(url, decode_responses=True)
        wait_until(lambda: sorted(r["address"] for r in registered_drafts(registry)) == sorted(stack.draft_addresses),
                   TTL_S + 10, "both replicas registered")
        yield stack, url


def test_sessions_spread_over_replicas_then_route_around_a_dead_one(stack, cluster, redis_url):
    registry = redis.Redis.from_url(redis_url, decode_responses=True)
    assert sorted(r["address"] for r in registered_drafts(registry)) == sorted(cluster.draft_addresses)
    prompts = ["def a():", "def b():"]
    reference = {p: generate(stack.endpoint, make_request(prompt=p, max_new_tokens=64, gamma=0)).token_ids
                 for p in prompts}

    results = {}

    def run(prompt):
        results[prompt] = generate(cluster.endpoint, make_request(prompt=prompt, max_new_tokens=64, gamma=2))

    threads = [threading.Thread(target=run, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {p: r.token_ids for p, r in results.items()} == reference
    assert {r.stats["draft_replica"] for r in results.values()} == set(cluster.draft_addresses), \
        "two concurrent sessions should land on the two replicas"

    dead, alive = cluster.drafts[0], cluster.draft_addresses[1]
    dead.proc.kill()
    dead.proc.wait()
    # Within the TTL the dead replica may still be picked: the draft call fails, the session goes on
    # target-only and then asks the pool again, which now skips the dead replica.
    for prompt in prompts:
        out = generate(cluster.endpoint, make_request(prompt=prompt, max_new_tokens=64, gamma=2))
        assert out.token_ids == reference[prompt]
        assert out.stats["draft_replica"] == alive
    wait_until(lambda: [r["address"] for r in registered_drafts(registry)] == [alive], TTL_S + 10,
               "the dead replica's record to expire")
    out = generate(cluster.endpoint, make_request(prompt=prompts[0], max_new_tokens=64, gamma=2))
    assert out.token_ids == reference[prompts[0]] and out.stats["draft_replica"] == alive
    assert all(r.drafted > 0 for r in out.rounds[:-1]), "new sessions speculate on the live replica"


def test_a_chats_next_turn_through_another_orchestrator_finds_its_draft_replica(two_replicas):
    """Turn 1 through the first orchestrator lands on the second replica while a generation holds the first;
    once both are idle the least loaded would be the first again, but turn 2, through another orchestrator,
    goes where turn 1's draft KV is kept: the orchestrators share their routes through Redis."""
    cluster, url = two_replicas
    registry = redis.Redis.from_url(url, decode_responses=True)
    wait_until(lambda: not any(r["live_sessions"] for r in registered_drafts(registry)), 10, "both replicas idle")
    first = sorted(cluster.draft_addresses)[0]
    prompt = list(range(10, 10 + 48))
    with grpc.insecure_channel(cluster.endpoint) as channel:
        busy = pb_grpc.SpecDecStub(channel).Generate(make_request(prompt="hold a replica", max_new_tokens=400,
                                                                  gamma=2), timeout=120)
        next(busy)  # running: it holds the first replica
        one = generate(cluster.endpoint, make_request(prompt_token_ids=prompt, max_new_tokens=8, gamma=2))
        busy.cancel()
    assert one.stats["draft_replica"] != first, "turn 1 should avoid the busy replica"
    wait_until(lambda: not any(r["live_sessions"] for r in registered_drafts(registry)), 10, "both replicas idle")
    other = cluster.start_another_orchestrator()
    try:
        two = generate(f"127.0.0.1:{other.port}", make_request(prompt_token_ids=prompt + one.token_ids + [3, 4],
                                                               max_new_tokens=8, gamma=2))
    finally:
        other.stop(grace=1.0)
    assert two.stats["draft_replica"] == one.stats["draft_replica"]


def test_a_draining_replica_leaves_the_registry_at_once_and_stops_once_its_stream_ends(two_replicas):
    """SIGTERM to a draft replica holding a session stream: it deregisters as its drain begins, so no orchestrator
    routes a new session to it, while the stream it holds goes on; once that stream ends, it exits."""
    from orchestrator.clients import draft_client

    cluster, url = two_replicas
    registry = redis.Redis.from_url(url, decode_responses=True)
    leaving = cluster.drafts[0]
    client = draft_client(cluster.draft_addresses[0])
    stream = client.open_stream()
    try:
        stream.call(pb.DraftRequest(session_id="draining", open=True, sampling=pb.SamplingParams(top_p=1.0),
                                    commit=pb.Commit(start=0, tokens=[1, 2]), gamma=1), timeout=30)
        leaving.terminate()
        wait_until(lambda: [r["address"] for r in registered_drafts(registry)] == cluster.draft_addresses[1:], 5,
                   "the draining replica to leave the registry")
        holds_for(lambda: leaving.proc.poll() is None, 1.0, "the replica draining while its stream is open")
    finally:
        stream.close()
        client.close()
    leaving.wait_stopped(20)
    assert leaving.proc.returncode == 0


def test_another_orchestrator_resumes_a_cut_generation(stack, cluster):
    prompt, n = "resume this", 80
    reference = generate(stack.endpoint, make_request(prompt=prompt, max_new_tokens=n, gamma=0)).token_ids
    received: list[int] = []
    with grpc.insecure_channel(cluster.endpoint) as channel:
        request = make_request(prompt=prompt, max_new_tokens=n, gamma=3)
        request.session_id = "resumable-1"
        stream = pb_grpc.SpecDecStub(channel).Generate(request)
        for _ in range(4):
            received.extend(next(stream).token_ids)
        stream.cancel()  # the client (or its orchestrator) goes away mid-generation
    other = cluster.start_another_orchestrator()
    try:
        resume = make_request(max_new_tokens=1)  # ignored on resume: the record holds the request
        resume.session_id, resume.resume, resume.resume_from = "resumable-1", True, len(received)
        rest = generate(f"127.0.0.1:{other.port}", resume)
        with pytest.raises(grpc.RpcError) as finished:
            generate(f"127.0.0.1:{other.port}", resume)
    finally:
        other.stop(grace=1.0)
    assert received + rest.token_ids == reference
    assert finished.value.code() == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize("target, code", [("cluster", grpc.StatusCode.NOT_FOUND),
                                          ("stack", grpc.StatusCode.FAILED_PRECONDITION)])
def test_resume_errors(request, target, code):
    endpoint = request.getfixturevalue(target).endpoint
    resume = make_request(max_new_tokens=1)
    resume.session_id, resume.resume = "never-started", True
    with pytest.raises(grpc.RpcError) as failure:
        generate(endpoint, resume)
    assert failure.value.code() == code, failure.value.details()


def test_http_servers_sharing_redis_go_on_from_each_others_responses(stack, redis_url):
    """Two HTTP servers in front of one orchestrator, as replicas behind one address: a response created on one
    is read, continued (`previous_response_id`, the same reply as one server alone gives) and deleted on the
    other; a server whose Redis is gone answers 503 for a stored id and still replies to a new request."""
    gateways = [start_gateway(stack.endpoint, "--redis-url", redis_url) for _ in range(2)]
    try:
        first, second = (openai.OpenAI(base_url=url, api_key="none", max_retries=0) for _, url in gateways)
        args = dict(model="tiny:seed=0", max_output_tokens=8, temperature=0)
        started = first.responses.create(input="fib in Python", **args)
        assert second.responses.retrieve(started.id).output_text == started.output_text
        went_on = second.responses.create(input="and in C?", previous_response_id=started.id, **args)
        alone = first.responses.create(input="and in C?", previous_response_id=started.id, **args)
        assert went_on.output_text == alone.output_text
        assert went_on.usage.input_tokens == alone.usage.input_tokens > started.usage.input_tokens + 8
        second.responses.delete(started.id)
        with pytest.raises(openai.NotFoundError):
            first.responses.retrieve(started.id)
        with pytest.raises(openai.NotFoundError):
            first.responses.create(input="x", previous_response_id=started.id, **args)
    finally:
        for proc, _ in gateways:
            proc.terminate()
            proc.wait(30)
    with redis_server() as lost:
        proc, url = start_gateway(stack.endpoint, "--redis-url", lost)
        try:
            client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
            kept = client.responses.create(input="fib in Python", **args)
            redis.Redis.from_url(lost).shutdown(nosave=True)
            with pytest.raises(openai.InternalServerError) as caught:
                client.responses.create(input="x", previous_response_id=kept.id, **args)
            assert caught.value.status_code == 503 and "cannot be reached" in caught.value.message
            assert client.responses.create(input="fib in Python", **args).output_text == kept.output_text
        finally:
            proc.terminate()
            proc.wait(30)
