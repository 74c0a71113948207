"""SpecDec.Generate: validate the request, run a Generation, stream its chunks."""

from __future__ import annotations

import dataclasses
import logging
import queue
import re
import threading
import uuid
from dataclasses import dataclass
from typing import Iterator

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from orchestrator.activity import Activity
from orchestrator.cancellation import Cancellation
from orchestrator.clients import ServiceClient
from orchestrator.draft_pool import DraftPool
from orchestrator.generation import TARGET_CHUNK_S, Generation
from orchestrator.request import Chunk, GenerationRequest
from orchestrator.lookups import LOOKUP_KINDS, LOOKUP_MAX_N, LOOKUP_MIN_N
from orchestrator.metrics import SpecDecodeMetrics
from orchestrator.records import RecordWriter, resume_request
from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.core.errors import FailedPrecondition, InvalidArgument, OutOfRange
from specdec.core.ngram import LOOKUP_MEMORY_TOKENS, RecentSequences, shared_for
from specdec.core.grammar import compile_constraint
from specdec.core.params import MAX_CHOICES, SamplingParams
from specdec.planning.controller import GAMMA_MAX
from specdec.planning.cost import CostProfile
from specdec.planning.deadline import RoundTimeout
from specdec.planning.prior import LookupPrior, SharedPrior, sampling_regime
from specdec.runtime import telemetry
from specdec.runtime.errors import grpc_errors
from specdec.runtime.guards import credential_of
from specdec.runtime.options import option
from specdec.runtime.redis_state import SESSION_TTL_S, PriorStore, SessionStore
from specdec.runtime.wire import constraint_from_pb, cost_profile_from_pb, logprob_requests_from_pb, round_to_pb, summary_to_pb

log = logging.getLogger(__name__)
FREE_DRAFT = CostProfile((0.0,))  # a lookup's draft step: no compute, no hop


MAX_STOP_IDS = 64  # stop_token_ids per request
SESSION_ID = re.compile(r"[A-Za-z0-9._:~-]+")
PROPOSERS = {pb.PROPOSER_MODEL: "model", pb.PROPOSER_NGRAM: "ngram", pb.PROPOSER_HYBRID: "hybrid"}
OVERLAPS = {pb.OVERLAP_AUTO: "auto", pb.OVERLAP_ON: "on", pb.OVERLAP_OFF: "off"}


@dataclass(frozen=True)
class OrchestratorConfig:
    """The orchestrator's settings; each field with `option` is also its flag (`orchestrator.flags`)."""

    gamma_max: int = option(GAMMA_MAX, "largest γ the adaptive policy or a client may use")
    max_new_tokens_limit: int = option(8192, "largest max_new_tokens a request may ask for")
    max_stop_strings: int = 16
    max_stop_chars: int = 256  # per stop string
    max_prompt_bytes: int = 1 << 20  # checked before tokenising
    max_session_id_chars: int = 128
    max_concurrent: int = option(64, "generations in flight; past it a request gets RESOURCE_EXHAUSTED at once")
    round_timeout_s: float = option(RoundTimeout.ceiling_s, "ceiling in seconds on one hop of one round; by default "
                                    "a hop gets 20x its measured cost, at least 30 s (a draft past it is dropped, a "
                                    "target past it ends the stream)", flag="--round-timeout")
    session_ttl_s: float = option(SESSION_TTL_S, "seconds a resumable session record lives in Redis",
                                  flag="--session-ttl")
    proposer: str = option("hybrid", "who drafts when a request does not say: the draft model; prompt lookup (n-gram) "
                                     "in the orchestrator, which needs no draft model; or hybrid, each round the one "
                                     "that pays more", choices=("model", "ngram", "hybrid"))
    overlap: str = option("auto", "draft the next round while the target verifies this one, when a request does not "
                                  "say: auto = where the cost model says it pays (separate machines or cores), on, off",
                          choices=("auto", "on", "off"))
    sampler: str = option("coupled", "who draws a sampled token when a request does not say: coupled = a function of "
                                     "the seed, the position and the target's distribution alone, the same output "
                                     "whatever γ, proposer or load; rejection = the modified rejection sampler, the "
                                     "most drafts accepted (both exactly the target's distribution)",
                          choices=("coupled", "rejection"))
    lookup_memory_tokens: int = option(LOOKUP_MEMORY_TOKENS, "tokens of finished generations kept for n-gram lookups "
                                                             "across sessions (0 = none)", flag="--lookup-memory")
    feed_between_turns: str = option("auto", "after a reply, feed its draft what it has not seen of the conversation, "
                                             "so the next turn's draft need not feed it: auto = while this "
                                             "orchestrator runs nothing else, or where the draft computes apart; off",
                                     choices=("auto", "off"))
    target_chunk_ms: float = option(1e3 * TARGET_CHUNK_S, "target-only rounds (γ = 0, fixed or chosen): the target "
                                    "takes as many steps a round as fit in this many ms of expected compute, one hop "
                                    "for them all (0 = one step a round)", flag="--target-chunk-ms")


class SpecDecServicer(pb_grpc.SpecDecServicer):
    """`redis`: a client for resumable session records and the γ prior shared per target model, or None."""

    def __init__(self, drafts: DraftPool, target: ServiceClient, tokenizer, config: OrchestratorConfig,
                 redis=None):
        self.drafts, self.target, self.tokenizer, self.config = drafts, target, tokenizer, config
        target_info = target.info()
        self.sessions = SessionStore(redis, config.session_ttl_s) if redis is not None else None
        self.priors = PriorStore(redis, target_info.model) if redis is not None else None
        drafts.vocab_size = self.vocab_size = target_info.vocab_size  # replicas must share it
        self.max_context = target_info.max_context
        self.eos_ids = frozenset(target_info.eos_token_ids)
        self.gamma_max = min(config.gamma_max, target_info.max_gamma)
        self.target_profile = cost_profile_from_pb(target_info)
        if self.target_profile is None:
            raise FailedPrecondition(f"target {target.address} reports no cost profile (--profile-tokens)")
        # What sessions learn: the model pair's prior (shared through Redis too), and the lookups' apart;
        # both see one target load.
        self.prior = SharedPrior(self.gamma_max)
        self.ngram_prior = SharedPrior(self.gamma_max, target_load_of=self.prior)
        self.lookup_prior = LookupPrior(LOOKUP_KINDS)  # hybrid's lookup α per kind of match
        self.recent = RecentSequences(config.lookup_memory_tokens, LOOKUP_MIN_N, LOOKUP_MAX_N) \
            if config.lookup_memory_tokens else None
        self.round_timeout = RoundTimeout.capped(config.round_timeout_s)
        self.metrics = SpecDecodeMetrics(self.gamma_max)
        self.activity = Activity()

    def parse(self, request: pb.GenerateRequest, owner: str = "") -> GenerationRequest:
        """GenerateRequest -> GenerationRequest; raises InvalidArgument / OutOfRange / NotFound.

        Every size is checked before any work that grows with it (tokenising, stop matching).
        `owner`: the caller's credential; a resumed session must have been started with it.
        """
        config = self.config
        self.check_session_id(request.session_id)
        if request.resume:
            if request.logprobs or request.prompt_logprobs:
                raise InvalidArgument("logprobs are not kept in session records: resume without them")
            if self.sessions is None:
                raise FailedPrecondition("resume needs an orchestrator with --redis-url")
            if not request.session_id:
                raise InvalidArgument("resume needs the session_id of the generation to continue")
            return resume_request(self.sessions.load(request.session_id), request.session_id, request.resume_from,
                                  owner)
        if len(request.stop) > config.max_stop_strings:
            raise InvalidArgument(f"at most {config.max_stop_strings} stop strings, got {len(request.stop)}")
        if any(len(s) > config.max_stop_chars for s in request.stop):
            raise InvalidArgument(f"a stop string may hold at most {config.max_stop_chars} characters")
        if request.prompt:
            prompt_ids = self._encode(request.prompt, "prompt", special=True)
        else:
            if len(request.prompt_token_ids) >= self.max_context:
                raise OutOfRange(f"prompt has {len(request.prompt_token_ids)} tokens; "
                                 f"the model context is {self.max_context}")
            prompt_ids = list(request.prompt_token_ids)
        if not prompt_ids:
            raise InvalidArgument("prompt is empty: set prompt or prompt_token_ids")
        self._token_ids(prompt_ids, "prompt_token_ids")
        if len(prompt_ids) >= self.max_context:
            raise OutOfRange(f"prompt has {len(prompt_ids)} tokens; the model context is {self.max_context}")
        limit = self.config.max_new_tokens_limit
        if not 1 <= request.max_new_tokens <= limit:
            raise InvalidArgument(f"max_new_tokens must be in [1, {limit}], got {request.max_new_tokens}")
        top_p = request.top_p if request.HasField("top_p") else 1.0
        repetition = request.repetition_penalty if request.HasField("repetition_penalty") else 1.0
        outside = sorted(t for t in request.logit_bias if not 0 <= t < self.vocab_size)
        if outside:
            raise InvalidArgument(f"logit_bias names tokens outside the vocabulary [0, {self.vocab_size}): "
                                  f"{outside[:5]}")
        constraint = constraint_from_pb(request.constraint) if request.HasField("constraint") else None
        grammar = compile_constraint(*constraint) if constraint else ""
        params = SamplingParams(request.temperature, request.top_k, top_p, request.seed, request.presence_penalty,
                                request.frequency_penalty, repetition, tuple(request.logit_bias.items()),
                                len(prompt_ids), grammar, request.cache_salt,
                                coupled=request.coupled if request.HasField("coupled") else config.sampler == "coupled",
                                ).validate()
        gamma = request.gamma if request.HasField("gamma") else None
        if gamma is not None and not 0 <= gamma <= self.gamma_max:
            raise InvalidArgument(f"gamma must be in [0, {self.gamma_max}] or unset (adaptive), got {gamma}")
        top_logprobs, prompt_top = logprob_requests_from_pb(request.logprobs, request.prompt_logprobs,
                                                            request.top_logprobs)
        proposer = config.proposer if request.proposer == pb.PROPOSER_UNSPECIFIED else PROPOSERS.get(request.proposer)
        if proposer is None:
            raise InvalidArgument(f"unknown proposer {request.proposer}: use PROPOSER_MODEL, _NGRAM or _HYBRID")
        overlap = config.overlap if request.overlap == pb.OVERLAP_UNSPECIFIED else OVERLAPS.get(request.overlap)
        if overlap is None:
            raise InvalidArgument(f"unknown overlap {request.overlap}: use OVERLAP_AUTO, _ON or _OFF")
        if request.n > MAX_CHOICES:
            raise InvalidArgument(f"n must be in [1, {MAX_CHOICES}], got {request.n}")
        if request.n > 1 and request.session_id:
            raise InvalidArgument("n > 1 is not resumable: leave session_id unset")
        prediction = tuple(self._encode(request.prediction, "prediction") if request.prediction
                           else self._token_ids(request.prediction_token_ids, "prediction_token_ids"))
        if len(prediction) > self.max_context:
            raise InvalidArgument(f"prediction has {len(prediction)} tokens; at most the model context, "
                                  f"{self.max_context}")
        if prediction and proposer == "model":  # a prediction is drafted from by lookups
            proposer = "hybrid"
        parsed = GenerationRequest(prompt_ids, request.max_new_tokens, params, gamma, tuple(request.stop),
                                   top_logprobs=top_logprobs, prompt_top=prompt_top, proposer=proposer,
                                   overlap=overlap, stop_ids=self._stop_ids(request), ignore_eos=request.ignore_eos,
                                   prediction=prediction)
        if request.min_tokens:
            params = dataclasses.replace(params, min_tokens=request.min_tokens, ending_ids=tuple(self._eos(parsed)))
            parsed = dataclasses.replace(parsed, params=params)
        return parsed

    def _encode(self, text: str, field: str, special: bool = False) -> list[int]:
        """A text field's tokens; one over --max-prompt-bytes is refused. `special`: with the tokens the tokenizer
        adds around a text (a Llama's BOS; none for a Qwen), as llama.cpp and vLLM give a completion's prompt."""
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.config.max_prompt_bytes:
            raise InvalidArgument(f"{field} is {size} bytes; the limit is {self.config.max_prompt_bytes}")
        return list(self.tokenizer.encode(text, add_special_tokens=special))

    def _token_ids(self, ids, field: str) -> list[int]:
        """Token ids, each checked against the vocabulary."""
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidArgument(f"{field} outside the vocabulary [0, {self.vocab_size}): {bad[:5]}")
        return list(ids)

    def _stop_ids(self, request: pb.GenerateRequest) -> tuple[int, ...]:
        """The request's stop_token_ids, and its min_tokens and ignore_eos, checked."""
        if len(request.stop_token_ids) > MAX_STOP_IDS:
            raise InvalidArgument(f"at most {MAX_STOP_IDS} stop_token_ids, got {len(request.stop_token_ids)}")
        outside = sorted(t for t in request.stop_token_ids if not 0 <= t < self.vocab_size)
        if outside:
            raise InvalidArgument(f"stop_token_ids outside the vocabulary [0, {self.vocab_size}): {outside[:5]}")
        if request.min_tokens > request.max_new_tokens:
            raise InvalidArgument(f"min_tokens ({request.min_tokens}) must be at most max_new_tokens "
                                  f"({request.max_new_tokens})")
        if (request.min_tokens or request.ignore_eos) and request.HasField("constraint"):
            raise InvalidArgument("min_tokens and ignore_eos cannot be combined with a constraint (structured "
                                  "output ends where its grammar does)")
        return tuple(request.stop_token_ids)

    def check_session_id(self, session_id: str) -> None:
        limit = self.config.max_session_id_chars
        if session_id and (len(session_id) > limit or not SESSION_ID.fullmatch(session_id)):
            raise InvalidArgument(f"session_id must be 1..{limit} characters of [A-Za-z0-9._:~-]")

    def Info(self, request, context):
        """The target's ModelInfo with this orchestrator's caps (`SpecDec.Info`)."""
        with grpc_errors(context):
            info = self.target.info()  # live: its sessions and batching counters
            info.max_gamma, info.max_sessions = self.gamma_max, self.config.max_concurrent
            info.max_new_tokens = self.config.max_new_tokens_limit
            return info

    def Generate(self, request, context):
        cancelled = Cancellation()
        context.add_callback(cancelled.set)
        # A generator handler: the span is ended explicitly rather than held as "current" across yields.
        span = telemetry.tracer().start_span("generate", kind=SpanKind.SERVER)
        emitted, finish = 0, "aborted"
        try:
            with grpc_errors(context):
                parsed = self.parse(request, credential_of(context))
                session_id = request.session_id or uuid.uuid4().hex
                if span.is_recording():
                    span.set_attributes({"specdec.prompt_tokens": len(parsed.prompt_ids),
                                         "specdec.max_new_tokens": parsed.max_new_tokens,
                                         "specdec.gamma_policy": "adaptive" if parsed.gamma is None else str(parsed.gamma)})
                choices = max(request.n, 1)
                if choices > 1:
                    yield from self._choices(parsed, choices, cancelled, span)
                    return
                controller = self._new_controller(parsed)
                try:
                    generation = self._generation(
                        parsed, controller, cancelled, span, session_id=session_id,
                        on_round=RecordWriter(self.sessions, session_id, parsed, credential_of(context))
                        if self.sessions else None)
                    for chunk in generation.run():
                        emitted += len(chunk.token_ids)
                        if chunk.stats is not None:
                            finish = chunk.stats.finish_reason.value
                        yield chunk_to_pb(chunk)
                finally:
                    self._absorb(controller, parsed.proposer)
        finally:
            span.set_attributes({"specdec.generated_tokens": emitted, "specdec.finish_reason": finish})
            span.end()

    def _choices(self, parsed: GenerationRequest, n: int, cancelled: Cancellation,
                 span) -> Iterator[pb.GenerateResponse]:
        """n choices of one prompt, each its own generation with seed + i, their messages interleaved
        (`GenerateResponse.choice`). Choice 0 starts first; the others start once its first round has
        prefilled the prompt, so that each service copies the prompt's KV from it instead of computing
        it again (`Engine._reuse_prefix`). A failure in any choice ends the call with its error."""
        results: queue.Queue = queue.Queue()
        prefilled = threading.Event()

        def run(index: int) -> None:
            params = dataclasses.replace(parsed.params, seed=(parsed.params.seed + index) % 2**64)
            controller = self._new_controller(parsed)
            try:  # the prompt's log-probabilities come once, with choice 0 (which computes the whole prompt)
                generation = self._generation(dataclasses.replace(parsed, params=params, prompt_top=parsed.prompt_top
                                                                  if index == 0 else None), controller, cancelled, span)
                for chunk in generation.run():
                    prefilled.set()
                    results.put((index, chunk))
            except BaseException as exc:  # noqa: BLE001 - handed to the streaming thread
                results.put((index, exc))
            finally:
                self._absorb(controller, parsed.proposer)  # every controller made is absorbed once
                prefilled.set()
                results.put((index, None))

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
        threads[0].start()
        prefilled.wait()
        for thread in threads[1:]:
            thread.start()
        running = n
        try:
            while running:
                index, item = results.get()
                if item is None:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    message = chunk_to_pb(item)
                    message.choice = index
                    yield message
        finally:
            if running:  # the client went away, or a choice failed: stop the others
                cancelled.set()
            for thread in threads:
                if thread.is_alive():
                    thread.join(timeout=30)

    def _generation(self, parsed: GenerationRequest, controller, cancelled: Cancellation, span,
                    **extra) -> Generation:
        """A generation of `parsed` on this orchestrator's services, tokenizer, priors and memory;
        `extra`: Generation's own fields (session_id, on_round)."""
        generation = Generation(parsed, self.drafts, self.target, self.tokenizer, self._eos(parsed), self.max_context,
                                controller, is_cancelled=cancelled.is_set, metrics=self.metrics,
                                trace_context=trace.set_span_in_context(span), round_timeout=self.round_timeout,
                                lookup_prior=self.lookup_prior,
                                recent=shared_for(self.recent, parsed.params.cache_salt),
                                target_chunk_s=self.config.target_chunk_ms / 1e3,
                                activity=self.activity if self.config.feed_between_turns == "auto" else None, **extra)
        cancelled.on_set(generation.abort)  # a round in flight (a long prompt going in) stops where it is
        return generation

    def _eos(self, parsed: GenerationRequest) -> frozenset[int]:
        """The tokens that end a generation: the model's EOS (unless ignore_eos), and under a grammar also the
        tokenizer's, the only token a completed grammar allows; and the request's stop ids."""
        eos = getattr(self.tokenizer, "eos_token_id", None)
        ending = frozenset() if parsed.ignore_eos else self.eos_ids
        if parsed.params.grammar and eos is not None:
            ending |= {eos}
        return ending | frozenset(parsed.stop_ids)

    def _new_controller(self, parsed: GenerationRequest):
        """A γ controller seeded from the proposer's shared prior (the model's refreshed from Redis when
        there is one), α from the request's sampling regime's. An n-gram lookup costs no draft time: its draft
        profile is free."""
        regime, adaptive = sampling_regime(parsed.params.temperature), parsed.gamma is None
        if parsed.proposer == "ngram":
            return self.ngram_prior.new_controller(self.target_profile, FREE_DRAFT, regime, adaptive)
        if self.priors is not None:
            try:
                snapshot = self.priors.load()
                if snapshot:
                    self.prior.load(snapshot)
            except Exception as exc:  # noqa: BLE001 - fall back on this orchestrator's own prior
                log.warning("shared γ prior not read: %s", exc)
        return self.prior.new_controller(self.target_profile, regime=regime, adaptive=adaptive)

    def _absorb(self, controller, proposer: str) -> None:
        """Fold a finished session's estimates into its prior: a hybrid session's controller holds
        the draft model's α (its lookups' are kept apart), so it feeds the model's prior."""
        if proposer == "ngram":
            self.ngram_prior.absorb(controller)
            return
        self.prior.absorb(controller)
        if self.priors is not None:
            try:
                self.priors.save(self.prior.snapshot())
            except Exception as exc:  # noqa: BLE001
                log.warning("shared γ prior not written: %s", exc)


def chunk_to_pb(chunk: Chunk) -> pb.GenerateResponse:
    msg = pb.GenerateResponse(token_ids=chunk.token_ids, text=chunk.text, round=round_to_pb(chunk.record, chunk.estimates),
                              logprobs=chunk.logprobs, prompt_token_ids=chunk.prompt_ids,
                              prompt_logprobs=chunk.prompt_logprobs)
    if chunk.stats is not None:
        msg.stats.CopyFrom(summary_to_pb(chunk.stats.summary()))
    return msg
