"""A draft backend without a model: n-gram lookups behind the DraftService contract.

`python -m draft_service --model lookup` serves it. Each session keeps its committed tokens in an
n-gram index (`specdec.core.ngram`); a proposal is what followed the longest matching suffix, in the
session's own tokens or in the sequences of sessions that ended on this replica, which every
orchestrator routed here shares. A proposal is a point mass (no q is sent), so the target's
rejection sampler stays exact at any temperature. It may be empty: no match, nothing proposed,
and the round is a target-only step.

It answers to the same calls as `DraftEngine` (open, propose, release, the cost profile and the
reports `Info` reads), and describes itself as a model of no vocabulary of its own (0: any).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

from specdec.core.errors import InvalidArgument
from specdec.core.ngram import LOOKUP_MEMORY_TOKENS, LookupProposer, RecentSequences, shared_for
from specdec.core.params import SamplingParams
from specdec.core.rounds import PassLoad
from specdec.core.sequence import SequenceState, common_prefix
from specdec.engine.backend import Proposal, Rollback, resident_bytes
from specdec.engine.compute import PathChoice, describe_device
from specdec.engine.defaults import GAMMA_LIMIT
from specdec.engine.session_table import MAX_SESSIONS, SessionTable
from specdec.planning.cost import CostProfile

LOOKUP_MODEL = "lookup"  # the --model of a draft service without a model
MIN_N, MAX_N = 2, 4


@dataclass(frozen=True)
class LookupModel:
    """What `Info` reports of this backend (the fields of a loaded model it has)."""

    choice: PathChoice
    name: str = LOOKUP_MODEL
    vocab_size: int = 0  # any: a lookup proposes only token ids it was sent
    scored_tokens: int = 0
    max_context: int = 0  # none of its own: the target's applies
    eos_token_ids: tuple[int, ...] = ()
    device: str = "cpu"


@dataclass
class PassCounters:
    """No forward passes: the batching counters `Info` reports stay 0."""

    forwards: int = 0
    steps: int = 0


@dataclass
class LookupSession:
    proposer: LookupProposer
    state: SequenceState = field(default_factory=SequenceState)
    lock: threading.Lock = field(default_factory=threading.Lock)


class LookupEngine:
    tensor_parallel_size = 1

    def __init__(self, max_sessions: int = MAX_SESSIONS, gamma_max: int = GAMMA_LIMIT, memory_tokens: int = LOOKUP_MEMORY_TOKENS):
        self.gamma_max = gamma_max
        self.loaded = LookupModel(PathChoice("lookup", "ngram", describe_device(torch.device("cpu")), True))
        self.batcher = PassCounters()
        self.cost_profile: CostProfile | None = None
        self.recent = RecentSequences(memory_tokens, MIN_N, MAX_N) if memory_tokens else None
        self._sessions: SessionTable[LookupSession] = SessionTable(max_sessions)

    @property
    def max_sessions(self) -> int:
        return self._sessions.max_sessions

    def close(self) -> None:
        """Nothing runs beside the calls: no thread to stop."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def measure_costs(self, max_tokens: int, cache=None, progress=None) -> CostProfile:
        """Time lookups of 1..max_tokens tokens after a 128-token sequence (microseconds: no cache, no progress)."""
        proposer = LookupProposer(MIN_N, MAX_N)
        proposer.sync([t % 50 for t in range(128)])
        seconds = []
        for size in range(1, max_tokens + 1):
            began = time.perf_counter()
            for _ in range(20):
                proposer.propose(size)
            seconds.append(max((time.perf_counter() - began) / 20, 1e-7))
        self.cost_profile = CostProfile(tuple(seconds))
        return self.cost_profile

    # -- sessions ----------------------------------------------------------------------------------
    def open(self, session_id: str, params: SamplingParams) -> None:
        """A session; with a cache salt (a tenant's) it neither reads nor feeds the shared recent sequences."""
        params.validate()
        shared = shared_for(self.recent, params.cache_salt)
        self._sessions.add(session_id, lambda: LookupSession(LookupProposer(MIN_N, MAX_N, shared)))

    def release(self, session_id: str) -> bool:
        """End a session; its committed tokens join the replica's recent sequences (if it read them)."""
        session = self._sessions.pop(session_id)
        if session is None:
            return False
        if session.proposer.shared is not None and session.state.tokens:
            self.recent.add(session.state.tokens)
        return True

    @property
    def live_sessions(self) -> int:
        return len(self._sessions)

    def reports(self) -> list[dict]:
        cached = sum(len(s.state.tokens) for s in self._sessions.values())
        return [{"rank": 0, "pid": 0, "resident_bytes": resident_bytes(), "parameter_bytes": 0,
                 "live_sessions": self.live_sessions, "cached_tokens": cached}]

    # -- the draft call ------------------------------------------------------------------------------
    def propose(self, session_id: str, start: int, tokens: list[int], gamma: int,
                min_confidence: float = 0.0, guess_first: bool = False) -> Proposal:
        """Sync to the committed prefix, then propose up to `gamma` looked-up tokens (maybe none).
        A lookup has one answer, so its first token is already its guess of what comes next. γ = 0 takes the
        commit and proposes nothing."""
        if not 0 <= gamma <= self.gamma_max:
            raise InvalidArgument(f"gamma must be in [0, {self.gamma_max}] for a draft round, got {gamma}")
        if any(t < 0 for t in tokens):
            raise InvalidArgument(f"tokens holds negative token ids: {[t for t in tokens if t < 0][:5]}")
        session = self._sessions.get(session_id)
        with session.lock:
            began = time.perf_counter()
            replaced = session.state.tokens[start:]
            session.state.commit(start, tokens)
            session.proposer.sync(session.state.tokens)  # committed tokens only: proposals are not recorded
            found = session.proposer.propose(gamma).tokens if gamma else []
            dropped = len(replaced) - common_prefix(replaced, tokens)
            return Proposal(found, None, time.perf_counter() - began, Rollback(dropped, 0.0),
                            PassLoad(self.live_sessions, 1.0, 0.0))
