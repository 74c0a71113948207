"""The speculate/verify loop of one generation.

The orchestrator owns the committed token list. Each round it sends each service the
committed tokens that service has not seen yet (a `Commit` from the length it last
confirmed), so both crop their KV caches to the accepted prefix and extend from there.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterator

from orchestrator.clients import ServiceClient, SessionStream
from protos import specdec_pb2 as pb
from service_runtime.wire import sampling_to_pb
from specdec.controller import GammaController, RoundTiming
from specdec.sampling import SamplingParams
from specdec.stats import GenerationStats, RoundRecord
from specdec.text import TextStream

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    max_new_tokens: int
    params: SamplingParams
    gamma: int | None  # None = adaptive
    stop: tuple[str, ...] = ()


@dataclass
class Chunk:
    token_ids: list[int]
    text: str
    round: RoundRecord
    stats: dict | None = None  # the summary, on the last chunk only


@dataclass
class _Peer:
    """A service stream and the committed length that service last confirmed."""

    client: ServiceClient
    stream: SessionStream | None = None
    confirmed: int = 0
    opened: bool = False

    def commit(self, committed: list[int]) -> pb.Commit:
        return pb.Commit(start=self.confirmed, tokens=committed[self.confirmed:])

    def call(self, request):
        if self.stream is None:
            self.stream = self.client.open_stream()
        reply, wall = self.stream.call(request)
        self.opened = True
        return reply, wall

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()


@dataclass
class Generation:
    request: GenerationRequest
    draft: ServiceClient
    target: ServiceClient
    tokenizer: object
    eos_ids: frozenset[int]
    max_context: int
    controller: GammaController
    is_cancelled: Callable[[], bool] = lambda: False
    session_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    _last_gamma: int = 0

    def run(self) -> Iterator[Chunk]:
        req = self.request
        committed = list(req.prompt_ids)
        draft, target = _Peer(self.draft), _Peer(self.target)
        text = TextStream(self.tokenizer, req.stop)
        stats = GenerationStats(prompt_tokens=len(committed))
        sampling = sampling_to_pb(req.params)
        began = time.perf_counter()
        generated = 0
        finish = ""
        try:
            while not finish:
                if self.is_cancelled():
                    finish = "cancelled"
                    break
                remaining = req.max_new_tokens - generated
                room = self.max_context - len(committed)
                useful = min(remaining - 1, room)
                gamma = self.controller.choose(useful) if req.gamma is None else max(0, min(req.gamma, useful))
                record, new_tokens = self._round(gamma, committed, draft, target, sampling)
                new_tokens = new_tokens[:remaining]
                eos_at = next((i for i, t in enumerate(new_tokens) if t in self.eos_ids), None)
                if eos_at is not None:
                    new_tokens, finish = new_tokens[:eos_at], "stop"
                committed.extend(new_tokens)
                generated += len(new_tokens)
                delta = text.push(new_tokens)
                if text.stopped:
                    finish = "stop"
                elif generated >= req.max_new_tokens:
                    finish = "length"
                elif len(committed) >= self.max_context:
                    finish = "context"
                record = RoundRecord(**{**record.__dict__, "emitted": len(new_tokens)})
                stats.rounds.append(record)
                if finish:
                    delta += text.finish()
                    stats.finish_reason = finish
                    stats.total_s = time.perf_counter() - began
                    yield Chunk(new_tokens, delta, record, stats.summary())
                else:
                    yield Chunk(new_tokens, delta, record)
        finally:
            draft.close()
            target.close()
            log.info("session %s finished (%s) after %d tokens", self.session_id, finish or "aborted", generated)

    def _round(self, gamma: int, committed: list[int], draft: _Peer, target: _Peer,
               sampling: pb.SamplingParams) -> tuple[RoundRecord, list[int]]:
        began = time.perf_counter()
        draft_tokens: list[int] = []
        probs = pb.DraftProbs(none=True)
        draft_wall = draft_compute = 0.0
        # The draft is steady when it drafted last round: it then feeds at most two pending tokens.
        draft_steady = self._last_gamma > 0
        self._last_gamma = gamma
        if gamma > 0:
            proposal, draft_wall = draft.call(pb.DraftRequest(
                session_id=self.session_id, open=not draft.opened, sampling=sampling,
                commit=draft.commit(committed), gamma=gamma))
            draft.confirmed = proposal.committed_len
            draft_tokens, probs = list(proposal.tokens), proposal.probs
            draft_compute = proposal.compute_ns / 1e9
        first_target_round = not target.opened
        result, target_wall = target.call(pb.VerifyRequest(
            session_id=self.session_id, open=not target.opened, sampling=sampling,
            commit=target.commit(committed), draft_tokens=draft_tokens, draft_probs=probs))
        target.confirmed = result.committed_len
        target_compute = result.compute_ns / 1e9
        if not first_target_round:  # a prefill says nothing about steady-state cost
            self.controller.observe(RoundTiming(gamma, result.num_accepted, draft_wall, draft_compute,
                                                target_wall, target_compute, draft_steady))
        record = RoundRecord(gamma=gamma, drafted=len(draft_tokens), accepted=result.num_accepted,
                             emitted=len(result.tokens), wall_s=time.perf_counter() - began,
                             draft_wall_s=draft_wall, draft_compute_s=draft_compute,
                             target_wall_s=target_wall, target_compute_s=target_compute)
        log.debug("round γ=%d accepted=%d α̂=%.3f", gamma, result.num_accepted, self.controller.acceptance.alpha)
        return record, list(result.tokens)
