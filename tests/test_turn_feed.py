"""After a reply, its draft is fed what it has not seen of the conversation (`Drafting.finish`) while the
orchestrator runs nothing else, so that the next turn's draft takes it from its replica's cache; and a draft
call of γ = 0, which that feed is made of, feeds without proposing."""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import TINY_DRAFT, count_fed, holds_for, slow_target_stack, tiny_options, wait_until

from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from orchestrator.activity import Activity
from orchestrator.drafting import Drafting
from specdec.cli.client import generate, make_request
from specdec.core.params import SamplingParams
from specdec.engine.draft_engine import DraftEngine
from specdec.engine.models import load_model
from specdec.launch.stack import EmbeddedStack
from specdec.runtime.security import open_channel
from specdec.runtime.server import CHANNEL_OPTIONS

PROMPT = [(11 * i + 5) % 250 for i in range(80)]  # no other test's prompt starts like this


def test_a_draft_call_of_gamma_0_feeds_the_commit_but_its_last_token_and_proposes_nothing():
    """Fed in two pieces, then drafting: the same proposal and q, bit for bit, as a session that feeds it all at
    once; the γ = 0 calls feed every committed token but the last, whose logits start the next round."""
    sampled = SamplingParams(temperature=1.0, seed=3)
    with DraftEngine(load_model(TINY_DRAFT, "cpu")) as pieces, DraftEngine(load_model(TINY_DRAFT, "cpu")) as whole:
        fed = count_fed(pieces.runner)
        pieces.open("s", sampled)
        first = pieces.propose("s", 0, PROMPT[:50], 0)
        assert first.tokens == [] and first.probs is None and sum(fed) == 49
        pieces.propose("s", 50, PROMPT[50:], 0)
        assert sum(fed) == 79
        fed.clear()
        drafted = pieces.propose("s", 80, [3], 4)
        assert fed[0] == 2, "the prompt's last token and the new one"
        whole.open("s", sampled)
        reference = whole.propose("s", 0, [*PROMPT, 3], 4)
    assert drafted.tokens == reference.tokens and torch.equal(drafted.probs, reference.probs)


@pytest.fixture
def feeds(monkeypatch) -> list:
    """Each feed after a reply (`Drafting._feed_between_turns`, in this process with the embedded orchestrator),
    appended once it has ended: the tokens its draft session was sent."""
    ended, feed = [], Drafting._feed_between_turns

    def spy(self, committed, salt, quiet):
        try:
            feed(self, committed, salt, quiet)
        finally:
            ended.append(self.session.synced)

    monkeypatch.setattr(Drafting, "_feed_between_turns", spy)
    return ended


def test_a_feed_is_allowed_while_nothing_else_runs_or_apart_and_never_while_the_server_stops():
    activity, stopping = Activity(), threading.Event()
    activity.stopping = stopping.is_set
    assert activity.allows_feed(apart=False)
    activity.begin()
    assert not activity.allows_feed(apart=False) and activity.allows_feed(apart=True)
    activity.end()
    stopping.set()
    assert not activity.allows_feed(apart=False) and not activity.allows_feed(apart=True)


def _kept_tokens(address: str) -> int:
    """Draft KV of ended sessions the replica at `address` keeps (`RankReport.kept_tokens`)."""
    with open_channel(address, CHANNEL_OPTIONS) as channel:
        return pb_grpc.DraftServiceStub(channel).Info(pb.ModelInfoRequest(), timeout=10).ranks[0].kept_tokens


def _turns(stack: EmbeddedStack, prompt: list[int], feeds: list, fed: bool) -> tuple[object, object]:
    """Turn 1 ends after the prompt's round, which decodes target-only under adaptive γ: its draft is never sent
    the conversation. Then its feed ends (`fed`), or none starts. Turn 2, at a fixed γ, drafts from its first
    round."""
    one = generate(stack.endpoint, make_request(prompt_token_ids=prompt, max_new_tokens=1))
    assert not any(r.drafted for r in one.rounds)
    if fed:
        wait_until(lambda: feeds, 30, "turn 1's feed to end")
    else:
        holds_for(lambda: not feeds, 1.0, "no feed")
    two = generate(stack.endpoint, make_request(prompt_token_ids=prompt + one.token_ids + [3, 4],
                                                max_new_tokens=8, gamma=2))
    return one, two


def test_a_chats_next_turn_takes_the_conversation_its_draft_was_fed_after_the_last_reply(feeds):
    """With the feed (the default), turn 2's draft takes the whole conversation from the replica's cache;
    without it (`feed_between_turns: off`), it computes it."""
    with EmbeddedStack(tiny_options()) as stack:
        _, two = _turns(stack, PROMPT, feeds, fed=True)
    assert feeds[0] == len(PROMPT) + 1, "turn 1's prompt and token, fed after it"
    assert two.stats["draft_cached_tokens"] >= len(PROMPT), "and taken by turn 2's draft"
    feeds.clear()
    with EmbeddedStack(tiny_options(orchestrator=dict(feed_between_turns="off"))) as stack:
        _, two = _turns(stack, PROMPT, feeds, fed=False)
    assert not feeds and two.stats["draft_cached_tokens"] == 0, "never fed: nothing to take"


def test_no_draft_is_fed_after_a_reply_while_another_generation_runs(feeds):
    """A reply ends beside a long target-only generation: its draft is not fed (on these shared cores it would
    slow that generation), and the session closes. Once nothing runs, the next reply's draft is fed."""
    with slow_target_stack() as stack:
        with open_channel(stack.endpoint, CHANNEL_OPTIONS) as channel:
            request = make_request(prompt="keep the target busy", max_new_tokens=400, gamma=0)
            request.ignore_eos = True  # at 40 ms a round, 16 s
            busy = pb_grpc.SpecDecStub(channel).Generate(request, timeout=120)
            next(busy)
            generate(stack.endpoint, make_request(prompt_token_ids=PROMPT, max_new_tokens=1))
            wait_until(lambda: feeds, 30, "the reply's feed to end")
            assert feeds == [0] and _kept_tokens(stack.draft_address) == 0, "nothing fed while the busy one ran"
            busy.cancel()
        later = [(13 * i + 7) % 250 for i in range(60)]
        generate(stack.endpoint, make_request(prompt_token_ids=later, max_new_tokens=1))
        wait_until(lambda: len(feeds) == 2, 30, "the quiet reply's feed to end")
        assert feeds[1] == len(later) + 1 and _kept_tokens(stack.draft_address) >= len(later)
