"""What a draft or target service hosts: the backend interface, and the values it returns.

`DraftEngine` and `TargetEngine` (a model, `specdec.engine.draft_engine` and `.target_engine`), `LookupEngine` (no model,
n-gram lookups) and the tensor-parallel front of a target (`target_service.tensor_parallel`) implement
it; a new backend (a GPU runner, another proposer) implements it too, and the services serve it
unchanged. `tests/test_engine_backend.py` checks every implementation against these Protocols.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import torch

from specdec.core.params import SamplingParams, TokenLogprob
from specdec.core.rejection import Verdict
from specdec.core.rounds import PassLoad
from specdec.engine.compute import PathChoice
from specdec.engine.measure import PassProgress
from specdec.engine.profile_cache import ProfileCache
from specdec.planning.cost import CostProfile


@dataclass(frozen=True)
class Rollback:
    """The KV crop that started a round: cached tokens dropped and the time it took."""

    tokens: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class Proposal:
    """A draft call's answer: the tokens and the q they were drawn with."""

    tokens: list[int]
    probs: torch.Tensor | None  # [γ, V] float32 on CPU; None for greedy
    compute_s: float  # the whole round on this service, rollback included
    rollback: Rollback = Rollback()
    load: PassLoad = PassLoad()  # the draft steps' shared passes
    reused: int = 0  # positions taken from another session's KV cache, not computed (a shared prefix)


@dataclass(frozen=True)
class Verification:
    """A verify call's answer: the rejection sampler's verdict and what the call cost."""

    verdict: Verdict
    compute_s: float
    rollback: Rollback = Rollback()
    load: PassLoad = PassLoad()  # the verify's shared pass
    logprobs: list[TokenLogprob] | None = None  # one per verdict token, when asked for
    passes: int = 1  # the verify and any target-only steps after it (`specdec.engine.continuation`)
    reused: int = 0  # positions taken from another session's KV cache, not computed (a shared prefix)
    prompt_logprobs: list[TokenLogprob] | None = None  # committed positions 1.., when asked for (`TargetBackend.verify`)


def resident_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class ModelDescription(Protocol):
    """What `Info` reports of the hosted model."""

    name: str
    vocab_size: int
    max_context: int
    eos_token_ids: tuple[int, ...]
    device: object
    choice: PathChoice


class PassCounting(Protocol):
    forwards: int  # forward passes run
    steps: int  # session steps they served


class Backend(Protocol):
    """Sessions over one model (or none): opened, used by one round at a time, released.

    Every method raises `specdec.core.errors` for a caller's mistake (unknown session, cap reached,
    bad tokens), never a bare exception."""

    tensor_parallel_size: int
    gamma_max: int  # the most draft tokens one round takes
    cost_profile: CostProfile | None  # set by `measure_costs`

    @property
    def loaded(self) -> ModelDescription: ...

    @property
    def batcher(self) -> PassCounting: ...

    @property
    def max_sessions(self) -> int: ...

    @property
    def live_sessions(self) -> int: ...

    def measure_costs(self, max_tokens: int, cache: ProfileCache | None = None,
                      progress: PassProgress | None = None) -> CostProfile:
        """Time forwards of 1..max_tokens tokens (or take them from `cache`), telling `progress` how far the
        measurement is; kept as `cost_profile`."""

    def open(self, session_id: str, params: SamplingParams) -> None: ...

    def release(self, session_id: str) -> bool:
        """End a session and free its caches (a model's may keep them for a later session that starts
        the same way: `specdec.engine.prefix_cache`); False if there was none."""

    def reports(self) -> list[dict]:
        """One RankReport's fields per worker process behind this backend."""

    def close(self) -> None:
        """Stop whatever the backend runs (threads, worker ranks). Idempotent."""


class DraftBackend(Backend, Protocol):
    def propose(self, session_id: str, start: int, tokens: list[int], gamma: int,
                min_confidence: float = 0.0, guess_first: bool = False) -> Proposal:
        """Sync to the committed prefix (`start`, `tokens`), then propose up to `gamma` tokens with
        their q (None: a point mass)."""


class TargetBackend(Backend, Protocol):
    def verify(self, session_id: str, start: int, tokens: list[int], draft_tokens: list[int],
               draft_probs: torch.Tensor | None, top_logprobs: int | None = None,
               prompt_top: int | None = None) -> Verification:
        """Sync to the committed prefix, score it and the drafts in one pass, run the rejection sampler.
        `prompt_top` (a session's first call): also each committed token's raw log-probability from position 1,
        with that many alternatives, every position computed (`specdec.core.logprobs`)."""
