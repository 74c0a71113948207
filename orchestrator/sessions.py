"""This generation's sessions on the draft and the target service: one stream each.

A session knows what its service holds: `synced`, the length of the committed prefix the service
has confirmed. Every call sends the committed tokens past it (a `Commit`), so the service crops
its KV cache to the committed prefix and extends from there. After a failure, `reset` opens a
fresh session under a new id, which is sent everything committed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from orchestrator.clients import PendingCall, ServiceClient, SessionStream
from protos import specdec_pb2 as pb
from specdec.core.rounds import PassLoad, network_s
from specdec.runtime import telemetry
from specdec.runtime.wire import logprob_request_to_pb, pass_load_from_pb, probs_rows


@dataclass(frozen=True)
class Hop:
    """One call as the orchestrator saw it: wall time, and the compute and load the service reported."""

    wall_s: float = 0.0
    compute_s: float = 0.0
    load: PassLoad = PassLoad()


def _hop(reply, wall_s: float) -> Hop:
    return Hop(wall_s, reply.compute_ns / 1e9, pass_load_from_pb(reply.load))


@dataclass(frozen=True)
class DraftReply:
    """Draft tokens as they came over the wire (or from a lookup, with no q and no hop)."""

    tokens: list[int]
    probs: pb.DraftProbs
    hop: Hop
    reused: int = 0  # positions the replica took from another session's cache (DraftProposal.reused_tokens)


NO_DRAFTS = DraftReply([], pb.DraftProbs(none=True), Hop())


@dataclass(frozen=True)
class VerifyReply:
    """The target's verdict as it came over the wire."""

    tokens: list[int]  # accepted drafts + one recovered or bonus token (+ the extra steps' tokens)
    accepted: int
    hop: Hop
    logprobs: list[pb.TokenLogprob] = ()  # one per token, when asked for
    passes: int = 1  # the verify and the target-only steps after it
    reused: int = 0  # positions the target took from another session's cache (a shared prefix)
    prompt_logprobs: list[pb.TokenLogprob] = ()  # the committed tokens' from position 1, when asked for


@dataclass
class ServiceSession:
    client: ServiceClient | None  # None: no replica at hand (a draft session only)
    session_id: str
    sampling: pb.SamplingParams
    stream: SessionStream | None = None
    synced: int = 0
    restarts: int = 0

    @property
    def opened(self) -> bool:
        """The service holds this session (a prompt is never empty, so a confirmed one has tokens)."""
        return self.synced > 0

    def unsynced(self, committed: list[int]) -> int:
        """Committed tokens the service has not seen yet."""
        return len(committed) - self.synced

    def _prepare(self, request, sent: list[int]) -> None:
        """Fill in the session, its opening on a first call, and the commit of `sent` past `synced`."""
        request.session_id, request.open = self.session_id, not self.opened
        if request.open:
            request.sampling.CopyFrom(self.sampling)
        request.commit.CopyFrom(pb.Commit(start=self.synced, tokens=sent[self.synced:]))
        if self.stream is None:
            self.stream = self.client.open_stream()

    def _call(self, name: str, request, committed: list[int], span: Span, timeout: float):
        """Send `request` (with the commit and, on a first call, the session's opening) and wait
        for its reply, inside a client span that the service's compute span continues."""
        self._prepare(request, committed)
        if not telemetry.tracing_enabled():
            reply, wall = self.stream.call(request, timeout)
        else:
            with telemetry.span(name, kind=SpanKind.CLIENT) as hop_span:
                if hop_span.is_recording():
                    telemetry.inject(request.trace_context)
                reply, wall = self.stream.call(request, timeout)
                if hop_span.is_recording():
                    sent, received, service = request.ByteSize(), reply.ByteSize(), name.split(".")[0]
                    hop_span.set_attributes({
                        "specdec.bytes_sent": sent, "specdec.bytes_received": received,
                        "specdec.network_ms": 1e3 * network_s(wall, reply.compute_ns / 1e9),
                        "specdec.rollback_ms": reply.rollback_ns / 1e6,
                        "specdec.forward_ms": reply.load.forward_ns / 1e6, "specdec.wait_ms": reply.load.wait_ns / 1e6})
                    span.set_attributes({f"specdec.{service}.bytes_sent": sent,
                                         f"specdec.{service}.bytes_received": received})
        self.synced = len(committed)
        return reply, _hop(reply, wall)

    def reset(self) -> None:
        """Drop the stream; the next call opens a fresh session that is sent everything committed."""
        self.close()
        self.stream, self.synced = None, 0
        self.restarts += 1
        self.session_id = f"{self.session_id.split('~')[0]}~{self.restarts}"

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()


@dataclass(frozen=True)
class Branch:
    """The next round, drafted while the target verifies this one (`DraftSession.prefetch`). It
    assumes a verdict that accepts every proposed token and whose bonus token is the draft's own
    guess, the branch's first token."""

    base: int  # committed length when it was sent
    proposal: tuple[int, ...]
    pending: PendingCall
    deadline: float  # time.monotonic() by which its reply is due
    span: Span = trace.INVALID_SPAN  # "draft.prefetch", from the send to the reply (when tracing)
    due: float | None = None  # fed ahead (`Drafting.feed_ahead`): when its reply is expected (time.monotonic())

    @property
    def ahead(self) -> bool:
        """Sent beside the prompt's round: it feeds the draft the prompt first, and is not waited for."""
        return self.due is not None

    def guessed(self, committed: list[int], guess: int | None) -> bool | None:
        """None if the verdict rejected a proposed token; else whether the committed tokens are exactly
        what the branch assumed (the proposal, then the guess: a hit)."""
        end = self.base + len(self.proposal)
        if len(committed) <= end or committed[self.base:end] != list(self.proposal):
            return None
        return committed[end:] == [guess]


class DraftSession(ServiceSession):
    def propose(self, committed: list[int], gamma: int, min_confidence: float, span: Span,
                timeout: float) -> DraftReply:
        reply, hop = self._call("draft.propose", pb.DraftRequest(gamma=gamma, min_confidence=min_confidence),
                                committed, span, timeout)
        return DraftReply(list(reply.tokens), reply.probs, hop, reply.reused_tokens)

    def feed(self, committed: list[int], timeout: float) -> None:
        """Send the committed tokens and have them fed, proposing nothing (γ = 0): a conversation's tokens,
        between its turns."""
        self._call("draft.feed", pb.DraftRequest(gamma=0), committed, trace.INVALID_SPAN, timeout)

    def prefetch(self, committed: list[int], proposal: list[int], gamma: int, min_confidence: float,
                 span: Span, timeout: float, due_s: float | None = None) -> Branch:
        """Ask, without waiting, for γ+1 tokens after `committed + proposal`: a guess of the bonus
        token (the draft's most likely one), then the next round's γ drafts. The service holds
        `proposal` as committed until the next call's commit replaces what the verdict did not keep
        (`specdec.core.sequence`). `due_s`: for a branch fed ahead, when its reply is expected, from now."""
        request = pb.DraftRequest(gamma=gamma + 1, min_confidence=min_confidence, guess_first=True)
        self._prepare(request, [*committed, *proposal])
        hop_span = trace.INVALID_SPAN
        if span.is_recording():  # a client span of the round's, ended when the reply is collected
            hop_span = telemetry.tracer().start_span("draft.prefetch", kind=SpanKind.CLIENT)
            telemetry.inject(request.trace_context, hop_span)
        self.synced = len(committed)
        now = time.monotonic()
        return Branch(len(committed), tuple(proposal), self.stream.send(request), now + timeout, hop_span,
                      None if due_s is None else now + due_s)

    def collect(self, branch: Branch) -> tuple[DraftReply, int | None]:
        """The branch's reply, waited for up to its deadline: (the next round's proposal, the guessed
        bonus token; None when the draft proposed nothing, as a lookup may), the proposal empty when
        the draft stopped after its guess. Raises grpc.RpcError."""
        try:
            reply, wall = branch.pending.result(max(branch.deadline - time.monotonic(), 0.0))
        finally:
            branch.span.end()
        drafted = len(reply.tokens)
        proposal = DraftReply(list(reply.tokens[1:]), probs_rows(reply.probs, drafted, 1, drafted), _hop(reply, wall),
                              reply.reused_tokens)
        return proposal, reply.tokens[0] if drafted else None


class TargetSession(ServiceSession):
    def verify(self, committed: list[int], proposal: DraftReply, span: Span, timeout: float,
               top_logprobs: int | None = None, extra_steps: int = 0,
               stop_ids: frozenset[int] = frozenset(), prompt_top: int | None = None) -> VerifyReply:
        """`top_logprobs`: None, or ask for each token's log-probability with that many alternatives;
        `prompt_top` the same for the committed tokens (the session's first call: its prompt).
        `extra_steps`: target-only steps after the verdict in the same call, ending after a token in
        `stop_ids` (`specdec.engine.continuation`)."""
        request = pb.VerifyRequest(draft_tokens=proposal.tokens, draft_probs=proposal.probs,
                                   extra_steps=extra_steps, stop_ids=sorted(stop_ids) if extra_steps else (),
                                   **logprob_request_to_pb(top_logprobs, prompt_top))
        reply, hop = self._call("target.verify", request, committed, span, timeout)
        return VerifyReply(list(reply.tokens), reply.num_accepted, hop, list(reply.logprobs), 1 + reply.extra_passes,
                           reply.reused_tokens, list(reply.prompt_logprobs))
