"""The speculate/verify loop of one generation.

The orchestrator owns the committed token list. Each round the draft proposes up to γ tokens and
the target verifies them in one forward pass; each service is sent the committed tokens it has not
seen yet, so both crop their KV caches to the accepted prefix and extend from there
(`orchestrator.sessions`). The draft model's side, its replica and what that keeps, its failures and the branch
it drafts during a verify, is `orchestrator.drafting`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterator

import grpc
from opentelemetry.context import Context
from opentelemetry.trace import Span

from orchestrator.activity import Activity
from orchestrator.clients import ServiceClient
from orchestrator.draft_pool import DraftPool
from orchestrator.drafting import Drafting
from orchestrator.lookups import LOOKUP_KINDS, Lookups
from orchestrator.metrics import SpecDecodeMetrics
from orchestrator.request import Chunk, GenerationRequest
from orchestrator.sessions import NO_DRAFTS, DraftReply, DraftSession, TargetSession, VerifyReply
from specdec.core.ngram import Lookup, RecentSequences
from specdec.core.rounds import Estimates, RoundRecord
from specdec.core.stats import FinishReason, GenerationStats
from specdec.core.text import TextStream, printable
from specdec.planning.controller import GammaController
from specdec.planning.deadline import RoundTimeout
from specdec.planning.prior import LookupPrior
from specdec.runtime import telemetry
from specdec.runtime.wire import sampling_to_pb

log = logging.getLogger(__name__)
# A target-only round takes as many steps on the target as fit in this (one hop for them all): streamed
# tokens still come at least this often, and where one step takes longer (a 1.5B model on a CPU) a round
# is one step, as before.
TARGET_CHUNK_S = 0.02


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
    lookup_prior: LookupPrior | None = None  # hybrid's lookup α, shared with other generations
    recent: RecentSequences | None = None  # finished sessions' sequences, for lookups across sessions
    target_chunk_s: float = TARGET_CHUNK_S  # target-only rounds take the steps that fit (`GammaController.plain_steps`)
    activity: Activity | None = None  # the orchestrator's generations; None: the draft is not fed after the reply

    def __post_init__(self):
        # Service-side session ids are fresh per run, so a resumed generation never meets its old sessions.
        service_session = f"{self.session_id}-{uuid.uuid4().hex[:8]}"
        sampling = sampling_to_pb(self.request.params)
        self.drafting = Drafting(DraftSession(None, service_session, sampling), self.drafts, self.controller,
                                 self.round_timeout, self.request.gamma is None, self.is_cancelled, self.session_id,
                                 self.draft_retry_s)
        self._target = TargetSession(self.target, service_session, sampling)
        proposer = self.request.proposer
        self._uses_model = proposer in ("model", "hybrid")
        if self.lookup_prior is None:
            self.lookup_prior = LookupPrior(LOOKUP_KINDS)
        # Lookups, their α learned per kind (`Lookup.kind`; the model's is the controller's).
        self.lookups = Lookups(len(self.request.prompt_ids), list(self.request.prediction), self.recent,
                               self.lookup_prior, self.controller, self._uses_model) \
            if proposer in ("ngram", "hybrid") else None
        self.controller.target_chunk_s = self.target_chunk_s

    def run(self) -> Iterator[Chunk]:
        req = self.request
        committed = [*req.prompt_ids, *req.resumed]
        if self._uses_model:
            self.drafting.start(committed, req.params.cache_salt)
        text = TextStream(self.tokenizer, req.stop, req.params.min_tokens)
        text.push(list(req.resumed[:req.resume_from]))  # shown to the client before the resume
        stats = GenerationStats(prompt_tokens=len(req.prompt_ids), session_id=self.session_id)
        began = time.perf_counter()
        generated = len(req.resumed)
        finish = FinishReason.NONE
        if self.activity is not None:
            self.activity.begin()
        try:
            replay = list(req.resumed[req.resume_from:])
            if replay:  # committed before the resume but never delivered: not a round of this run
                yield Chunk(replay, text.push(replay), RoundRecord(emitted=len(replay)))
            while not finish:
                if self.is_cancelled():
                    finish = FinishReason.CANCELLED
                    break
                remaining = req.max_new_tokens - generated
                useful = min(remaining - 1, self.max_context - len(committed))
                self.controller.context = len(committed)  # its passes' attention is priced at this depth
                self.controller.generated = generated  # how long it has run: the draft's feed is spread so far
                cap = min(useful, self.controller.gamma_max) if req.gamma is None else max(0, min(req.gamma, useful))
                cap, gamma = self._decide(cap, useful, committed, first=not stats.rounds)
                with telemetry.span("round", context=self.trace_context) as span:
                    try:
                        record, verdict, new_tokens = self._round(gamma, cap, useful, remaining, committed, span)
                    except grpc.RpcError:
                        if not self.is_cancelled():
                            raise
                        finish = FinishReason.CANCELLED  # `abort` ended the round: the client is gone
                        break
                    estimates = Estimates(self.controller.acceptance.alpha, self.controller.cost_ratio())
                    self._annotate(span, record, estimates)
                stats.cached_prompt_tokens = max(stats.cached_prompt_tokens, min(verdict.reused, len(req.prompt_ids)))
                at_eos = len(new_tokens) < min(len(verdict.tokens), remaining)  # cut short at an EOS
                new_tokens, delta = self._push(text, new_tokens)
                if len(new_tokens) < record.emitted:  # cut at a stop string
                    record = dataclasses.replace(record, emitted=len(new_tokens))
                logprobs = verdict.logprobs[:len(new_tokens)]
                prompt = {} if req.prompt_top is None or stats.rounds else \
                    {"prompt_ids": req.prompt_ids, "prompt_logprobs": verdict.prompt_logprobs}
                committed.extend(new_tokens)
                generated += len(new_tokens)
                finish = self._finish_reason(at_eos or text.stopped, generated, len(committed))
                stats.rounds.append(record)
                if self.metrics is not None:
                    self.metrics.record(record)
                    if len(stats.rounds) == 1:
                        self.metrics.record_prompt(len(req.prompt_ids), stats.cached_prompt_tokens)
                if self.on_round is not None:
                    self.on_round(committed[len(req.prompt_ids):], finish.value)
                if finish:
                    stats.finish_reason, stats.total_s = finish, time.perf_counter() - began
                    stats.draft_replica, stats.draft_cached_tokens = self.drafting.replica, self.drafting.reused
                    yield Chunk(new_tokens, delta + text.finish(), record, estimates, stats, logprobs, **prompt)
                else:
                    yield Chunk(new_tokens, delta, record, estimates, logprobs=logprobs, **prompt)
        finally:
            if self.activity is not None:
                self.activity.end()
            if self.lookups is not None:
                self.lookups.finish()
            if self.recent is not None and finish:  # a finished sequence, for later sessions' lookups
                self.recent.add(committed)
            self.drafting.finish(committed, req.params.cache_salt, self._turn_feed(finish))
            self._target.close()
            if log.isEnabledFor(logging.INFO):
                log.info("session %s finished (%s): %s", printable(self.session_id), finish.value or "aborted",
                         summary(stats, generated, time.perf_counter() - began))

    def abort(self) -> None:
        """The client is gone: end both services' streams now, from any thread. Each service frees the session
        and stops a round in flight before its next chunk (a long prompt's); the call waiting on it fails
        CANCELLED, and `run` ends. (gRPC runs it as any call ends: after a generation that ended, a feed the draft
        finishes in the background goes on.)"""
        self.drafting.abort()
        self._target.close()

    def _turn_feed(self, finish: FinishReason) -> Callable[[], bool] | None:
        """After a reply that ended as asked, with the draft model in use: when the draft may be fed what it has
        not seen of the conversation, for its next turn (`Drafting.finish`): while this orchestrator runs no
        other generation, or where the draft computes apart (`GammaController.runs_apart`). Else None."""
        activity = self.activity
        if activity is None or finish not in (FinishReason.STOP, FinishReason.LENGTH) or not self._uses_model \
                or self.request.gamma == 0:
            return None
        return lambda: activity.allows_feed(self.controller.runs_apart())

    def _push(self, text: TextStream, tokens: list[int]) -> tuple[list[int], str]:
        """A round's tokens into the text: (the tokens kept, the text delta). With stop strings the tokens go
        one at a time and end at the one that completes a stop string, so that a round of several tokens
        emits (and counts) none past it."""
        if not text.stop:
            return tokens, text.push(tokens)
        delta = ""
        for kept, token in enumerate(tokens, 1):
            delta += text.push([token])
            if text.stopped:
                return tokens[:kept], delta
        return tokens, delta

    def _finish_reason(self, stopped: bool, generated: int, length: int) -> FinishReason:
        """STOP (EOS or a stop string), LENGTH, CONTEXT, or NONE to go on."""
        if stopped:
            return FinishReason.STOP
        if generated >= self.request.max_new_tokens:
            return FinishReason.LENGTH
        return FinishReason.CONTEXT if length >= self.max_context else FinishReason.NONE

    def _decide(self, cap: int, useful: int, committed: list[int], first: bool) -> tuple[int, int]:
        """This round's (cap, γ), and whether it overlaps (`controller.overlapping`). Under adaptive γ each price
        is computed once (`one_decision`; a wait for the draft's feed, at most a target step, takes place within
        it): 0.71 → 0.52 ms a round on a Zen 1 at 8 users. A fixed γ prices at most the overlap."""
        if self.request.gamma is not None:
            return self._choose(cap, useful, committed, first)
        with self.controller.one_decision():
            return self._choose(cap, useful, committed, first)

    def _choose(self, cap: int, useful: int, committed: list[int], first: bool) -> tuple[int, int]:
        if self._settled(cap, useful, committed) or self._opens_target_only(first):  # nothing to price
            self.controller.overlapping = False
            return 0, 0
        if not self.drafting.await_feed(self.controller.target_time(1)):
            # The draft is still feeding, for a target step or more: lookups or target-only meanwhile.
            self.controller.overlapping = False
            return cap, 0
        self.controller.overlapping = self._overlaps(useful)
        gamma = cap if self.request.gamma is not None else \
            self.controller.choose(useful, self.drafting.unseen(committed))
        return cap, gamma

    def _round(self, gamma: int, cap: int, useful: int, remaining: int, committed: list[int],
               span: Span) -> tuple[RoundRecord, VerifyReply, list[int]]:
        """One round: up to γ tokens proposed (drafted during the last verify, or by the draft model, which
        under adaptive γ drafts on to `cap` while confident: `GammaController.draft_limit`, or by a lookup of
        at most `cap`), verified by the target in one pass, while the draft drafts
        the next round when overlapping. γ = 0 with a fixed γ of 0 (cap 0) is target-only; a target-only
        round may take several steps on the target (`_sources` says how many). `useful`:
        how many tokens past the committed ones can still be used; `remaining`: how many may still be
        emitted. Returns the round's record, the verdict, and the tokens it emits (the verdict's, up to
        `remaining` and before any EOS); the controller has learned from the round."""
        began = time.perf_counter()
        draft_steady = self.drafting.last_drafted > 0  # then the draft feeds at most two pending tokens
        draft_opened = not self.drafting.session.opened  # if it drafts now, its session opens in this round's hop
        hit, model_gamma, steps = self.drafting.prefetched(committed), 0, 1
        if hit is not None:
            lookup = self.lookups.over(len(hit.tokens), cap, committed) if self.request.proposer == "hybrid" else None
        else:
            chunk = self.controller.plain_steps(min(remaining, self.max_context - len(committed)))
            if self.drafting.feeding():  # check again about when the draft's feed is expected in
                step_s = max(self.controller.target_time(1), 1e-6)
                chunk = min(chunk, max(1, math.ceil(self.drafting.feed_left_s() / step_s)))
            lookup, model_gamma, steps = self._sources(gamma, cap, useful, committed, chunk)
        if lookup is not None:
            hit, proposal = None, DraftReply(lookup.tokens, NO_DRAFTS.probs, NO_DRAFTS.hop)
            self.lookups.proposed(lookup)
        elif hit is not None:
            proposal, gamma = hit, len(hit.tokens)
        elif model_gamma > 0 and self.drafting.usable():
            limit = model_gamma if self.request.gamma is not None else self.controller.draft_limit(model_gamma, cap)
            proposal = self.drafting.propose(limit, committed, span)
        else:
            proposal = NO_DRAFTS
        self.drafting.last_drafted = 0 if lookup is not None else len(proposal.tokens)
        if self.controller.overlapping and proposal.tokens and lookup is None:  # after a lookup, likely another
            self.drafting.prefetch(committed, proposal.tokens, min(gamma, useful - len(proposal.tokens) - 1), span)
        prefill = not self._target.opened  # the prompt's round: one step, for the time to the first token
        if prefill and not proposal.tokens:
            self._feed_ahead(useful, committed, span)
        extra = steps - 1 if not proposal.tokens and not prefill else 0
        verify_s = self.controller.target_time(self._target.unsynced(committed) + len(proposal.tokens)) + \
            extra * self.controller.target_time(1)
        prompt_top = self.request.prompt_top if prefill else None
        verdict = self._target.verify(committed, proposal, span, self.round_timeout.of(verify_s),
                                      self.request.top_logprobs, extra, self.eos_ids, prompt_top)
        new_tokens = verdict.tokens[:remaining]
        new_tokens = new_tokens[:next((i for i, t in enumerate(new_tokens) if t in self.eos_ids), len(new_tokens))]
        draft, target = proposal.hop, verdict.hop
        record = RoundRecord(
            gamma=gamma, drafted=len(proposal.tokens), accepted=verdict.accepted, emitted=len(new_tokens),
            wall_s=time.perf_counter() - began, draft_wall_s=draft.wall_s, draft_compute_s=draft.compute_s,
            target_wall_s=target.wall_s, target_compute_s=target.compute_s, draft_steady=draft_steady,
            draft_load=draft.load, target_load=target.load,
            proposer="" if not proposal.tokens else "ngram" if lookup is not None else "model",
            overlapped=self.drafting.branch is not None, prefetched=hit is not None, target_passes=verdict.passes,
            predicted=lookup is not None and lookup.source == "prediction",
            draft_opened=draft_opened and hit is None and lookup is None)
        if self.lookups is not None:
            if lookup is not None:
                self.lookups.observe(lookup, record.drafted, record.accepted)
            self.lookups.observe_shadow(verdict.tokens)
        if not prefill:  # a prefill says nothing about steady-state cost, only about the load
            self.controller.observe(record, by_model=lookup is None or not self._uses_model)
        else:
            self.controller.observe_sessions(record)
        return record, verdict, new_tokens

    def _sources(self, gamma: int, cap: int, useful: int, committed: list[int],
                 chunk: int) -> tuple[Lookup | None, int, int]:
        """Who proposes this round: a lookup (a point mass, no q, no hop) or None, and otherwise the γ
        for the draft model (0: a target-only round); and how many steps a target-only round takes: the
        `chunk` (`GammaController.plain_steps`, in one hop: `specdec.engine.continuation`) where it is
        chosen, one where a fixed γ found no lookup (the next token may give one), and for prompt lookup
        under adaptive γ as many as `Lookups.quiet_steps` says.

        model: the controller's γ. ngram: up to γ looked-up tokens. hybrid: the best of three expected
        rates. A lookup's is `Lookups.priced`'s. The draft model's is its rate at the controller's γ with
        the time its draft needs to catch up on tokens it has not seen (`GammaController.catch_up_rate`,
        over the `useful` tokens left). While its α is still a guess (`GammaController.untried`) and its catch-up
        affordable (`GammaController.trial_affordable`), and on the controller's probes, the draft model drafts
        regardless: at the guess (0.7) the model and target-only
        tie on a CPU pair, the catch-up tips it, and target-only or lookup rounds never measure α (measured:
        whole benchmark runs at α 0.65 and γ ≤ 1, against 0.84 and γ up to 6; a lone session after a burst
        whose every probe became a lookup). Target-only's is its round's, an option only under adaptive γ (a
        fixed γ asks for speculation); where a lookup matched, it is priced as one step, as it was before
        rounds took several: priced as a chunk, a lookup kind whose learned α is low would lose to it for
        good and never be tried again (and a copy may begin at the next token).
        """
        plain = chunk if gamma == 0 else 1
        if self.lookups is None:
            return None, gamma, plain
        if cap == 0:
            return None, 0, plain
        self.lookups.sync(committed)
        if not self._uses_model:  # ngram: under adaptive γ, rounds that find nothing grow (`Lookups.quiet_steps`)
            found = self.lookups.propose(gamma)
            if found.tokens:
                return found, 0, 1
            return None, 0, plain if self.request.gamma is not None else self.lookups.quiet_steps(chunk)
        drafting = gamma > 0 and self.drafting.usable()
        unseen = self.drafting.unseen(committed)
        # Measure the model's α (an untried lookup kind: ditto), before looking anything up.
        if drafting and (self.controller.probing or self.controller.trial_affordable(gamma, unseen, useful)):
            return None, gamma, 1
        priced = self.lookups.priced(cap)
        adaptive = self.request.gamma is None  # a fixed γ asks for speculation: target-only is no option
        options = [(self.controller.plain_rate(chunk if priced is None else 1), None, 0)] if adaptive else []
        if drafting:
            options.append((self.controller.catch_up_rate(gamma, unseen, useful), None, gamma))
        if priced is not None:
            options.append((*priced, 0))
        if not options:  # a fixed γ with neither (the draft down, no lookup)
            return None, 0, plain
        _, lookup, model_gamma = max(options, key=lambda option: option[0])
        if lookup is None and priced is not None:
            self.lookups.shadow = priced[1]
        return lookup, model_gamma, chunk if lookup is None and model_gamma == 0 else 1

    def _opens_target_only(self, first: bool) -> bool:
        """Is this the prompt's round under adaptive γ where the draft model drafts? It decodes target-only:
        drafting in it put the draft model's opening and its feed of the prompt before the first token, and a
        burst's sessions chose it before they counted each other (each counts those live as it joins).
        Measured, 8 users at AVX2 on a Zen 5: 0.94x batched target-only before, 0.99x after; one user as
        before. A client's prediction, free to propose, is still followed from the first round."""
        req = self.request
        return first and req.gamma is None and self._uses_model and not req.prediction

    def _feed_ahead(self, useful: int, committed: list[int], span: Span) -> None:
        """In the prompt's round, which decodes target-only under adaptive γ (`_opens_target_only`), let the draft
        feed the prompt beside it, and draft the next round after a guess of its token (`Drafting.feed_ahead`):
        with `overlap` on, or on auto where the draft computes apart (machines or cores of its own) and the reply
        repays what the feed costs the target's rounds (`GammaController.feed_ahead`). The draft then drafts from
        the second round, and keeps the conversation for its next turn."""
        mode = self.request.overlap
        if mode == "off" or useful < 2 or not self._opens_target_only(first=True):
            return
        if mode == "on":
            gamma = max(self.controller.steady_best(useful - 1), 1)
        else:
            gamma = self.controller.feed_ahead(useful - 1, self.drafting.unseen(committed))
        if gamma > 0:
            self.drafting.feed_ahead(committed, self.controller.draft_limit(gamma, useful - 1), span)

    def _settled(self, cap: int, useful: int, committed: list[int]) -> bool:
        """Under adaptive γ with the draft model (alone or in hybrid): this round is target-only whatever is
        drafted or found (`GammaController.settled`, at the α of the lookup this round finds, if any, and the
        draft model at its own α with its catch-up on what it has not seen), so it prices nothing. Not with a branch
        drafted for it, nor while a client's prediction is untried (proposed whole, whatever it costs)."""
        if self.request.gamma is not None or not self._uses_model or self.drafting.branch is not None:
            return False
        if not self.controller.at_rest():  # before the lookups' α are gathered: a drafting round pays nothing here
            return False
        if self.request.prediction and not (self.lookups is not None and self.lookups.prediction_tried):
            return False
        alphas = self.lookups.found_alphas(cap, committed) if self.lookups is not None else {}
        return self.controller.settled(cap, alphas, self.drafting.unseen(committed), useful)

    def _overlaps(self, useful: int) -> bool:
        """Whether this round drafts the next one during its verify: the request's (or the server's)
        choice, "auto" asking the controller's cost model. Only a draft model drafts ahead."""
        mode = self.request.overlap
        if mode == "off" or not self._uses_model or useful < 2:
            return False
        return mode == "on" or self.controller.overlap_pays(useful, self.request.gamma)

    def _annotate(self, span: Span, record: RoundRecord, estimates: Estimates) -> None:
        if span.is_recording():
            span.set_attributes({"specdec.gamma": record.gamma, "specdec.drafted": record.drafted,
                                 "specdec.accepted": record.accepted, "specdec.alpha_estimate": estimates.alpha,
                                 "specdec.proposer": record.proposer, "specdec.probe": self.controller.probing,
                                 "specdec.cost_ratio_estimate": estimates.cost_ratio,
                                 "specdec.network.draft_ms": 1e3 * record.rtt_draft_s,
                                 "specdec.network.target_ms": 1e3 * record.rtt_target_s,
                                 "specdec.target.pass_rows": record.target_load.rows,
                                 "specdec.draft.pass_rows": record.draft_load.rows})
        log.debug("session %s round γ=%d accepted=%d α̂=%.3f ĉ=%.3f rtt draft %.1f ms target %.1f ms "
                  "drafted=%d by %s",
                  self.session_id, record.gamma, record.accepted, estimates.alpha, estimates.cost_ratio,
                  1e3 * record.rtt_draft_s, 1e3 * record.rtt_target_s, record.drafted, record.proposer or "none")


def summary(stats: GenerationStats, generated: int, seconds: float) -> str:
    """A generation in one line for the operator's log: output, speed, prompt and speculation."""
    drafted, accepted = sum(r.drafted for r in stats.rounds), sum(r.accepted for r in stats.rounds)
    speculation = f", {accepted} of {drafted} drafted tokens accepted" if drafted else ", no drafts"
    return (f"{generated} tokens in {seconds:.2f} s ({generated / max(seconds, 1e-9):.1f} tok/s), prompt "
            f"{stats.prompt_tokens} ({stats.cached_prompt_tokens} cached), {len(stats.rounds)} rounds{speculation}")
