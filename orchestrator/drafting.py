"""The draft model's side of one generation: the replica it drafts on, its session there, what that replica
keeps of the sequence, its failures, and the branch it drafts during a verify.

A failed draft never changes the output (the target alone decides every token): the generation goes on
target-only, and the pool gives it a replica again, another one at once or the same one after `retry_s`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from opentelemetry.trace import Span

from orchestrator.clients import ServiceClient
from orchestrator.draft_pool import DraftPool
from orchestrator.sessions import NO_DRAFTS, Branch, DraftReply, DraftSession
from specdec.core.text import printable
from specdec.planning.controller import GammaController
from specdec.planning.deadline import RoundTimeout

log = logging.getLogger(__name__)
# After a reply, its draft is fed what it has not seen of the sequence (`Drafting.finish`), so that the
# conversation's next turn finds it in the replica's cache, if at least this many tokens:
TURN_FEED_MIN = 32  # fewer cost the next turn's first drafting round little
TURN_FEED_GRACE_S = 0.2  # it starts after this long: a client's next call without a pause (a benchmark's) comes sooner
TURN_FEED_PIECE_S = 0.1  # in calls of about this much draft compute: a generation that starts meanwhile waits
# for the cores at most this long before the feed stops
# Statuses that blame the request, not the replica that returned them.
CLIENT_FAULTS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE,
                           grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.CANCELLED})


@dataclass
class Drafting:
    session: DraftSession
    pool: DraftPool
    controller: GammaController  # prices the calls' timeouts, learns from branches, plans with the replica's costs
    round_timeout: RoundTimeout
    adaptive: bool  # the request's γ is adaptive: drafts stop early where the draft is unsure
    is_cancelled: Callable[[], bool]
    label: str  # the generation, for the operator's log
    retry_s: float = 2.0  # after a failure, no replica for this long unless another one is at hand
    replica: str = ""  # the address that last drafted for this sequence: where its draft KV is kept
    kept: int = 0  # committed tokens whose draft KV the replica likely keeps from an earlier session
    reused: int = 0  # committed tokens whose draft KV the replica took from a cache (as it said)
    last_drafted: int = 0  # tokens the draft model proposed last round (0 after a lookup's or none)
    branch: Branch | None = None  # the next round, drafting while this one verifies
    _failed_at: float | None = None
    _finishing: bool = False  # the generation ended with a feed under way, left to finish in the background

    def start(self, committed: list[int], salt: str) -> None:
        """Take a replica for a sequence of `committed` tokens: the one that keeps the most of them, if any."""
        self.use(*self.pool.acquire(committed, salt))

    def use(self, client: ServiceClient | None, kept: int = 0) -> None:
        """Route the session to `client` (None: no replica), which likely keeps the draft's KV of the first
        `kept` committed tokens, and plan with that replica's costs."""
        self.session.client, self.kept = client, kept
        self.controller.draft_cost = self.pool.profile(client) if client is not None else None

    def usable(self) -> bool:
        """A replica is at hand, or the pool has one (after a failure: another one at once, else the same one
        again once `retry_s` has passed)."""
        if self.feeding():
            return False
        if self.session.client is not None:
            return True
        now = time.monotonic()
        if self._failed_at is not None and now - self._failed_at < self.retry_s:
            return False
        self.use(*self.pool.acquire())
        if self.session.client is None:
            self._failed_at = now
        return self.session.client is not None

    def unseen(self, committed: list[int]) -> int:
        """Tokens the draft model feeds before it drafts: 1 after a round it drafted (the controller prices the
        steady first pass), else what was committed since it last drafted, and its own last draft; before it
        first drafts, what its replica likely keeps of them (a chat's earlier turn) is not fed."""
        if self.last_drafted > 0:
            return 1
        return len(committed) - self._held() + 1

    def _held(self) -> int:
        """Committed tokens whose draft KV the replica holds: those its session was sent, or at least those it likely
        keeps from an earlier session (a chat's earlier turn)."""
        return max(self.session.synced, self.kept)

    def propose(self, gamma: int, committed: list[int], span: Span) -> DraftReply:
        """The draft's proposal; after a failure, none: the round is a target-only step."""
        draft_s = self.controller.draft_time(self.session.unsynced(committed) + 1, gamma)
        try:
            proposal = self.session.propose(committed, gamma, self._confidence(), span, self.round_timeout.of(draft_s))
        except grpc.RpcError as exc:
            self.failed(exc)
            return NO_DRAFTS
        self._drafted_by_replica(proposal)
        return proposal

    def prefetch(self, committed: list[int], proposal: list[int], gamma: int, span: Span) -> None:
        """Send the next round's branch after the draft's own `proposal`: the draft's guess of the bonus
        token, then γ drafts after it (this round's γ, within what the next round can still use)."""
        gamma = self._branch_gamma(gamma)
        if gamma < 1:
            return
        timeout = self.round_timeout.of(self.controller.draft_time(len(proposal) + 1, gamma + 1))
        self.branch = self.session.prefetch(committed, proposal, gamma, self._confidence(), span, timeout)

    def feed_ahead(self, committed: list[int], gamma: int, span: Span) -> None:
        """Beside the prompt's round (target-only): send the branch the next round would draft, which first feeds
        the draft the prompt, so that the rounds after it draft without a catch-up. It is never waited for: until
        its reply is in (`feeding`), the draft model proposes nothing and the rounds go on without it."""
        gamma = self._branch_gamma(gamma)
        if gamma < 1:
            return
        expected_s = self.controller.draft_time(self.session.unsynced(committed), gamma + 1)
        due_s = (self.controller.rtt_draft.value or 0.0) + (self.controller.contention_draft.value or 1.0) * expected_s
        self.branch = self.session.prefetch(committed, [], gamma, self._confidence(), span,
                                            self.round_timeout.of(expected_s), due_s=due_s)

    def feeding(self) -> bool:
        """A branch fed ahead (`feed_ahead`) is still under way: its reply is not in, and not yet overdue."""
        branch = self.branch
        return branch is not None and branch.ahead and not branch.pending.ready() and \
            time.monotonic() < branch.deadline

    def feed_left_s(self) -> float:
        """Until a feed under way is expected in (0 where none is, or it is late)."""
        return max(self.branch.due - time.monotonic(), 0.0) if self.feeding() else 0.0

    def await_feed(self, patience_s: float, every_s: float = 0.0005) -> bool:
        """Wait up to `patience_s` for a feed under way that is expected in by then (or is late): whether it is
        in (or none is under way). A feed expected later is not waited for."""
        if not self.feeding():
            return True
        if self.feed_left_s() > patience_s:
            return False
        until = time.monotonic() + patience_s
        while self.feeding():
            if time.monotonic() >= until:
                return False
            time.sleep(every_s)
        return True

    def prefetched(self, committed: list[int]) -> DraftReply | None:
        """The proposal the last round's branch drafted, if the committed tokens are what it assumed;
        None otherwise (no branch, a miss, or a failed draft: the round drafts as usual; a branch fed ahead
        and still `feeding`: the round goes on without the draft model). A branch is always collected, hit or
        miss: its reply comes before any later call's on the stream."""
        if self.branch is None or self.feeding():
            return None
        branch, self.branch = self.branch, None
        try:
            proposal, guess = self.session.collect(branch)
        except grpc.RpcError as exc:
            self.failed(exc)
            return None
        guessed = branch.guessed(committed, guess)
        if branch.ahead:  # its compute is mostly the prompt's feed: no slowdown to learn
            self._drafted_by_replica(proposal)
        else:
            self.controller.observe_branch(len(proposal.tokens) + 1, proposal.hop.compute_s, guessed,
                                           proposal.hop.load)
        if not proposal.tokens or not guessed:
            return None
        self.replica = self.session.client.address
        return proposal

    def failed(self, exc: grpc.RpcError) -> None:
        """Go on target-only; the output cannot change, since the target alone decides every token.

        A replica that is down, hung or broken is skipped by the pool for a while; one that refused
        this session's request (a client's bad input) stays in service for everyone else.
        """
        if self.is_cancelled():  # the generation's own `abort` ended the stream, not the replica: the call is over
            raise exc
        code, client = exc.code(), self.session.client
        log.warning("session %s: draft %s failed (%s: %s); decoding target-only until a replica is back",
                    self.label, client.address, code.name, printable(exc.details()))
        if code not in CLIENT_FAULTS:
            self.pool.failed(client)
        self.pool.release(client)
        self.session.reset()
        self.branch = None  # its stream is gone
        self.use(None)  # the next round asks the pool again, which may pick another replica

    def abort(self) -> None:
        """End the draft's session now, from any thread (the client is gone), unless its generation has ended
        and left a feed to finish (`finish`)."""
        if not self._finishing:
            self.session.close()

    def finish(self, committed: list[int], salt: str, quiet: Callable[[], bool] | None = None) -> None:
        """The generation is over: end the session, hand the replica back, and remember it as the one that keeps
        this sequence's draft KV (as far as the draft was sent it). A feed ahead still under way ends first, in
        the background, so that the replica keeps the prompt for the conversation's next turn.

        `quiet` (a reply that ended as asked; None: none): then, in the background, the draft is fed what it has
        not seen of the sequence, at least TURN_FEED_MIN tokens, in calls of about TURN_FEED_PIECE_S while
        `quiet()` says the draft's compute slows no one (nothing else runs, or it runs apart), so that the next
        turn finds the conversation in the replica's cache and drafts without a catch-up."""
        if self.feeding():
            self._finishing = True
            threading.Thread(target=self._finish_feed, args=(self.branch, committed, salt, quiet), daemon=True,
                             name="draft-feed").start()
            return
        if quiet is not None and self._worth_feeding(committed):
            self._finishing = True
            self.pool.release(self.session.client)  # the feed gives way to any session: it is no load to route by
            threading.Thread(target=self._feed_between_turns, args=(committed, salt, quiet), daemon=True,
                             name="draft-turn-feed").start()
            return
        if self.branch is not None:  # drafted for a round that never came
            self.branch.span.end()
        self.pool.release(self.session.client)
        self._close(committed, salt)

    def _close(self, committed: list[int], salt: str) -> None:
        self.session.close()
        if self.replica:
            self.pool.remember(salt, committed[:self.session.synced], self.replica)

    def _finish_feed(self, branch: Branch, committed: list[int], salt: str,
                     quiet: Callable[[], bool] | None) -> None:
        try:
            proposal, _ = self.session.collect(branch)
            self._drafted_by_replica(proposal)
        except grpc.RpcError as exc:
            log.info("session %s: the draft's feed ahead ended unfinished (%s)", self.label, exc.code().name)
        self.branch = None
        self.finish(committed, salt, quiet)

    def _worth_feeding(self, committed: list[int]) -> bool:
        """A model replica serves the session, and it has not seen TURN_FEED_MIN or more of the tokens."""
        return self.session.client is not None and self.controller.draft_cost is not None and \
            len(committed) - self._held() >= TURN_FEED_MIN

    def _feed_between_turns(self, committed: list[int], salt: str, quiet: Callable[[], bool]) -> None:
        """`finish`'s feed: what the draft has not seen of `committed`, piece by piece while `quiet()`; then close."""
        began, fed = time.monotonic(), 0
        try:
            if self.branch is not None:  # drafted for a round that never came: its reply comes first on the stream
                branch, self.branch = self.branch, None
                self.session.collect(branch)
            time.sleep(TURN_FEED_GRACE_S)
            piece = self._turn_piece()
            while self.session.unsynced(committed) > 0 and quiet():
                # The first call opens the session with what the replica keeps (an earlier turn's), which it takes.
                base = self._held()
                sent = committed[:base + piece]
                expected_s = self.controller.draft_time(len(sent) - base, 1)
                self.session.feed(sent, self.round_timeout.of(expected_s))
                self.replica, fed = self.session.client.address, fed + len(sent) - base
                # Routed now, not once the feed ends: a turn that comes meanwhile finds it (its start stops the feed).
                self.pool.remember(salt, sent, self.replica)
            left = self.session.unsynced(committed)
            log.log(logging.INFO if fed else logging.DEBUG, "session %s: fed its draft %d tokens after the reply in "
                    "%.2f s%s", self.label, fed, time.monotonic() - began,
                    f", stopped {left} short: another generation started" if left else "")
        except grpc.RpcError as exc:
            log.info("session %s: the draft's feed after the reply ended unfinished (%s)", self.label,
                     exc.code().name)
        finally:
            self._close(committed, salt)

    def _turn_piece(self) -> int:
        """Tokens a call of `_feed_between_turns` sends: about TURN_FEED_PIECE_S of draft compute, 16 to 256."""
        per_token_s = self.controller.draft_time(64, 1) / 64
        return int(min(max(TURN_FEED_PIECE_S / per_token_s, 16), 256)) if per_token_s > 0 else 64

    def _branch_gamma(self, gamma: int) -> int:
        """γ for a branch (its guess comes first), within what the replica drafts in one call; 0 where no branch is
        to be sent (γ < 1, or no replica at hand)."""
        if gamma < 1 or not self.usable():
            return 0
        return max(min(gamma, self.pool.gamma_max(self.session.client) - 1), 0)

    def _drafted_by_replica(self, proposal: DraftReply) -> None:
        """The session's replica answered a call: it keeps the sequence's draft KV, and `proposal.reused` of its
        positions came from its cache."""
        self.replica, self.reused = self.session.client.address, max(self.reused, proposal.reused)

    def _confidence(self) -> float:
        """The early stop of a draft under adaptive γ (`GammaController.confidence_threshold`); 0 under a fixed γ."""
        return self.controller.confidence_threshold() if self.adaptive else 0.0
