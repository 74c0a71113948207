"""A draft's feed ahead (`Drafting.feed_ahead`), on a fake draft stream whose reply lands when the test says: never
waited for past a target step, collected once in, a hit where the committed tokens are what it guessed, and left to
finish after its generation ends so that the replica keeps the prompt. Through the services: tests/test_overlap.py."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from opentelemetry import trace

from orchestrator.clients import StreamError
from orchestrator.drafting import Drafting
from orchestrator.sessions import DraftSession
from protos import specdec_pb2 as pb
from specdec.planning.controller import GammaController
from specdec.planning.cost import CostProfile
from specdec.planning.deadline import RoundTimeout
from specdec.planning.prior import SharedPrior

PROMPT = list(range(100, 140))
GUESS, DRAFTS = 7, [8, 9, 10]


class Reply:
    """A call in flight (`PendingCall`'s interface) whose reply lands on `land()`."""

    def __init__(self):
        self.landed = threading.Event()

    def land(self) -> None:
        self.landed.set()

    def ready(self) -> bool:
        return self.landed.is_set()

    def result(self, timeout: float | None = None):
        if not self.landed.wait(timeout):
            raise StreamError(grpc.StatusCode.DEADLINE_EXCEEDED, "no reply")
        tokens = [GUESS, *DRAFTS]
        return pb.DraftProposal(tokens=tokens, probs=pb.DraftProbs(none=True), reused_tokens=3), 0.01


class Stream:
    def __init__(self):
        self.sent: list[pb.DraftRequest] = []
        self.replies: list[Reply] = []
        self.closed = False

    def send(self, request) -> Reply:
        self.sent.append(request)
        self.replies.append(Reply())
        return self.replies[-1]

    def close(self) -> None:
        self.closed = True


class Replica:
    address = "draft-0"

    def __init__(self):
        self.stream = Stream()

    def open_stream(self) -> Stream:
        return self.stream


class Pool:
    def __init__(self):
        self.remembered: list[tuple[str, list[int], str]] = []
        self.released = 0

    def profile(self, client):
        # A pass priced at a second, so a feed is due seconds away: at 1 ms, two busy loops and the suite on 2 cores
        # once delayed a test's next line past the feed's due time, and it read as late.
        return CostProfile((1.0,) * 9)

    def gamma_max(self, client) -> int:
        return 8

    def release(self, client) -> None:
        self.released += 1

    def remember(self, salt: str, tokens, address: str) -> None:
        self.remembered.append((salt, list(tokens), address))


@pytest.fixture
def drafting() -> Drafting:
    controller = GammaController(8, CostProfile((0.01,) * 9))
    pool, replica = Pool(), Replica()
    drafting = Drafting(DraftSession(None, "s", pb.SamplingParams()), pool, controller, RoundTimeout(), True,
                        lambda: False, "s")
    drafting.use(replica)
    return drafting


def stream(drafting: Drafting) -> Stream:
    return drafting.session.client.stream


def test_a_feed_is_not_waited_for_and_its_reply_is_a_hit_where_its_guess_was_committed(drafting):
    drafting.feed_ahead(PROMPT, 3, trace.INVALID_SPAN)
    (request,) = stream(drafting).sent
    assert request.open and list(request.commit.tokens) == PROMPT and request.guess_first and request.gamma == 4
    assert drafting.feeding() and not drafting.usable()
    assert drafting.prefetched([*PROMPT, GUESS]) is None and drafting.branch is not None, "not waited for"
    stream(drafting).replies[0].land()
    assert not drafting.feeding() and drafting.usable()
    proposal = drafting.prefetched([*PROMPT, GUESS])
    assert proposal.tokens == DRAFTS and drafting.branch is None
    assert (drafting.replica, drafting.reused) == ("draft-0", 3)


def test_a_feed_in_after_more_was_committed_is_a_miss_that_leaves_the_prompt_fed(drafting):
    drafting.feed_ahead(PROMPT, 3, trace.INVALID_SPAN)
    stream(drafting).replies[0].land()
    committed = [*PROMPT, GUESS, 1, 2]  # rounds went on without the draft: the guess was right, but long ago
    assert drafting.prefetched(committed) is None and drafting.branch is None
    assert drafting.unseen(committed) == 4, "the tokens past the prompt and the draft's own last one"


def test_a_round_waits_a_step_for_a_feed_due_by_then_never_for_one_due_later(drafting):
    drafting.feed_ahead(PROMPT, 3, trace.INVALID_SPAN)
    reply = stream(drafting).replies[0]
    left = drafting.feed_left_s()
    assert left > 0
    began = time.monotonic()
    assert not drafting.await_feed(left / 10) and time.monotonic() - began < left / 10, "due later: no wait"
    threading.Timer(0.05, reply.land).start()
    assert drafting.await_feed(left + 5.0), "due by then: waited for"
    assert not drafting.feeding()


def test_a_reply_that_ends_while_the_draft_feeds_leaves_the_feed_to_finish(drafting):
    pool = drafting.pool
    drafting.feed_ahead(PROMPT, 3, trace.INVALID_SPAN)
    drafting.finish([*PROMPT, 1, 2], salt="chat")
    assert not stream(drafting).closed and pool.released == 0 and not pool.remembered, "the feed goes on"
    stream(drafting).replies[0].land()
    deadline = time.monotonic() + 10
    while not stream(drafting).closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stream(drafting).closed and pool.released == 1
    assert pool.remembered == [("chat", PROMPT, "draft-0")], "the replica keeps the prompt it was fed"


def test_the_draft_runs_apart_only_where_both_slowdowns_were_measured_small():
    """`runs_apart`: the target's slowdown beside the draft, for as long as the draft's feed runs, at most half the
    feed. Measured on 2 cores of a Zen 5: services pinned a core each 1.01-1.21 and 1.13-1.36; sharing them, the
    draft 5.3 and the target never measured (no verify overlaps there)."""
    def apart(**kappas) -> bool:
        ctl = GammaController(8, CostProfile((0.03,) * 9), CostProfile((0.01,) * 9))
        for name, value in kappas.items():
            getattr(ctl, name).update(value)
        return ctl.runs_apart()

    assert not apart(), "unmeasured: not apart"
    assert not apart(contention_draft=5.3), "the target's slowdown unmeasured"
    assert apart(contention_target=1.07, contention_draft=1.25) and apart(contention_target=1.21, contention_draft=1.36)
    assert not apart(contention_target=1.8, contention_draft=2.0)
    assert apart(contention_target=1.4, contention_draft=1.25) and not apart(contention_target=1.45,
                                                                              contention_draft=1.25)


def test_a_feed_is_handed_on_a_measured_slowdown():
    """A session's measured κ reach the next sessions (`SharedPrior`), so every session after the first that
    overlapped may feed ahead from its prompt's round."""
    prior, profile = SharedPrior(8), CostProfile((0.03,) * 9)
    first = prior.new_controller(profile, CostProfile((0.01,) * 9))
    assert not first.runs_apart()
    first.contention_target.update(1.03)
    first.contention_draft.update(1.2)
    prior.absorb(first)
    assert prior.new_controller(profile, CostProfile((0.01,) * 9)).runs_apart()


def test_steady_best_is_the_gamma_steady_rounds_pay_at():
    ctl = GammaController(8, CostProfile(tuple(0.03 * (1 + 0.02 * s) for s in range(9))), CostProfile((0.003,) * 9))
    ctl.acceptance.prior_alpha, ctl.acceptance.prior_weight = 0.9, 1e6
    assert ctl.steady_best(8) > 1 and ctl.steady_best(1) == 1 and ctl.steady_best(0) == 0
    ctl.acceptance.prior_alpha = 0.05
    assert ctl.steady_best(8) == 0, "a draft that is never accepted: target-only"


def test_a_feed_ahead_is_made_where_this_reply_repays_what_it_costs_the_target():
    """`feed_ahead` prices the feed at what it costs the target's rounds (`feed_share` of its time), spread as a
    catch-up: made for a short prompt, not for a 3,000-token context and a 128-token reply, which only a later
    turn could repay (measured: that feed slowed the target's prefill by about a seventh, the reply's wall time
    1.11x). The start-up profiles of the packaged pair with the services pinned a core each (Zen 5), in ms."""
    draft = CostProfile(tuple(ms / 1e3 for ms in (9.8, 10.5, 13.0, 15.5, 17.4, 21.8, 26.0, 30.6, 32.9)))
    target = CostProfile(tuple(ms / 1e3 for ms in (31.6, 34.7, 42.9, 50.5, 57.1, 69.3, 78.6, 91.7, 97.8)))
    ctl = GammaController(8, target, draft)
    ctl.acceptance.prior_alpha, ctl.acceptance.prior_weight = 0.83, 1e6
    assert ctl.feed_ahead(127, 60) == 0, "unmeasured slowdowns: never"
    ctl.contention_target.update(1.15)
    ctl.contention_draft.update(1.3)
    assert ctl.feed_ahead(127, 60) == ctl.feed_ahead(127, 300) == ctl.steady_best(127) > 0
    assert ctl.feed_ahead(127, 3000) == ctl.feed_ahead(4000, 3000) == 0, "a reply starts out priced as 32 rounds"
    ctl.contention_target.update(3.0)
    assert ctl.feed_ahead(4000, 60) == 0, "services that share cores: never"
