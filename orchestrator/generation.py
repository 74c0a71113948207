"""The speculate/verify loop of one generation.

The orchestrator owns the committed token list. Each round it sends each service the
committed tokens that service has not seen yet (a `Commit` from the length it last
confirmed), so both crop their KV caches to the accepted prefix and extend from there.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterator

import grpc

from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind

from orchestrator.clients import ServiceClient, SessionStream
from orchestrator.draft_pool import DraftPool
from orchestrator.metrics import SpecDecodeMetrics
from protos import specdec_pb2 as pb
from service_runtime import telemetry
from service_runtime.wire import sampling_to_pb
from specdec.controller import GammaController, RoundTiming
from specdec.cost_profile import RoundTimeout
from specdec.sampling import SamplingParams
from specdec.stats import GenerationStats, RoundRecord
from specdec.text import TextStream, printable

log = logging.getLogger(__name__)
# Statuses that blame the request, not the replica that returned them.
CLIENT_FAULTS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE,
                           grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.CANCELLED})


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    max_new_tokens: int
    params: SamplingParams
    gamma: int | None  # None = adaptive
    stop: tuple[str, ...] = ()
    resumed: tuple[int, ...] = ()  # tokens generated before a resume, from the session record
    resume_from: int = 0  # of those, how many the client already holds


@dataclass
class Chunk:
    token_ids: list[int]
    text: str
    round: RoundRecord
    stats: dict | None = None  # the summary, on the last chunk only


@dataclass
class _Peer:
    """A service stream, its session id, and the committed length that service last confirmed."""

    client: ServiceClient | None  # None: no draft replica at hand
    session_id: str
    stream: SessionStream | None = None
    confirmed: int = 0
    opened: bool = False
    restarts: int = 0

    def commit(self, committed: list[int]) -> pb.Commit:
        return pb.Commit(start=self.confirmed, tokens=committed[self.confirmed:])

    def call(self, request, timeout: float | None = None):
        if self.stream is None:
            self.stream = self.client.open_stream()
        reply, wall = self.stream.call(request, timeout)
        self.opened = True
        return reply, wall

    def traced_call(self, name: str, request, round_span: Span, timeout: float | None = None):
        """`call` inside a client span that the service's compute span continues.

        Attributes: bytes each way and the hop's network time (wall minus service compute).
        """
        if not telemetry.tracing_enabled():
            return self.call(request, timeout)
        with telemetry.span(name, kind=SpanKind.CLIENT) as span:
            recording = span.is_recording()
            if recording:
                telemetry.inject(request.trace_context)
            reply, wall = self.call(request, timeout)
            if recording:
                hop = name.split(".")[0]
                sent, received = request.ByteSize(), reply.ByteSize()
                network_ms = max(wall - reply.compute_ns / 1e9, 0.0) * 1e3
                span.set_attributes({"specdec.bytes_sent": sent, "specdec.bytes_received": received,
                                     "specdec.network_ms": network_ms, "specdec.rollback_ms": reply.rollback_ns / 1e6})
                round_span.set_attributes({f"specdec.{hop}.bytes_sent": sent,
                                           f"specdec.{hop}.bytes_received": received})
        return reply, wall

    def reset(self) -> None:
        """Drop the stream; the next call opens a fresh session that is sent everything committed."""
        self.close()
        self.stream, self.confirmed, self.opened = None, 0, False
        self.restarts += 1
        self.session_id = f"{self.session_id.split('~')[0]}~{self.restarts}"

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()


@dataclass
class Generation:
    request: GenerationRequest
    drafts: DraftPool
    target: ServiceClient
    tokenizer: object
    eos_ids: frozenset[int]
    max_context: int
    controller: GammaController
    is_cancelled: Callable[[], bool] = lambda: False
    metrics: SpecDecodeMetrics | None = None
    trace_context: Context | None = None  # the `generate` span's context: parent of every round span
    on_round: Callable[[list[int], str], None] | None = None  # (generated so far, finish reason) after each round
    session_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    round_timeout: RoundTimeout = RoundTimeout()
    draft_retry_s: float = 2.0  # after a draft failure, decode target-only this long before trying again
    _last_drafted: int = 0
    _draft_failed_at: float | None = None
    _draft_replica: str = ""

    def run(self) -> Iterator[Chunk]:
        req = self.request
        committed = [*req.prompt_ids, *req.resumed]
        # Service-side session ids are fresh per run, so a resumed generation never meets its old sessions.
        service_session = f"{self.session_id}-{uuid.uuid4().hex[:8]}"
        draft, target = _Peer(None, service_session), _Peer(self.target, service_session)
        self._use_draft(draft, self.drafts.acquire())
        text = TextStream(self.tokenizer, req.stop)
        text.push(list(req.resumed[:req.resume_from]))  # shown to the client before the resume
        stats = GenerationStats(prompt_tokens=len(req.prompt_ids))
        sampling = sampling_to_pb(req.params)
        began = time.perf_counter()
        generated = len(req.resumed)
        finish = ""
        try:
            replay = list(req.resumed[req.resume_from:])
            if replay:  # committed before the resume but never delivered: not a round of this run
                yield Chunk(replay, text.push(replay), RoundRecord(0, 0, 0, len(replay), 0.0, 0.0, 0.0, 0.0, 0.0))
            while not finish:
                if self.is_cancelled():
                    finish = "cancelled"
                    break
                remaining = req.max_new_tokens - generated
                room = self.max_context - len(committed)
                useful = min(remaining - 1, room)
                gamma = self.controller.choose(useful) if req.gamma is None else max(0, min(req.gamma, useful))
                if gamma > 0 and not self._draft_usable(draft):
                    gamma = 0
                with telemetry.span("round", context=self.trace_context) as span:
                    record, new_tokens = self._round(gamma, committed, draft, target, sampling, span)
                new_tokens = new_tokens[:remaining]
                eos_at = next((i for i, t in enumerate(new_tokens) if t in self.eos_ids), None)
                if eos_at is not None:
                    new_tokens = new_tokens[:eos_at]
                committed.extend(new_tokens)
                generated += len(new_tokens)
                delta = text.push(new_tokens)
                finish = self._finish_reason(eos_at is not None or text.stopped, generated, len(committed))
                record = dataclasses.replace(record, emitted=len(new_tokens))
                stats.rounds.append(record)
                if self.metrics is not None:
                    self.metrics.record(record)
                if self.on_round is not None:
                    self.on_round(committed[len(req.prompt_ids):], finish)
                if finish:
                    delta += text.finish()
                    stats.finish_reason = finish
                    stats.total_s = time.perf_counter() - began
                    summary = {**stats.summary(), "draft_replica": self._draft_replica, "session_id": self.session_id}
                    yield Chunk(new_tokens, delta, record, summary)
                else:
                    yield Chunk(new_tokens, delta, record)
        finally:
            draft.close()
            target.close()
            self.drafts.release(draft.client)
            log.info("session %s finished (%s) after %d tokens", printable(self.session_id), finish or "aborted",
                     generated)

    def _finish_reason(self, stopped: bool, generated: int, length: int) -> str:
        """"stop" (EOS or stop string), "length", "context", or "" to go on."""
        if stopped:
            return "stop"
        if generated >= self.request.max_new_tokens:
            return "length"
        return "context" if length >= self.max_context else ""

    def _round(self, gamma: int, committed: list[int], draft: _Peer, target: _Peer,
               sampling: pb.SamplingParams, span: Span) -> tuple[RoundRecord, list[int]]:
        began = time.perf_counter()
        draft_tokens: list[int] = []
        probs = pb.DraftProbs(none=True)
        draft_wall = draft_compute = 0.0
        draft_load = pb.PassLoad(rows=1.0, sessions=1)
        # The draft is steady when it drafted last round: it then feeds at most two pending tokens.
        draft_steady = self._last_drafted > 0
        if gamma > 0:
            try:
                min_confidence = self.controller.confidence_threshold() if self.request.gamma is None else 0.0
                commit = draft.commit(committed)
                proposal, draft_wall = draft.traced_call("draft.propose", pb.DraftRequest(
                    session_id=draft.session_id, open=not draft.opened, sampling=sampling,
                    commit=commit, gamma=gamma, min_confidence=min_confidence), span,
                    self.round_timeout.of(self.controller.draft_time(len(commit.tokens) + 1, gamma)))
            except grpc.RpcError as exc:
                self._draft_failed(draft, exc)
                gamma = draft_wall = 0
            else:
                draft.confirmed = proposal.committed_len
                self._draft_replica = draft.client.address
                draft_tokens, probs = list(proposal.tokens), proposal.probs
                draft_compute = proposal.compute_ns / 1e9
                draft_load = proposal.load
        self._last_drafted = len(draft_tokens)
        first_target_round = not target.opened
        commit = target.commit(committed)
        result, target_wall = target.traced_call("target.verify", pb.VerifyRequest(
            session_id=target.session_id, open=not target.opened, sampling=sampling,
            commit=commit, draft_tokens=draft_tokens, draft_probs=probs), span,
            self.round_timeout.of(self.controller.target_time(len(commit.tokens) + len(draft_tokens))))
        target.confirmed = result.committed_len
        target_compute = result.compute_ns / 1e9
        if not first_target_round:  # a prefill says nothing about steady-state cost
            self.controller.observe(RoundTiming(
                len(draft_tokens), result.num_accepted, draft_wall, draft_compute, target_wall, target_compute,
                draft_steady, target_sessions=result.load.sessions, target_rows=result.load.rows,
                target_pass_tokens=result.load.tokens, draft_sessions=draft_load.sessions,
                draft_rows=draft_load.rows, draft_pass_tokens=draft_load.tokens))
        record = RoundRecord(gamma=gamma, drafted=len(draft_tokens), accepted=result.num_accepted,
                             emitted=len(result.tokens), wall_s=time.perf_counter() - began,
                             draft_wall_s=draft_wall, draft_compute_s=draft_compute,
                             target_wall_s=target_wall, target_compute_s=target_compute,
                             alpha_estimate=self.controller.acceptance.alpha,
                             cost_ratio_estimate=self.controller.cost_ratio())
        if span.is_recording():
            span.set_attributes({"specdec.gamma": gamma, "specdec.drafted": record.drafted,
                                 "specdec.accepted": record.accepted, "specdec.alpha_estimate": record.alpha_estimate,
                                 "specdec.cost_ratio_estimate": record.cost_ratio_estimate,
                                 "specdec.network.draft_ms": 1e3 * record.rtt_draft_s,
                                 "specdec.network.target_ms": 1e3 * record.rtt_target_s,
                                 "specdec.target.pass_rows": result.load.rows,
                                 "specdec.draft.pass_rows": draft_load.rows})
        log.debug("session %s round γ=%d accepted=%d α̂=%.3f ĉ=%.3f rtt draft %.1f ms target %.1f ms",
                  self.session_id, gamma, result.num_accepted, record.alpha_estimate, record.cost_ratio_estimate,
                  1e3 * record.rtt_draft_s, 1e3 * record.rtt_target_s)
        return record, list(result.tokens)

    def _draft_usable(self, draft: _Peer) -> bool:
        """A draft replica is at hand, or the pool has one (after a failure: another one at once,
        else the same one again once `draft_retry_s` has passed)."""
        if draft.client is not None:
            return True
        now = time.monotonic()
        if self._draft_failed_at is not None and now - self._draft_failed_at < self.draft_retry_s:
            return False
        self._use_draft(draft, self.drafts.acquire())
        if draft.client is None:
            self._draft_failed_at = now
        return draft.client is not None

    def _use_draft(self, draft: _Peer, client: ServiceClient | None) -> None:
        """Route the draft peer to `client` (None: no replica) and plan with that replica's costs."""
        draft.client = client
        self.controller.draft = self.drafts.profile(client) if client is not None else None

    def _draft_failed(self, draft: _Peer, exc: grpc.RpcError) -> None:
        """Go on target-only; the output cannot change, since the target alone decides every token.

        A replica that is down, hung or broken is skipped by the pool for a while; one that refused
        this session's request (a client's bad input) stays in service for everyone else.
        """
        code = exc.code()
        log.warning("session %s: draft %s failed (%s: %s); decoding target-only until a replica is back",
                    self.session_id, draft.client.address, code.name, printable(exc.details()))
        if code not in CLIENT_FAULTS:
            self.drafts.failed(draft.client)
        self.drafts.release(draft.client)
        draft.reset()
        self._use_draft(draft, None)  # the next round asks the pool again, which may pick another replica
