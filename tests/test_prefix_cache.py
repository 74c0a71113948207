"""Ended sessions' KV caches kept for later sessions that start the same way (`specdec.engine.prefix_cache`):
a chat's next turn computes only its new tokens, and its output, logits and log-probabilities are the bits
a cold start gives."""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch
from conftest import TINY_TARGET, choices, count_fed, tiny_options

from specdec.cli.client import generate, make_request
from specdec.core.errors import ResourceExhausted
from specdec.core.params import MAX_CACHE_SALT, SamplingParams
from specdec.core.sequence import common_prefix
from specdec.engine.model_engine import REUSE_MIN_TOKENS
from specdec.engine.target_engine import TargetEngine
from specdec.engine.models import load_model
from specdec.engine.prefix_cache import PrefixCache
from specdec.launch.stack import EmbeddedStack

PROMPT = [(7 * i + 3) % 250 for i in range(40)]  # no other test's prompt starts like this


# -- the store ------------------------------------------------------------------------


def _take(store: PrefixCache, tokens: list[int], at_least: int):
    """`reuse` where every match is the same conversation going on (any tail is slack): a take."""
    def never(*_):
        raise AssertionError("taking copies nothing")

    return store.reuse(tokens, at_least, "", never, slack=10**9)


def test_the_longest_shared_prefix_is_taken_and_leaves_the_store():
    store = PrefixCache(budget_bytes=100)
    store.keep([1, 2, 3, 4], "a", 10)
    store.keep([1, 2, 9], "b", 10)
    store.keep([1, 2, 3, 4, 5, 6], "c", 10)
    assert _take(store, [1, 2, 3, 4, 5, 7], at_least=3) == ("c", 5)
    assert _take(store, [1, 2, 3, 4, 5, 7], at_least=3) == ("a", 4)  # c is gone: the next longest
    assert _take(store, [1, 2, 3], at_least=3) is None  # b shares only 2
    assert len(store) == 1 and store.tokens == 3 and store.nbytes == 10
    store.keep([5, 6, 7], "d", 10)
    assert _take(store, [5, 6, 7, 8], at_least=3) == ("d", 3)


def test_a_tie_goes_to_the_first_kept():
    store = PrefixCache(budget_bytes=100)
    store.keep([1, 2, 3, 8], "first", 1)
    store.keep([1, 2, 3, 9], "second", 1)
    assert _take(store, [1, 2, 3, 7], at_least=1) == ("first", 3)


def test_another_conversation_sharing_only_the_start_copies_it_and_leaves_the_cache():
    """Past `slack` positions beyond the shared prefix, the cache is another conversation's: its shared part
    is copied out, it stays, and it becomes the last to be evicted."""
    store, copies = PrefixCache(budget_bytes=100), []
    store.keep([1, 2, 3, 4, 5, 6, 7, 8], "system+a", 1)
    store.keep([9, 9, 9], "other", 1)
    copy = lambda cache, n: copies.append((cache, n))
    assert store.reuse([1, 2, 3, 4, 50, 60], 3, "", copy, slack=2) == (None, 4)
    assert copies == [("system+a", 4)] and len(store) == 2
    assert store.evict_oldest() and store.reuse([9, 9, 9, 1], 3, "", copy, slack=2) is None  # "other" went first
    assert store.reuse([1, 2, 3, 4, 5, 6, 70], 3, "", copy, slack=2) == ("system+a", 6)  # a's next turn: taken
    assert len(store) == 0 and len(copies) == 1


def test_the_oldest_go_first_to_keep_within_the_budget_and_the_entry_cap():
    store = PrefixCache(budget_bytes=25, max_entries=3)
    for name in "abc":
        assert store.keep([ord(name)] * 4, name, 10)
    assert [_take(store, [ord(n)] * 4, 1) for n in "ab"] == [None, ("b", 4)]  # a made room for c
    assert not store.keep([1] * 4, "huge", 26)  # over the budget alone: not kept, nothing dropped
    assert len(store) == 1
    small = PrefixCache(budget_bytes=100, max_entries=2)
    for name in "xyz":
        small.keep([ord(name)], name, 1)
    assert len(small) == 2 and _take(small, [ord("x")], 1) is None
    assert small.evict_oldest() and small.evict_oldest() and not small.evict_oldest()
    assert small.nbytes == 0


# -- the engine -------------------------------------------------------------------------


def _engine(runner: str = "ragged", slots: int = 4, **kw) -> TargetEngine:
    return TargetEngine(load_model(TINY_TARGET, "cpu", runner=runner, slots=slots), max_sessions=slots, **kw)


def _first_turn(engine: TargetEngine) -> list[int]:
    """A session that scores PROMPT and three drafts, then ends; returns the tokens it emitted."""
    engine.open("turn-1", SamplingParams())
    tokens = engine.verify("turn-1", 0, PROMPT, [5, 6, 7], None).verdict.tokens
    assert engine.release("turn-1")
    return tokens


@pytest.mark.parametrize("runner", ["ragged", "static"])
def test_the_next_turn_takes_the_ended_sessions_cache_and_computes_only_its_new_tokens(runner):
    warm, cold = _engine(runner), _engine(runner, prefix_cache_bytes=0)
    try:
        emitted = _first_turn(warm)
        assert _first_turn(cold) == emitted
        kept = PROMPT + [5, 6, 7]  # the drafts' keys and values are kept too, rejected or not
        assert warm.report()["kept_tokens"] == len(kept) and len(cold.prefix_cache) == 0
        turn = PROMPT + emitted + [11, 12, 13]
        shared = common_prefix(kept, turn)
        fed = count_fed(warm.runner)
        logits = {}
        for name, engine in (("warm", warm), ("cold", cold)):
            engine.open("turn-2", SamplingParams())
            logits[name] = engine.score("turn-2", 0, turn, [1, 2])  # [3, V]
        assert sum(fed) == len(turn) - shared + 2, f"fed {fed}: only what the kept cache lacks, and the drafts"
        assert torch.equal(logits["warm"], logits["cold"])
        assert len(warm.prefix_cache) == 0, "taken, not copied"
        for name, engine in (("warm", warm), ("cold", cold)):
            engine.release("turn-2")
            engine.open("sampled", SamplingParams(temperature=1.0, seed=3))
            verified = engine.verify("sampled", 0, turn + [4], [8, 9], None, top_logprobs=3)
            logits[name] = (verified.verdict, verified.logprobs, verified.reused)
        assert logits["warm"][:2] == logits["cold"][:2]
        assert logits["warm"][2] == len(turn) and logits["cold"][2] == 0  # turn-2 kept turn + [1, 2]: [1] is not [4]
    finally:
        warm.close(), cold.close()


@pytest.mark.parametrize("runner", ["ragged", "static"])
def test_two_chats_with_one_system_prompt_keep_each_its_own_history(runner):
    """B shares only A's system prompt: it copies that much and leaves A's cache for A's next turn, which takes
    it. Every score equals an engine's that keeps nothing."""
    warm, cold = _engine(runner, slots=6), _engine(runner, slots=6, prefix_cache_bytes=0)
    chat_a, chat_b = PROMPT + list(range(100, 130)), PROMPT + list(range(200, 230))
    try:
        scores, reused = {}, []
        for name, engine in (("warm", warm), ("cold", cold)):
            engine.open("a-1", SamplingParams())
            emitted = engine.verify("a-1", 0, chat_a, [5, 6], None).verdict.tokens
            engine.release("a-1")
            engine.open("b-1", SamplingParams())
            first_b = engine.score("b-1", 0, chat_b, [7])
            engine.release("b-1")
            engine.open("a-2", SamplingParams())
            fed = count_fed(engine.runner)
            turn = chat_a + emitted + [11, 12]
            scores[name] = (first_b, engine.score("a-2", 0, turn, [1, 2]))
            reused.append((len(engine.prefix_cache), sum(fed), len(turn)))
        assert all(torch.equal(w, c) for w, c in zip(scores["warm"], scores["cold"], strict=True))
        (kept, fed, length), (_, cold_fed, _) = reused
        assert kept == 1, "a-2 took a-1's cache; b-1's is kept"
        assert fed == len(emitted) + 2 + 2 < cold_fed == length + 2, f"fed {fed}: only what follows a-1's prompt"
    finally:
        warm.close(), cold.close()


def test_a_prefix_shorter_than_the_minimum_is_computed():
    engine = _engine()
    try:
        _first_turn(engine)
        engine.open("other", SamplingParams())
        fed = count_fed(engine.runner)
        other = PROMPT[:REUSE_MIN_TOKENS - 1] + [1, 2, 3]
        assert engine.verify("other", 0, other, [], None).reused == 0
        assert sum(fed) == len(other) and len(engine.prefix_cache) == 1
    finally:
        engine.close()


def test_a_full_kv_pool_takes_its_slots_back_from_kept_caches():
    engine = _engine("static", slots=2)
    try:
        for name in ("a", "b"):
            engine.open(name, SamplingParams())
            engine.verify(name, 0, [ord(name)] + PROMPT, [], None)  # prompts that share nothing
            engine.release(name)
        assert len(engine.prefix_cache) == 2 and engine.runner.pool.free_slots == 0
        engine.open("c", SamplingParams())
        engine.open("d", SamplingParams())
        assert len(engine.prefix_cache) == 0
        with pytest.raises(ResourceExhausted):
            engine.open("e", SamplingParams())  # the cap on live sessions is what it was
    finally:
        engine.close()


def test_a_cache_a_round_still_writes_to_is_dropped_not_kept():
    """A stream cancelled mid-round releases its session while the round holds it."""
    engine = _engine()
    try:
        engine.open("busy", SamplingParams())
        engine.verify("busy", 0, PROMPT, [], None)
        session = engine._sessions.get("busy")
        holding, done = threading.Event(), threading.Event()

        def round_in_flight():
            with session.lock:
                holding.set()
                done.wait(10)

        thread = threading.Thread(target=round_in_flight)
        thread.start()
        holding.wait(10)
        assert engine.release("busy")
        done.set()
        thread.join()
        assert len(engine.prefix_cache) == 0
    finally:
        engine.close()


def test_only_sessions_of_the_same_cache_salt_share():
    """A tenant's salt: its sessions take and copy only their own tenant's caches, kept or live."""
    engine = _engine(slots=8)
    try:
        _first_turn(engine)  # unsalted, kept
        engine.open("a-1", SamplingParams(cache_salt="tenant-a"))
        assert engine.verify("a-1", 0, PROMPT + [1], [], None).reused == 0, "not the unsalted kept cache"
        engine.open("b-1", SamplingParams(cache_salt="tenant-b"))
        assert engine.verify("b-1", 0, PROMPT + [2], [], None).reused == 0, "nor tenant a's live one"
        engine.open("a-2", SamplingParams(cache_salt="tenant-a"))
        assert engine.verify("a-2", 0, PROMPT + [3], [], None).reused == len(PROMPT), "a copy of a-1's"
        engine.release("a-1")
        engine.open("a-3", SamplingParams(cache_salt="tenant-a"))
        assert engine.verify("a-3", 0, PROMPT + [1, 4], [], None).reused == len(PROMPT) + 1, "a-1's, kept"
        engine.open("plain", SamplingParams())
        assert engine.verify("plain", 0, PROMPT + [4], [], None).reused == len(PROMPT), "turn-1's, kept"
    finally:
        engine.close()


def test_a_salted_session_neither_reads_nor_feeds_the_shared_lookup_memory():
    from specdec.engine.lookup_engine import LookupEngine

    engine = LookupEngine(memory_tokens=1000)
    remembered, secret = list(range(100, 120)), list(range(200, 220))
    for session_id, tokens, salt in (("plain", remembered, ""), ("salted", secret, "tenant")):
        engine.open(session_id, SamplingParams(cache_salt=salt))
        engine.propose(session_id, 0, tokens, 4)
        engine.release(session_id)
    for session_id, tokens, salt, want in (("reads", [104, 105, 106], "", [107, 108, 109, 110]),
                                            ("salted-reads", [104, 105, 106], "tenant", []),
                                            ("secret", [204, 205, 206], "", [])):
        engine.open(session_id, SamplingParams(cache_salt=salt))
        assert engine.propose(session_id, 0, tokens, 4).tokens == want, session_id


def test_nothing_is_kept_where_the_path_is_not_row_invariant():
    loaded = load_model(TINY_TARGET, "cpu")
    loaded = dataclasses.replace(loaded, choice=dataclasses.replace(loaded.choice, row_invariant=False))
    engine = TargetEngine(loaded)
    try:
        _first_turn(engine)
        assert len(engine.prefix_cache) == 0
    finally:
        engine.close()


# -- through the services ------------------------------------------------------------------


@pytest.fixture(scope="module")
def cold():
    """A tiny stack whose services keep nothing: every prompt computed."""
    options = tiny_options()
    with EmbeddedStack(dataclasses.replace(options, service=dataclasses.replace(options.service,
                                                                                prefix_cache_mb=0))) as running:
        yield running


def test_a_chats_next_turn_reports_its_cached_prompt_and_gives_the_cold_output(stack, cold):
    """Turn 1, then turn 2 (turn 1's prompt and reply, then more) on the shared stack, which keeps caches, and
    on one that keeps none: the same tokens and log-probabilities, greedy under speculation and sampled."""
    first = PROMPT[::-1]
    for request in ({"gamma": 3, "top_logprobs": 2}, {"temperature": 1.0, "seed": 11, "gamma": 2}):
        results = {}
        for name, running in (("cold", cold), ("warm", stack)):
            one = generate(running.endpoint, make_request(prompt_token_ids=first, max_new_tokens=12, **request))
            second = first + list(one.token_ids) + [40, 41, 42]
            two = generate(running.endpoint, make_request(prompt_token_ids=second, max_new_tokens=12, **request))
            results[name] = (one.token_ids, one.logprobs, two.token_ids, two.logprobs, two.stats)
        assert results["warm"][:4] == results["cold"][:4]
        assert results["cold"][4]["cached_prompt_tokens"] == 0
        assert results["warm"][4]["cached_prompt_tokens"] >= len(first) + 11, "turn 1's prompt and reply"
        first = first[1:] + [0]  # the sampled pass starts afresh


def test_six_concurrent_chats_with_one_system_prompt_give_the_cold_outputs(stack, cold):
    """Six users at once, three turns each, all after one system prompt, some with n = 2 or a salt: kept and
    live caches taken, copied and evicted beside each other's rounds, every reply the one computed cold."""
    system = [(11 * i + 5) % 250 for i in range(30)]

    def chat(endpoint: str, user: int) -> list[list[int]]:
        history, replies = system + [(user * 37 + i) % 250 for i in range(20)], []  # more than a round's drafts
        for turn in range(3):
            greedy = user % 2 == 1  # adaptive γ only there: a sampled run is reproducible at a fixed γ
            gamma = (None if greedy else 3, 2, 0)[(user + turn) % 3]
            request = make_request(prompt_token_ids=history, max_new_tokens=6, gamma=gamma,
                                   temperature=0.0 if greedy else 1.0, seed=user)
            request.cache_salt = "salted" if user == 5 else ""
            tokens = [t for t, _, _ in choices(endpoint, request, 2 if user == 4 and turn == 1 else 1)]
            replies.append(tokens)
            history = history + tokens[0] + [100 + turn, user]
        return replies

    want = [chat(cold.endpoint, user) for user in range(6)]
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda user: chat(stack.endpoint, user), range(6)))
    assert got == want


def test_an_overlong_cache_salt_is_invalid_argument(stack):
    request = make_request(prompt="x", max_new_tokens=2)
    request.cache_salt = "s" * (MAX_CACHE_SALT + 1)
    with pytest.raises(grpc.RpcError) as caught:
        generate(stack.endpoint, request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "cache_salt" in caught.value.details()
