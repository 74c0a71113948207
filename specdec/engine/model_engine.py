"""The model-side engine both roles share: per-session KV caches, syncing and rollback, forward passes (no RPC code).

Sessions run their rounds concurrently; their forward steps meet in shared passes
(`specdec.engine.batcher`), which change speed but not a single bit of any session's logits.

`DraftEngine.propose` (`draft_engine`) and `TargetEngine.verify` (`target_engine`) are the domain calls the
gRPC servicers translate to and from protobuf. Both keep a `KVCache` per session and crop it to the
committed prefix at the start of each round (see `specdec.core.sequence`); the forward passes run on the
model's `ModelRunner`, on the compute path it was loaded with.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from specdec.core.errors import Cancelled, InvalidArgument, OutOfRange, ResourceExhausted
from specdec.core.params import SamplingParams
from specdec.core.processing import process_logits
from specdec.core.rounds import PassLoad
from specdec.core.sequence import SequenceState, common_prefix, longest_shared
from specdec.engine.backend import Rollback, resident_bytes
from specdec.engine.batcher import PassShape, StepBatcher
from specdec.engine.constraint import Grammars, GrammarState
from specdec.engine.defaults import GAMMA_LIMIT, PREFIX_CACHE_BYTES, SHARED_SLOWDOWN
from specdec.engine.kvcache import KVCache
from specdec.engine.measure import PassProgress, measure
from specdec.engine.models import LoadedModel
from specdec.engine.prefix_cache import PrefixCache
from specdec.engine.profile_cache import ProfileCache, load_or_measure, profile_key
from specdec.engine.runner import Step
from specdec.engine.session_table import MAX_SESSIONS, SessionTable
from specdec.planning.cost import CostProfile, batch_sizes, positions_past, shared_prompt_chunk

PREFILL_CHUNK = 256  # longest forward; a longer prompt is fed in chunks (bounds attention memory)
# With other sessions live, a prompt goes in smaller chunks, each sharing a pass with their decode
# steps: as many tokens as keep that pass within SHARED_SLOWDOWN × their pass alone, priced by the
# cost profile (`shared_prompt_chunk`), so a long prompt slows everyone's next token by at most that
# factor, never stalls it. Without a profile, SHARED_PREFILL_CHUNK.
SHARED_PREFILL_CHUNK = 32
BATCH_PROFILE = 8  # the profile covers passes of up to 8 sessions' full verify blocks
REUSE_MIN_TOKENS = 16  # a shorter shared prefix is recomputed rather than copied
RowsSink = Callable[[int, torch.Tensor], None]  # (offset, logits [n, V]) of fed tokens [offset, offset + n)


@dataclass
class Session:
    params: SamplingParams
    cache: KVCache
    state: SequenceState = field(default_factory=SequenceState)
    lock: threading.Lock = field(default_factory=threading.Lock)  # held for a round
    passes: list[PassShape] = field(default_factory=list)  # the shared passes of the current round's outputs
    forward_s: float = 0.0  # the current round's steps: seconds in forward passes …
    wait_s: float = 0.0  # … and waiting for them to begin
    grammar: GrammarState | None = None  # a constrained session's matcher
    reused: int = 0  # this round's positions whose keys and values came from another session's cache
    ended: bool = False  # released (its stream ended or was cancelled): a round still running stops at its next chunk


class Engine:
    """Holds one model and its sessions; concurrent sessions share forward passes."""

    tensor_parallel_size = 1

    def __init__(self, loaded: LoadedModel, max_sessions: int = MAX_SESSIONS, gamma_max: int = GAMMA_LIMIT,
                 prefix_cache_bytes: int = PREFIX_CACHE_BYTES, prompt_slowdown: float = SHARED_SLOWDOWN):
        self.loaded = loaded
        self.gamma_max = gamma_max
        if not prompt_slowdown >= 1.0:
            raise ValueError(f"prompt_slowdown must be at least 1, got {prompt_slowdown}")
        self.prompt_slowdown = prompt_slowdown  # `prompt_chunk`: what a prompt may cost the sessions beside it
        self.runner = loaded.runner
        self.cost_profile: CostProfile | None = None
        self._sessions: SessionTable[Session] = SessionTable(max_sessions)  # rounds hold their session's lock
        # Ended sessions' caches, for later sessions that start the same way. Only where a cache's bits do
        # not depend on how it was computed (row-invariant paths): then reuse changes no output.
        self.prefix_cache = PrefixCache(prefix_cache_bytes if loaded.choice.row_invariant else 0)
        self.batcher = StepBatcher(self.runner)
        self.grammars = Grammars(loaded.name, loaded.vocab_size)

    @property
    def max_sessions(self) -> int:
        return self._sessions.max_sessions

    def close(self) -> None:
        """Stop the batcher's thread; the engine runs no more steps (a later one raises Unavailable)."""
        self.batcher.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def measure_costs(self, max_tokens: int, cache: ProfileCache | None = None,
                      progress: PassProgress | None = None) -> CostProfile:
        """Time forwards of 1..max_tokens tokens, and shared passes up to BATCH_PROFILE× that
        (`specdec.planning.cost`); kept as `cost_profile`. With a `cache`, a profile measured before
        for the same model, path, hardware and sizes is used instead (`specdec.engine.profile_cache`).
        `progress`: told how far a measurement is (`specdec.engine.measure.measure`); not called for a cached one.

        Run at start-up, before any session: the timings are of this model alone."""
        self.cost_profile = load_or_measure(
            cache, lambda: self.profile_key(max_tokens),
            lambda: measure(self.runner, max_tokens, BATCH_PROFILE * max_tokens, vocab=self.loaded.vocab_size,
                            progress=progress))
        return self.cost_profile

    def use_profile(self, profile: CostProfile) -> None:
        """Take a profile measured elsewhere (a tensor-parallel rank 0's): it sizes `prompt_chunk`."""
        self.cost_profile = profile

    def profile_key(self, max_tokens: int, world: int = 1) -> dict:
        choice = self.loaded.choice
        return profile_key(self.loaded.name, choice.path, choice.kernel, choice.device,
                           batch_sizes(max_tokens, BATCH_PROFILE * max_tokens), world, self.runner.scored_tokens())

    # -- session lifecycle -------------------------------------------------
    def open(self, session_id: str, params: SamplingParams) -> None:
        params.validate()
        self._check_tokens([t for t, _ in params.logit_bias] + list(params.ending_ids), "sampling")
        grammar = self.grammars.state(params.grammar) if params.grammar else None
        self._sessions.add(session_id, lambda: Session(params, self._new_cache(), grammar=grammar))

    def _new_cache(self):
        """A fresh cache; where the runner's KV pool is full, kept caches give their slots back, oldest first."""
        return self._evicting(self.runner.new_cache)

    def _evicting(self, attempt):
        """`attempt()`; where it finds the KV pool or the memory short (ResourceExhausted), kept caches go, oldest
        first, until it succeeds, or ResourceExhausted once none is left."""
        while True:
            try:
                return attempt()
            except ResourceExhausted:
                if not self.prefix_cache.evict_oldest():
                    raise

    def release(self, session_id: str) -> bool:
        """End the session; its cache is kept for a later session that starts the same way (`PrefixCache`)."""
        self.batcher.forget(session_id)
        session = self._sessions.pop(session_id)
        if session is None:
            return False
        session.ended = True
        self._keep_cache(session)
        return True

    def _keep_cache(self, session: Session) -> None:
        """Keep an ended session's cache, cut to the positions whose tokens it knows. Not while a round
        still writes to it (a stream cancelled mid-round): that cache is dropped."""
        if not session.lock.acquire(blocking=False):
            return
        try:
            length = min(session.cache.length, session.state.cached)
            if length >= REUSE_MIN_TOKENS:
                session.cache.crop(length)
                self.prefix_cache.keep(session.state.tokens[:length], session.cache, session.cache.own_bytes(),
                                       session.params.cache_salt)
        finally:
            session.lock.release()

    @property
    def live_sessions(self) -> int:
        return len(self._sessions)

    def cached_tokens(self) -> int:
        """KV-cached tokens over all live sessions; equal on every tensor-parallel rank when caches agree."""
        return sum(s.cache.length for s in self._sessions.values())

    def report(self, rank: int = 0) -> dict:
        """This process's memory and KV state (a RankReport's fields)."""
        return {"rank": rank, "pid": os.getpid(), "resident_bytes": resident_bytes(),
                "parameter_bytes": self.runner.weight_bytes(), "live_sessions": self.live_sessions,
                "cached_tokens": self.cached_tokens(), "kept_tokens": self.prefix_cache.tokens}

    def reports(self) -> list[dict]:
        """One report per worker process behind this engine (just this one unless tensor parallel)."""
        return [self.report()]

    @contextlib.contextmanager
    def _held(self, session_id: str) -> Iterator[Session]:
        """One round of one session: the session is held (a retried round waits for the first) and
        its forward steps may share passes with other sessions' (`specdec.engine.batcher`)."""
        session = self._sessions.get(session_id)
        with session.lock, self.batcher.taking_part(session_id):
            session.passes, session.forward_s, session.wait_s, session.reused = [], 0.0, 0.0, 0
            yield session

    def _load(self, session: Session) -> PassLoad:
        """The load this round met: live sessions, and its passes averaged (rows and tokens per pass)."""
        passes = session.passes or [PassShape(1, 0)]
        return PassLoad(self.live_sessions, sum(p.rows for p in passes) / len(passes),
                        sum(p.tokens for p in passes) / len(passes), session.forward_s, session.wait_s)

    # -- shared steps -------------------------------------------------------
    def _check_tokens(self, tokens: list[int], what: str) -> None:
        vocab = self.loaded.vocab_size
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise InvalidArgument(f"{what} holds token ids outside the vocabulary [0, {vocab}): {bad[:5]}")

    def _sync(self, session: Session, start: int, tokens: list[int], extra: int, reuse: bool = True) -> Rollback:
        """Crop the cache to the committed prefix (`extra` tokens will be scored past it); returns the crop.
        `reuse`: a fresh session may take a shared prefix's KV from another session's cache."""
        self._check_tokens(tokens, "tokens")
        if start + len(tokens) + extra > self.loaded.max_context:
            raise OutOfRange(f"sequence of {start + len(tokens) + extra} tokens exceeds the model's "
                             f"context of {self.loaded.max_context}")
        began = time.perf_counter()
        dropped = session.cache.crop(session.state.commit(start, tokens))
        if session.cache.length == 0 and reuse:
            self._reuse_prefix(session)
        return Rollback(dropped, time.perf_counter() - began)

    def _reuse_prefix(self, session: Session) -> None:
        """A fresh session whose tokens start like an ended session's reuses that session's kept cache
        (`PrefixCache.reuse`: taken for a chat's next turn, its shared part copied for another chat with the
        same system prompt), or like a live session's copies that session's cached KV for the shared prefix
        (n choices of one prompt), instead of computing it; whichever shares more. On a row-invariant path
        either is the very bits a prefill would give. The live donor is the one with the longest shared prefix
        (the first such one opened), chosen the same way on every tensor-parallel rank; its lock is held while
        its cache is read. Only sessions of the same cache salt share (`SamplingParams.cache_salt`)."""
        state, salt = session.state, session.params.cache_salt
        donors = ((other, other.state.tokens[:other.cache.length]) for other in self._sessions.values()
                  if other is not session and other.cache.length and other.params.cache_salt == salt)
        best, shared = longest_shared(state.tokens, donors, REUSE_MIN_TOKENS) or (None, REUSE_MIN_TOKENS - 1)
        found = self.prefix_cache.reuse(state.tokens[:-1], shared + 1, salt,  # one token is left to feed
                                        lambda kept, length: self.runner.copy_prefix(kept, session.cache, length),
                                        slack=self.gamma_max + 1)
        if found is not None:
            taken, length = found
            if taken is not None:
                session.cache = taken
                taken.crop(length)
            state.cached = session.reused = length
            return
        if best is None:
            return
        with best.lock:
            length = min(common_prefix(state.tokens, best.state.tokens[:best.cache.length]), len(state.tokens) - 1)
            if length >= REUSE_MIN_TOKENS:
                self.runner.copy_prefix(best.cache, session.cache, length)
                state.cached = session.reused = length

    def _process(self, session: Session, logits: torch.Tensor, tokens: list[int],
                 proposed: list[int] = ()) -> torch.Tensor:
        """logits [N, V] as the session's distribution of row i's token, which follows tokens +
        proposed[:i]: penalties and bias (`specdec.core.processing`), then what the grammar refuses
        set to -inf. Unchanged for a session with neither."""
        logits = process_logits(logits, session.params, tokens, proposed)
        if session.grammar is None:
            return logits
        output = tokens[session.params.prompt_tokens:]
        allowed = session.grammar.masks(output, list(proposed), logits.shape[0], logits.device)  # [N, V]
        return logits.float().masked_fill(~allowed, float("-inf"))

    def _forward(self, session: Session, tokens: list[int], logits: int = 1,
                 every_row: RowsSink | None = None) -> torch.Tensor:
        """Feed `tokens` after the cached prefix; returns the last `logits` positions' logits [logits, V].

        Long inputs go in chunks, each sized as it starts (`prompt_chunk`: PREFILL_CHUNK alone, smaller
        beside other sessions, so that a session arriving mid-prompt gets its share from the next chunk);
        the last chunk holds every position that needs logits. Chunking does not change the result
        (`specdec.engine.attention`). A session released mid-prompt (its stream cancelled) stops before
        its next chunk: Cancelled, and the passes it no longer needs are not run.
        `every_row`: also called with (i, logits [n, V]) for every chunk, the logits of tokens[i:i + n]'s
        positions, in order: every position's logits, a chunk at a time (a prompt's log-probabilities).
        """
        begin, total = 0, len(tokens)
        while begin < total:
            if begin and session.ended:
                raise Cancelled(f"the session ended with {total - begin} of its {total} tokens not yet fed")
            chunk = max(self.prompt_chunk(session), logits)
            end = total if total - begin <= chunk else begin + min(chunk, total - begin - logits)
            rows = end - begin if every_row is not None else 0 if end < total else logits
            out, shape = self._step(session, Step(session.cache, tokens[begin:end], logits=rows))
            if every_row is not None:
                every_row(begin, out)
            begin = end
        session.passes.append(shape)
        return out[out.shape[0] - logits:]

    def prompt_chunk(self, session: Session) -> int:
        """The most tokens of `session`'s prompt one pass takes now: PREFILL_CHUNK alone; beside other live
        sessions, what keeps their passes within `prompt_slowdown` × their time alone, each priced at its
        depth (the others' caches and the prompt's own). A function of the profile and the live sessions'
        caches alone, so equal on every tensor-parallel rank: they share rank 0's profile, and their sessions
        change only between the commands the front runs one at a time."""
        others = [s for s in self._sessions.values() if s is not session]
        if not others:
            return PREFILL_CHUNK
        if self.cost_profile is None:
            return SHARED_PREFILL_CHUNK
        others_past = sum(positions_past(1, s.cache.length) for s in others)
        return shared_prompt_chunk(self.cost_profile, len(others), PREFILL_CHUNK, self.prompt_slowdown,
                                   others_past, session.cache.length)

    def _step(self, session: Session, step: Step) -> tuple[torch.Tensor, PassShape]:
        """One step in a shared pass; its time counts to the session's round. Its cache grows first, here, so
        that a refusal (`KVCache.reserve`) is this session's alone, not its pass's."""
        self._evicting(lambda: step.cache.reserve(step.cache.length + len(step.tokens)))
        out, shape = self.batcher.forward_shaped(step)
        session.forward_s += shape.seconds
        session.wait_s += shape.waited_s
        return out, shape

    def score(self, session_id: str, start: int, tokens: list[int], draft_tokens: list[int],
              prompt_rows: bool = False) -> torch.Tensor:
        """Sync to the committed prefix and score its uncached tail plus `draft_tokens` in one pass;
        returns the logits [γ+1, V] of the last γ+1 positions. `verify` without the sampler: what a
        tensor-parallel follower rank runs (`prompt_rows`: the passes of a verify that computes a prompt's
        log-probabilities, whose logits rank 0 alone keeps)."""
        with self._held(session_id) as session:
            return self._score(session, start, tokens, draft_tokens, (lambda i, rows: None) if prompt_rows else None)[1]

    def cached(self, session_id: str) -> int:
        """Tokens in the session's KV cache."""
        return self._sessions.get(session_id).cache.length

    def _score(self, session: Session, start: int, tokens: list[int], draft_tokens: list[int],
               every_row: RowsSink | None = None) -> tuple[int, torch.Tensor, Rollback]:
        """Sync, feed pending + drafts; returns (committed length, logits [γ+1, V], rollback).
        `every_row` (`_forward`): the session must be new, and takes no cached prefix, so that every
        position is computed, from the first."""
        gamma = len(draft_tokens)
        if gamma > self.gamma_max:
            raise InvalidArgument(f"at most {self.gamma_max} draft tokens per round, got {gamma}")
        self._check_tokens(draft_tokens, "draft_tokens")
        if every_row is not None and session.state.tokens:
            raise InvalidArgument("prompt log-probabilities are computed on a session's first call only")
        rollback = self._sync(session, start, tokens, gamma, reuse=every_row is None)
        state = session.state
        committed = state.committed
        logits = self._forward(session, state.pending() + draft_tokens, gamma + 1, every_row)  # [γ+1, V]
        state.extend(draft_tokens, cached=len(state.tokens) + gamma)
        return committed, logits, rollback
