"""Protobuf <-> domain conversions shared by the servicers and the orchestrator's clients."""

from __future__ import annotations

from protos import specdec_pb2 as pb
from specdec.core.errors import InvalidArgument
from specdec.core.params import SamplingParams, TokenLogprob, check_top_logprobs
from specdec.core.rounds import Estimates, PassLoad, RoundRecord
from specdec.core.stats import FinishReason, GenerationSummary
from specdec.planning.cost import CostProfile


def sampling_to_pb(params: SamplingParams) -> pb.SamplingParams:
    return pb.SamplingParams(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                             seed=params.seed, presence_penalty=params.presence_penalty,
                             frequency_penalty=params.frequency_penalty, repetition_penalty=params.repetition_penalty,
                             logit_bias=dict(params.logit_bias), prompt_tokens=params.prompt_tokens,
                             grammar=params.grammar, cache_salt=params.cache_salt, min_tokens=params.min_tokens,
                             ending_ids=params.ending_ids, coupled=params.coupled)


def sampling_from_pb(msg: pb.SamplingParams) -> SamplingParams:
    return SamplingParams(msg.temperature, msg.top_k, msg.top_p, msg.seed, msg.presence_penalty,
                          msg.frequency_penalty, msg.repetition_penalty or 1.0, tuple(msg.logit_bias.items()),
                          msg.prompt_tokens, msg.grammar, msg.cache_salt, msg.min_tokens,
                          tuple(msg.ending_ids), msg.coupled).validate()


def constraint_from_pb(msg: pb.Constraint) -> tuple[str, str | list[str]] | None:
    """A request's constraint as `compile_constraint` takes it, (kind, value); None if it has none."""
    kind = msg.WhichOneof("kind")
    if kind is None:
        return None
    return kind, list(msg.choice.options) if kind == "choice" else str(getattr(msg, kind))


def constraint_to_pb(kind: str, value: str | bool | list[str]) -> pb.Constraint:
    """The inverse: a Constraint asking for `kind` with `value`."""
    if kind == "choice":
        return pb.Constraint(choice=pb.Choices(options=value))
    return pb.Constraint(**{kind: value})


def probs_rows(msg: pb.DraftProbs, gamma: int, begin: int, end: int) -> pb.DraftProbs:
    """Rows [begin, end) of an encoded [γ, V] q, still encoded (a proposal's slice keeps its exact q)."""
    kind = msg.WhichOneof("encoding")
    if kind == "dense_f32":
        row = len(msg.dense_f32) // gamma
        return pb.DraftProbs(dense_f32=msg.dense_f32[begin * row:end * row])
    if kind == "sparse":
        return pb.DraftProbs(sparse=pb.SparseDraftProbs(rows=msg.sparse.rows[begin:end]))
    return pb.DraftProbs(none=True)


def logprob_request_from_pb(logprobs: bool, top_logprobs: int) -> int | None:
    """A request's (logprobs, top_logprobs) -> None (none asked for) or how many alternatives per token."""
    return logprob_requests_from_pb(logprobs, False, top_logprobs)[0]


def logprob_requests_from_pb(logprobs: bool, prompt_logprobs: bool, top_logprobs: int) -> tuple[int | None, int | None]:
    """A request's (logprobs, prompt_logprobs, top_logprobs) -> for the generated tokens and for the prompt's,
    None (not asked for) or how many alternatives per token: `top_logprobs` serves both."""
    if not (logprobs or prompt_logprobs):
        if top_logprobs:
            raise InvalidArgument("top_logprobs needs logprobs (or prompt_logprobs)")
        return None, None
    top = check_top_logprobs(top_logprobs)
    return top if logprobs else None, top if prompt_logprobs else None


def logprob_request_to_pb(top_logprobs: int | None, prompt_top: int | None = None) -> dict:
    """The inverse: a request's (logprobs, top_logprobs) fields for None or k alternatives per token, and
    prompt_logprobs when `prompt_top` is set (both asked for: the same k)."""
    fields = {"logprobs": top_logprobs is not None, "top_logprobs": (top_logprobs or prompt_top) or 0}
    if prompt_top is not None:
        if top_logprobs not in (None, prompt_top):
            raise ValueError(f"one top_logprobs serves both: {top_logprobs} != {prompt_top}")
        fields["prompt_logprobs"] = True
    return fields


def speculation_to_pb(proposer: str | None, overlap: str | None, sampler: str | None = None) -> dict:
    """A request's proposer, overlap and sampler fields for their names ("model", "ngram", "hybrid"; "auto", "on",
    "off"; "coupled", "rejection"); None or "" leaves a field unset: the server's default."""
    if sampler not in ("", None, "coupled", "rejection"):  # as an unknown proposer or overlap name is refused
        raise ValueError(f"unknown sampler {sampler!r}: coupled or rejection")
    fields = {} if not sampler else {"coupled": sampler == "coupled"}
    if proposer:
        fields["proposer"] = pb.Proposer.Value(f"PROPOSER_{proposer.upper()}")
    if overlap:
        fields["overlap"] = pb.Overlap.Value(f"OVERLAP_{overlap.upper()}")
    return fields


def logprobs_to_pb(logprobs: list[TokenLogprob] | None) -> list[pb.TokenLogprob]:
    return [pb.TokenLogprob(logprob=lp.logprob, top_ids=[t for t, _ in lp.top], top_logprobs=[v for _, v in lp.top],
                            rank=lp.rank) for lp in logprobs or ()]


def model_info_to_pb(engine) -> pb.ModelInfo:
    """An Engine (or a tensor-parallel front for one) -> ModelInfo with a report per worker rank."""
    loaded = engine.loaded
    choice, profile = loaded.choice, engine.cost_profile
    return pb.ModelInfo(model=loaded.name, vocab_size=loaded.vocab_size, max_context=loaded.max_context,
                        eos_token_ids=list(loaded.eos_token_ids), max_gamma=engine.gamma_max,
                        live_sessions=engine.live_sessions, max_sessions=engine.max_sessions,
                        device=str(loaded.device), tensor_parallel_size=engine.tensor_parallel_size,
                        ranks=[pb.RankReport(**report) for report in engine.reports()],
                        forward_ns=[round(s * 1e9) for s in profile.seconds] if profile else [],
                        forward_tokens=list(profile.tokens) if profile else [],
                        forward_ps_per_position=round(profile.per_position_s * 1e12) if profile else 0,
                        compute_path=choice.path, kernel=choice.kernel, hardware=choice.device,
                        row_invariant=choice.row_invariant, forward_passes=engine.batcher.forwards,
                        forward_steps=engine.batcher.steps,
                        scored_tokens=loaded.scored_tokens)


def cost_profile_from_pb(info: pb.ModelInfo) -> CostProfile | None:
    """The service's cost profile, or None if it reports none or a malformed one."""
    if not info.forward_ns:
        return None
    try:
        return CostProfile(tuple(ns / 1e9 for ns in info.forward_ns), tuple(info.forward_tokens),
                           info.forward_ps_per_position / 1e12)
    except ValueError:
        return None


def pass_load_to_pb(load: PassLoad) -> pb.PassLoad:
    return pb.PassLoad(sessions=load.sessions, rows=load.rows, tokens=load.tokens,
                       forward_ns=int(load.forward_s * 1e9), wait_ns=int(load.wait_s * 1e9))


def pass_load_from_pb(message: pb.PassLoad) -> PassLoad:
    """A reply's load; an unset one (an older service) reads as a lone session."""
    return PassLoad(max(message.sessions, 1), max(message.rows, 1.0), message.tokens,
                    message.forward_ns / 1e9, message.wait_ns / 1e9)


FINISH_TO_PB = {FinishReason.STOP: pb.FINISH_REASON_STOP, FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
                FinishReason.CONTEXT: pb.FINISH_REASON_CONTEXT, FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED}


def round_to_pb(r: RoundRecord, estimates: Estimates) -> pb.RoundStats:
    return pb.RoundStats(gamma=r.gamma, drafted=r.drafted, accepted=r.accepted, emitted=r.emitted, wall_s=r.wall_s,
                         draft_compute_s=r.draft_compute_s, target_compute_s=r.target_compute_s,
                         alpha_estimate=estimates.alpha, cost_ratio_estimate=estimates.cost_ratio,
                         rtt_draft_s=r.rtt_draft_s, rtt_target_s=r.rtt_target_s, proposer=r.proposer,
                         overlapped=r.overlapped, prefetched=r.prefetched,
                         target_forward_s=r.target_load.forward_s, target_wait_s=r.target_load.wait_s,
                         target_passes=r.target_passes)


def summary_to_pb(s: GenerationSummary) -> pb.GenerationStats:
    return pb.GenerationStats(
        rounds=s.rounds, draft_tokens=s.draft_tokens, accepted_tokens=s.accepted_tokens,
        acceptance_rate=s.acceptance_rate, alpha=s.alpha, mean_accepted_length=s.mean_accepted_length,
        tokens_per_second=s.tokens_per_second, gamma_per_round=s.gamma_per_round,
        finish_reason=FINISH_TO_PB.get(s.finish_reason, pb.FINISH_REASON_UNSPECIFIED),
        generated_tokens=s.generated_tokens, prompt_tokens=s.prompt_tokens, total_s=s.total_s,
        draft_compute_s=s.draft_compute_s, target_compute_s=s.target_compute_s,
        overhead_per_round_s=s.overhead_per_round_s, draft_replica=s.draft_replica, session_id=s.session_id,
        overlap_branches=s.overlap_branches, overlap_hits=s.overlap_hits, cached_prompt_tokens=s.cached_prompt_tokens,
        prediction_accepted_tokens=s.prediction_accepted, prediction_rejected_tokens=s.prediction_rejected,
        draft_cached_tokens=s.draft_cached_tokens)
