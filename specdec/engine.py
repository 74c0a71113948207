"""Model-side engines: per-session KV caches, drafting and verification (no RPC code).

`DraftEngine.propose` and `TargetEngine.verify` are the domain calls the gRPC servicers
translate to and from protobuf. Both keep a `DynamicCache` per session and crop it to the
committed prefix at the start of each round (see `specdec.kv`).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from specdec.errors import AlreadyExists, InvalidArgument, NotFound, OutOfRange, ResourceExhausted
from specdec.kv import SequenceState
from specdec.models import LoadedModel
from specdec.rejection import Verdict, verify_greedy, verify_sampled
from specdec.sampling import SamplingParams, position_generator, probs_from_logits, sample
from specdec.tp import parameter_bytes


@dataclass(frozen=True)
class Rollback:
    """The KV crop that started a round: cached tokens dropped and the time it took."""

    tokens: int = 0
    seconds: float = 0.0


@dataclass
class Session:
    params: SamplingParams
    state: SequenceState = field(default_factory=SequenceState)
    cache: DynamicCache = field(default_factory=DynamicCache)


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]
    probs: torch.Tensor | None  # [γ, V] float32 on CPU; None for greedy
    compute_s: float  # the whole round on this service, rollback included
    rollback: Rollback = Rollback()


@dataclass(frozen=True)
class Verification:
    verdict: Verdict
    compute_s: float
    rollback: Rollback = Rollback()


def resident_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class Engine:
    """Holds one model and its sessions. Forward passes are serialised by a lock."""

    tensor_parallel_size = 1

    def __init__(self, loaded: LoadedModel, max_sessions: int = 64, max_gamma: int = 16):
        self.loaded = loaded
        self.max_sessions = max_sessions
        self.max_gamma = max_gamma
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    # -- session lifecycle -------------------------------------------------
    def open(self, session_id: str, params: SamplingParams) -> None:
        if not session_id:
            raise InvalidArgument("session_id must be non-empty")
        params.validate()
        with self._lock:
            if session_id in self._sessions:
                raise AlreadyExists(f"session {session_id!r} is already open")
            if len(self._sessions) >= self.max_sessions:
                raise ResourceExhausted(f"service is at its cap of {self.max_sessions} live sessions")
            self._sessions[session_id] = Session(params)

    def release(self, session_id: str) -> bool:
        with self._lock:
            return self._sessions.pop(session_id, None) is not None

    @property
    def live_sessions(self) -> int:
        return len(self._sessions)

    def cached_tokens(self) -> dict[str, int]:
        """KV-cached tokens per live session; equal on every tensor-parallel rank when caches agree."""
        with self._lock:
            return {sid: s.cache.get_seq_length() for sid, s in self._sessions.items()}

    def report(self, rank: int = 0) -> dict:
        """This process's memory and KV state (a RankReport's fields)."""
        return {"rank": rank, "pid": os.getpid(), "resident_bytes": resident_bytes(),
                "parameter_bytes": parameter_bytes(self.loaded.model), "cached_tokens": self.cached_tokens()}

    def reports(self) -> list[dict]:
        """One report per worker process behind this engine (just this one unless tensor parallel)."""
        return [self.report()]

    def _session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise NotFound(f"unknown session {session_id!r}")
        return session

    # -- shared steps -------------------------------------------------------
    def _check_tokens(self, tokens: list[int], what: str) -> None:
        vocab = self.loaded.vocab_size
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise InvalidArgument(f"{what} holds token ids outside the vocabulary [0, {vocab}): {bad[:5]}")

    def _sync(self, session: Session, start: int, tokens: list[int], extra: int) -> Rollback:
        """Crop the cache to the committed prefix (`extra` tokens will be scored past it); returns the crop."""
        self._check_tokens(tokens, "tokens")
        if start + len(tokens) + extra > self.loaded.max_context:
            raise OutOfRange(f"sequence of {start + len(tokens) + extra} tokens exceeds the model's "
                             f"context of {self.loaded.max_context}")
        began = time.perf_counter()
        keep = session.state.commit(start, tokens)
        dropped = session.cache.get_seq_length() - keep
        if dropped > 0:
            session.cache.crop(-dropped)
        return Rollback(max(dropped, 0), time.perf_counter() - began)

    @torch.inference_mode()
    def _forward(self, session: Session, tokens: list[int]) -> torch.Tensor:
        """Feed `tokens` after the cached prefix; returns logits [len(tokens), V] float32."""
        ids = torch.tensor([tokens], dtype=torch.long, device=self.loaded.device)  # [1, S]
        out = self.loaded.model(input_ids=ids, past_key_values=session.cache, use_cache=True)
        return out.logits[0].float()  # [S, V]


class DraftEngine(Engine):
    def propose(self, session_id: str, start: int, tokens: list[int], gamma: int,
                min_confidence: float = 0.0) -> Proposal:
        """Sync to the committed prefix, then draft up to `gamma` tokens autoregressively.

        Early stop: drafting ends once the product of the draft's top probabilities along the
        proposal falls below `min_confidence` (at least one token is always proposed). The
        output stays lossless: each proposed token still carries its exact q.
        """
        if not 1 <= gamma <= self.max_gamma:
            raise InvalidArgument(f"gamma must be in [1, {self.max_gamma}] for a draft round, got {gamma}")
        if not 0.0 <= min_confidence < 1.0:
            raise InvalidArgument(f"min_confidence must be in [0, 1), got {min_confidence}")
        with self._lock:
            session = self._session(session_id)
            began = time.perf_counter()
            rollback = self._sync(session, start, tokens, gamma)
            state, params = session.state, session.params
            logits = self._forward(session, state.pending())[-1:]  # [1, V]
            drafted: list[int] = []
            probs: list[torch.Tensor] = []
            confidence = 1.0
            for i in range(gamma):
                if params.greedy:
                    token = int(logits[0].argmax())
                    if min_confidence > 0:
                        confidence *= float(logits[0].softmax(-1)[token])
                else:
                    q = probs_from_logits(logits, params)[0]  # [V]
                    gen = position_generator(params.seed, state.committed + i, "draft", q.device)
                    token = sample(q, gen)
                    probs.append(q)
                    confidence *= float(q.max())
                drafted.append(token)
                if i == gamma - 1 or confidence < min_confidence:
                    break
                logits = self._forward(session, [token])
            # The last draft token is not fed yet; the next round feeds it if it is accepted.
            state.extend(drafted, cached=len(state.tokens) + len(drafted) - 1)
            q_all = torch.stack(probs).cpu() if probs else None  # [γ', V]
            return Proposal(drafted, q_all, time.perf_counter() - began, rollback)


class TargetEngine(Engine):
    def verify(self, session_id: str, start: int, tokens: list[int], draft_tokens: list[int],
               draft_probs: torch.Tensor | None) -> Verification:
        """Score committed tail + drafts in one forward pass and run the rejection sampler.

        draft_probs: [γ, V] or None (greedy, or a deterministic proposer).
        With no draft tokens this is a plain target-only decoding step.
        """
        self.check_draft_probs(draft_tokens, draft_probs)
        with self._lock:
            began = time.perf_counter()
            session, committed, logits, rollback = self._score(session_id, start, tokens, draft_tokens)
            drafts = torch.tensor(draft_tokens, dtype=torch.long, device=logits.device)  # [γ]
            params = session.params
            if params.greedy:
                verdict = verify_greedy(drafts, logits)
            else:
                p = probs_from_logits(logits, params)  # [γ+1, V]
                q = None if draft_probs is None else draft_probs.to(p.device, torch.float32)
                gen = position_generator(params.seed, committed, "target", p.device)
                verdict = verify_sampled(drafts, q, p, gen)
            return Verification(verdict, time.perf_counter() - began, rollback)

    def score(self, session_id: str, start: int, tokens: list[int], draft_tokens: list[int]) -> None:
        """The forward pass of `verify` without sampling: what a tensor-parallel follower rank runs."""
        with self._lock:
            self._score(session_id, start, tokens, draft_tokens)

    def check_draft_probs(self, draft_tokens: list[int], draft_probs: torch.Tensor | None) -> None:
        """Checks that need q, which only the sampling rank receives; raised before any forward pass."""
        gamma = len(draft_tokens)
        if draft_probs is not None and tuple(draft_probs.shape) != (gamma, self.loaded.vocab_size):
            raise InvalidArgument(f"draft probabilities have shape {tuple(draft_probs.shape)}, "
                                  f"expected ({gamma}, {self.loaded.vocab_size})")

    def _score(self, session_id: str, start: int, tokens: list[int],
               draft_tokens: list[int]) -> tuple[Session, int, torch.Tensor, Rollback]:
        """Sync, feed pending + drafts; returns (session, committed length, logits [γ+1, V], rollback)."""
        gamma = len(draft_tokens)
        if gamma > self.max_gamma:
            raise InvalidArgument(f"at most {self.max_gamma} draft tokens per round, got {gamma}")
        self._check_tokens(draft_tokens, "draft_tokens")
        session = self._session(session_id)
        rollback = self._sync(session, start, tokens, gamma)
        state = session.state
        committed = state.committed
        logits = self._forward(session, state.pending() + draft_tokens)[-(gamma + 1):]  # [γ+1, V]
        state.extend(draft_tokens, cached=len(state.tokens) + gamma)
        return session, committed, logits, rollback
