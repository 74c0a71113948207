"""The draft model's side of one generation: the replica it drafts on, its session there, what that replica
keeps of the sequence, its failures, and the branch it drafts during a verify.

A failed draft never changes the output (the target alone decides every token): the generation goes on
target-only, and the pool gives it a replica again, another one at once or the same one after `retry_s`.
"""

from __future__ import annotations

import logging
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
        return len(committed) - max(self.session.synced, self.kept) + 1

    def propose(self, gamma: int, committed: list[int], span: Span) -> DraftReply:
        """The draft's proposal; after a failure, none: the round is a target-only step."""
        draft_s = self.controller.draft_time(self.session.unsynced(committed) + 1, gamma)
        try:
            proposal = self.session.propose(committed, gamma, self._confidence(), span, self.round_timeout.of(draft_s))
        except grpc.RpcError as exc:
            self.failed(exc)
            return NO_DRAFTS
        self.replica, self.reused = self.session.client.address, max(self.reused, proposal.reused)
        return proposal

    def prefetch(self, committed: list[int], proposal: list[int], gamma: int, span: Span) -> None:
        """Send the next round's branch after the draft's own `proposal`: the draft's guess of the bonus
        token, then γ drafts after it (this round's γ, within what the next round can still use)."""
        if gamma < 1 or not self.usable():
            return
        gamma = min(gamma, self.pool.gamma_max(self.session.client) - 1)
        if gamma < 1:
            return
        timeout = self.round_timeout.of(self.controller.draft_time(len(proposal) + 1, gamma + 1))
        self.branch = self.session.prefetch(committed, proposal, gamma, self._confidence(), span, timeout)

    def prefetched(self, committed: list[int]) -> DraftReply | None:
        """The proposal the last round's branch drafted, if the committed tokens are what it assumed;
        None otherwise (no branch, a miss, or a failed draft: the round drafts as usual). A branch is
        always collected, hit or miss: its reply comes before any later call's on the stream."""
        branch, self.branch = self.branch, None
        if branch is None:
            return None
        try:
            proposal, guess = self.session.collect(branch)
        except grpc.RpcError as exc:
            self.failed(exc)
            return None
        guessed = branch.guessed(committed, guess)
        self.controller.observe_branch(len(proposal.tokens) + 1, proposal.hop.compute_s, guessed, proposal.hop.load)
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

    def finish(self, committed: list[int], salt: str) -> None:
        """The generation is over: end the session, hand the replica back, and remember it as the one that keeps
        this sequence's draft KV (as far as the draft was sent it)."""
        if self.branch is not None:  # drafted for a round that never came
            self.branch.span.end()
        self.session.close()
        self.pool.release(self.session.client)
        if self.replica:
            self.pool.remember(salt, committed[:self.session.synced], self.replica)

    def _confidence(self) -> float:
        """The early stop of a draft under adaptive γ (`GammaController.confidence_threshold`); 0 under a fixed γ."""
        return self.controller.confidence_threshold() if self.adaptive else 0.0
