from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Proposer(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROPOSER_UNSPECIFIED: _ClassVar[Proposer]
    PROPOSER_MODEL: _ClassVar[Proposer]
    PROPOSER_NGRAM: _ClassVar[Proposer]
    PROPOSER_HYBRID: _ClassVar[Proposer]

class Overlap(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OVERLAP_UNSPECIFIED: _ClassVar[Overlap]
    OVERLAP_AUTO: _ClassVar[Overlap]
    OVERLAP_ON: _ClassVar[Overlap]
    OVERLAP_OFF: _ClassVar[Overlap]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_CONTEXT: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
PROPOSER_UNSPECIFIED: Proposer
PROPOSER_MODEL: Proposer
PROPOSER_NGRAM: Proposer
PROPOSER_HYBRID: Proposer
OVERLAP_UNSPECIFIED: Overlap
OVERLAP_AUTO: Overlap
OVERLAP_ON: Overlap
OVERLAP_OFF: Overlap
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_CONTEXT: FinishReason
FINISH_REASON_CANCELLED: FinishReason

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "prompt_tokens", "grammar", "cache_salt", "min_tokens", "ending_ids", "coupled")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ENDING_IDS_FIELD_NUMBER: _ClassVar[int]
    COUPLED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    logit_bias: _containers.ScalarMap[int, float]
    prompt_tokens: int
    grammar: str
    cache_salt: str
    min_tokens: int
    ending_ids: _containers.RepeatedScalarFieldContainer[int]
    coupled: bool
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., prompt_tokens: _Optional[int] = ..., grammar: _Optional[str] = ..., cache_salt: _Optional[str] = ..., min_tokens: _Optional[int] = ..., ending_ids: _Optional[_Iterable[int]] = ..., coupled: _Optional[bool] = ...) -> None: ...

class Constraint(_message.Message):
    __slots__ = ("json_schema", "json_object", "regex", "lark", "choice")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    LARK_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    json_object: bool
    regex: str
    lark: str
    choice: Choices
    def __init__(self, json_schema: _Optional[str] = ..., json_object: _Optional[bool] = ..., regex: _Optional[str] = ..., lark: _Optional[str] = ..., choice: _Optional[_Union[Choices, _Mapping]] = ...) -> None: ...

class Choices(_message.Message):
    __slots__ = ("options",)
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    options: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, options: _Optional[_Iterable[str]] = ...) -> None: ...

class SparseProbs(_message.Message):
    __slots__ = ("ids", "probs")
    IDS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    probs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., probs: _Optional[_Iterable[float]] = ...) -> None: ...

class DraftProbs(_message.Message):
    __slots__ = ("none", "sparse", "dense_f32")
    NONE_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    DENSE_F32_FIELD_NUMBER: _ClassVar[int]
    none: bool
    sparse: SparseDraftProbs
    dense_f32: bytes
    def __init__(self, none: _Optional[bool] = ..., sparse: _Optional[_Union[SparseDraftProbs, _Mapping]] = ..., dense_f32: _Optional[bytes] = ...) -> None: ...

class SparseDraftProbs(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[SparseProbs]
    def __init__(self, rows: _Optional[_Iterable[_Union[SparseProbs, _Mapping]]] = ...) -> None: ...

class Commit(_message.Message):
    __slots__ = ("start", "tokens")
    START_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    start: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, start: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class PassLoad(_message.Message):
    __slots__ = ("rows", "tokens", "sessions", "forward_ns", "wait_ns")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_NS_FIELD_NUMBER: _ClassVar[int]
    WAIT_NS_FIELD_NUMBER: _ClassVar[int]
    rows: float
    tokens: float
    sessions: int
    forward_ns: int
    wait_ns: int
    def __init__(self, rows: _Optional[float] = ..., tokens: _Optional[float] = ..., sessions: _Optional[int] = ..., forward_ns: _Optional[int] = ..., wait_ns: _Optional[int] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("logprob", "top_ids", "top_logprobs", "rank")
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    logprob: float
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    rank: int
    def __init__(self, logprob: _Optional[float] = ..., top_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ..., rank: _Optional[int] = ...) -> None: ...

class ModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model", "vocab_size", "max_context", "eos_token_ids", "max_gamma", "live_sessions", "max_sessions", "device", "tensor_parallel_size", "ranks", "forward_ns", "compute_path", "kernel", "hardware", "row_invariant", "forward_tokens", "forward_passes", "forward_steps", "max_new_tokens", "scored_tokens", "forward_ps_per_position")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_GAMMA_FIELD_NUMBER: _ClassVar[int]
    LIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    TENSOR_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_NS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_PATH_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    ROW_INVARIANT_FIELD_NUMBER: _ClassVar[int]
    FORWARD_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_PASSES_FIELD_NUMBER: _ClassVar[int]
    FORWARD_STEPS_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SCORED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_PS_PER_POSITION_FIELD_NUMBER: _ClassVar[int]
    model: str
    vocab_size: int
    max_context: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    max_gamma: int
    live_sessions: int
    max_sessions: int
    device: str
    tensor_parallel_size: int
    ranks: _containers.RepeatedCompositeFieldContainer[RankReport]
    forward_ns: _containers.RepeatedScalarFieldContainer[int]
    compute_path: str
    kernel: str
    hardware: str
    row_invariant: bool
    forward_tokens: _containers.RepeatedScalarFieldContainer[int]
    forward_passes: int
    forward_steps: int
    max_new_tokens: int
    scored_tokens: int
    forward_ps_per_position: int
    def __init__(self, model: _Optional[str] = ..., vocab_size: _Optional[int] = ..., max_context: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., max_gamma: _Optional[int] = ..., live_sessions: _Optional[int] = ..., max_sessions: _Optional[int] = ..., device: _Optional[str] = ..., tensor_parallel_size: _Optional[int] = ..., ranks: _Optional[_Iterable[_Union[RankReport, _Mapping]]] = ..., forward_ns: _Optional[_Iterable[int]] = ..., compute_path: _Optional[str] = ..., kernel: _Optional[str] = ..., hardware: _Optional[str] = ..., row_invariant: _Optional[bool] = ..., forward_tokens: _Optional[_Iterable[int]] = ..., forward_passes: _Optional[int] = ..., forward_steps: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., scored_tokens: _Optional[int] = ..., forward_ps_per_position: _Optional[int] = ...) -> None: ...

class RankReport(_message.Message):
    __slots__ = ("rank", "pid", "resident_bytes", "parameter_bytes", "live_sessions", "cached_tokens", "kept_tokens")
    RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_BYTES_FIELD_NUMBER: _ClassVar[int]
    LIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KEPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    rank: int
    pid: int
    resident_bytes: int
    parameter_bytes: int
    live_sessions: int
    cached_tokens: int
    kept_tokens: int
    def __init__(self, rank: _Optional[int] = ..., pid: _Optional[int] = ..., resident_bytes: _Optional[int] = ..., parameter_bytes: _Optional[int] = ..., live_sessions: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., kept_tokens: _Optional[int] = ...) -> None: ...

class DraftRequest(_message.Message):
    __slots__ = ("session_id", "open", "sampling", "commit", "gamma", "min_confidence", "trace_context", "guess_first")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    MIN_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    GUESS_FIRST_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    open: bool
    sampling: SamplingParams
    commit: Commit
    gamma: int
    min_confidence: float
    trace_context: _containers.ScalarMap[str, str]
    guess_first: bool
    def __init__(self, session_id: _Optional[str] = ..., open: _Optional[bool] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., commit: _Optional[_Union[Commit, _Mapping]] = ..., gamma: _Optional[int] = ..., min_confidence: _Optional[float] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., guess_first: _Optional[bool] = ...) -> None: ...

class DraftProposal(_message.Message):
    __slots__ = ("tokens", "probs", "compute_ns", "rollback_ns", "rolled_back_tokens", "load", "reused_tokens")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_NS_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_NS_FIELD_NUMBER: _ClassVar[int]
    ROLLED_BACK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    REUSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    probs: DraftProbs
    compute_ns: int
    rollback_ns: int
    rolled_back_tokens: int
    load: PassLoad
    reused_tokens: int
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., probs: _Optional[_Union[DraftProbs, _Mapping]] = ..., compute_ns: _Optional[int] = ..., rollback_ns: _Optional[int] = ..., rolled_back_tokens: _Optional[int] = ..., load: _Optional[_Union[PassLoad, _Mapping]] = ..., reused_tokens: _Optional[int] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("session_id", "open", "sampling", "commit", "draft_tokens", "draft_probs", "trace_context", "logprobs", "top_logprobs", "extra_steps", "stop_ids", "prompt_logprobs")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PROBS_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    EXTRA_STEPS_FIELD_NUMBER: _ClassVar[int]
    STOP_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    open: bool
    sampling: SamplingParams
    commit: Commit
    draft_tokens: _containers.RepeatedScalarFieldContainer[int]
    draft_probs: DraftProbs
    trace_context: _containers.ScalarMap[str, str]
    logprobs: bool
    top_logprobs: int
    extra_steps: int
    stop_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_logprobs: bool
    def __init__(self, session_id: _Optional[str] = ..., open: _Optional[bool] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., commit: _Optional[_Union[Commit, _Mapping]] = ..., draft_tokens: _Optional[_Iterable[int]] = ..., draft_probs: _Optional[_Union[DraftProbs, _Mapping]] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., extra_steps: _Optional[int] = ..., stop_ids: _Optional[_Iterable[int]] = ..., prompt_logprobs: _Optional[bool] = ...) -> None: ...

class VerifyResult(_message.Message):
    __slots__ = ("num_accepted", "tokens", "compute_ns", "rollback_ns", "rolled_back_tokens", "load", "logprobs", "extra_passes", "reused_tokens", "prompt_logprobs")
    NUM_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_NS_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_NS_FIELD_NUMBER: _ClassVar[int]
    ROLLED_BACK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    EXTRA_PASSES_FIELD_NUMBER: _ClassVar[int]
    REUSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    num_accepted: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    compute_ns: int
    rollback_ns: int
    rolled_back_tokens: int
    load: PassLoad
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    extra_passes: int
    reused_tokens: int
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, num_accepted: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ..., compute_ns: _Optional[int] = ..., rollback_ns: _Optional[int] = ..., rolled_back_tokens: _Optional[int] = ..., load: _Optional[_Union[PassLoad, _Mapping]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., extra_passes: _Optional[int] = ..., reused_tokens: _Optional[int] = ..., prompt_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "prompt_token_ids", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "gamma", "stop", "session_id", "resume", "resume_from", "logprobs", "top_logprobs", "proposer", "overlap", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "n", "constraint", "cache_salt", "prompt_logprobs", "min_tokens", "ignore_eos", "stop_token_ids", "prediction", "prediction_token_ids", "coupled")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROPOSER_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    COUPLED_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    gamma: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    session_id: str
    resume: bool
    resume_from: int
    logprobs: bool
    top_logprobs: int
    proposer: Proposer
    overlap: Overlap
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    logit_bias: _containers.ScalarMap[int, float]
    n: int
    constraint: Constraint
    cache_salt: str
    prompt_logprobs: bool
    min_tokens: int
    ignore_eos: bool
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    prediction: str
    prediction_token_ids: _containers.RepeatedScalarFieldContainer[int]
    coupled: bool
    def __init__(self, prompt: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., gamma: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., session_id: _Optional[str] = ..., resume: _Optional[bool] = ..., resume_from: _Optional[int] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., proposer: _Optional[_Union[Proposer, str]] = ..., overlap: _Optional[_Union[Overlap, str]] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., n: _Optional[int] = ..., constraint: _Optional[_Union[Constraint, _Mapping]] = ..., cache_salt: _Optional[str] = ..., prompt_logprobs: _Optional[bool] = ..., min_tokens: _Optional[int] = ..., ignore_eos: _Optional[bool] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., prediction: _Optional[str] = ..., prediction_token_ids: _Optional[_Iterable[int]] = ..., coupled: _Optional[bool] = ...) -> None: ...

class RoundStats(_message.Message):
    __slots__ = ("gamma", "drafted", "accepted", "emitted", "wall_s", "draft_compute_s", "target_compute_s", "alpha_estimate", "cost_ratio_estimate", "rtt_draft_s", "rtt_target_s", "proposer", "overlapped", "prefetched", "target_forward_s", "target_wait_s", "target_passes")
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    EMITTED_FIELD_NUMBER: _ClassVar[int]
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    DRAFT_COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    TARGET_COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    ALPHA_ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    COST_RATIO_ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    RTT_DRAFT_S_FIELD_NUMBER: _ClassVar[int]
    RTT_TARGET_S_FIELD_NUMBER: _ClassVar[int]
    PROPOSER_FIELD_NUMBER: _ClassVar[int]
    OVERLAPPED_FIELD_NUMBER: _ClassVar[int]
    PREFETCHED_FIELD_NUMBER: _ClassVar[int]
    TARGET_FORWARD_S_FIELD_NUMBER: _ClassVar[int]
    TARGET_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    TARGET_PASSES_FIELD_NUMBER: _ClassVar[int]
    gamma: int
    drafted: int
    accepted: int
    emitted: int
    wall_s: float
    draft_compute_s: float
    target_compute_s: float
    alpha_estimate: float
    cost_ratio_estimate: float
    rtt_draft_s: float
    rtt_target_s: float
    proposer: str
    overlapped: bool
    prefetched: bool
    target_forward_s: float
    target_wait_s: float
    target_passes: int
    def __init__(self, gamma: _Optional[int] = ..., drafted: _Optional[int] = ..., accepted: _Optional[int] = ..., emitted: _Optional[int] = ..., wall_s: _Optional[float] = ..., draft_compute_s: _Optional[float] = ..., target_compute_s: _Optional[float] = ..., alpha_estimate: _Optional[float] = ..., cost_ratio_estimate: _Optional[float] = ..., rtt_draft_s: _Optional[float] = ..., rtt_target_s: _Optional[float] = ..., proposer: _Optional[str] = ..., overlapped: _Optional[bool] = ..., prefetched: _Optional[bool] = ..., target_forward_s: _Optional[float] = ..., target_wait_s: _Optional[float] = ..., target_passes: _Optional[int] = ...) -> None: ...

class GenerationStats(_message.Message):
    __slots__ = ("rounds", "draft_tokens", "accepted_tokens", "acceptance_rate", "alpha", "mean_accepted_length", "tokens_per_second", "gamma_per_round", "finish_reason", "generated_tokens", "prompt_tokens", "total_s", "draft_compute_s", "target_compute_s", "overhead_per_round_s", "draft_replica", "session_id", "overlap_branches", "overlap_hits", "cached_prompt_tokens", "prediction_accepted_tokens", "prediction_rejected_tokens", "draft_cached_tokens")
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_RATE_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    MEAN_ACCEPTED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    GAMMA_PER_ROUND_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    DRAFT_COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    TARGET_COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    OVERHEAD_PER_ROUND_S_FIELD_NUMBER: _ClassVar[int]
    DRAFT_REPLICA_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_BRANCHES_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_HITS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_REJECTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    rounds: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float
    alpha: float
    mean_accepted_length: float
    tokens_per_second: float
    gamma_per_round: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    generated_tokens: int
    prompt_tokens: int
    total_s: float
    draft_compute_s: float
    target_compute_s: float
    overhead_per_round_s: float
    draft_replica: str
    session_id: str
    overlap_branches: int
    overlap_hits: int
    cached_prompt_tokens: int
    prediction_accepted_tokens: int
    prediction_rejected_tokens: int
    draft_cached_tokens: int
    def __init__(self, rounds: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., acceptance_rate: _Optional[float] = ..., alpha: _Optional[float] = ..., mean_accepted_length: _Optional[float] = ..., tokens_per_second: _Optional[float] = ..., gamma_per_round: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., generated_tokens: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., total_s: _Optional[float] = ..., draft_compute_s: _Optional[float] = ..., target_compute_s: _Optional[float] = ..., overhead_per_round_s: _Optional[float] = ..., draft_replica: _Optional[str] = ..., session_id: _Optional[str] = ..., overlap_branches: _Optional[int] = ..., overlap_hits: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ..., prediction_accepted_tokens: _Optional[int] = ..., prediction_rejected_tokens: _Optional[int] = ..., draft_cached_tokens: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("token_ids", "text", "round", "stats", "logprobs", "choice", "prompt_token_ids", "prompt_logprobs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    round: RoundStats
    stats: GenerationStats
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    choice: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., round: _Optional[_Union[RoundStats, _Mapping]] = ..., stats: _Optional[_Union[GenerationStats, _Mapping]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., choice: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...
