"""The draft side of a round: `DraftEngine.propose` drafts up to γ tokens on a session's KV cache (no RPC code)."""

from __future__ import annotations

import time

import torch

from specdec.core.coupling import coupled_tokens
from specdec.core.errors import InvalidArgument
from specdec.core.sampling import filtered_logits, position_generator, probs_from_logits, sample
from specdec.engine.backend import Proposal
from specdec.engine.model_engine import Engine


class DraftEngine(Engine):
    def propose(self, session_id: str, start: int, tokens: list[int], gamma: int,
                min_confidence: float = 0.0, guess_first: bool = False) -> Proposal:
        """Sync to the committed prefix, then draft up to `gamma` tokens autoregressively.

        Early stop: drafting ends once the product of the draft's top probabilities along the
        proposal falls below `min_confidence` (at least one token is always proposed). The
        output stays lossless: each proposed token still carries its exact q (with the coupled sampler
        none: each is the draft's coupled draw at its position, `specdec.core.coupling`).
        `guess_first`: the first token is the draft's most likely one (a guess of the target's bonus
        token, never verified as a draft; with the coupled sampler its coupled draw, the target's own
        where q = p); the rest are drawn as usual, at their own positions.
        γ = 0 feeds the committed tokens but the last (whose logits start the next round) and proposes
        nothing: a conversation's tokens fed between its turns.
        """
        if not 0 <= gamma <= self.gamma_max:
            raise InvalidArgument(f"gamma must be in [0, {self.gamma_max}] for a draft round, got {gamma}")
        if not 0.0 <= min_confidence < 1.0:
            raise InvalidArgument(f"min_confidence must be in [0, 1), got {min_confidence}")
        with self._held(session_id) as session:
            began = time.perf_counter()
            rollback = self._sync(session, start, tokens, gamma)
            state, params = session.state, session.params
            if gamma == 0:
                fed = state.pending()[:-1]
                if fed:
                    self._forward(session, fed, logits=0)
                    state.cached += len(fed)
                return Proposal([], None, time.perf_counter() - began, rollback, self._load(session), session.reused)
            logits = self._forward(session, state.pending())  # [1, V]
            drafted: list[int] = []
            probs: list[torch.Tensor] = []
            confidence = 1.0
            committed = state.tokens[:state.committed]
            for i in range(gamma):
                logits = self._process(session, logits, committed + drafted)  # this position's distribution
                if params.greedy:
                    token = int(logits[0].argmax())
                    if min_confidence > 0:
                        confidence *= float(logits[0].softmax(-1)[token])
                elif params.coupled:  # the target's own draw at this position if q == p; no q to send
                    filtered = filtered_logits(logits, params)  # [1, V]
                    token = coupled_tokens(filtered, params.seed, state.committed + i)[0]
                    if min_confidence > 0:  # as greedy's: a softmax over the vocabulary only where it is read
                        confidence *= float(filtered[0].softmax(-1).max())
                else:
                    q = probs_from_logits(logits, params)[0]  # [V]
                    gen = position_generator(params.seed, state.committed + i, "draft", q.device)
                    token = int(q.argmax()) if guess_first and i == 0 else sample(q, gen)
                    probs.append(q)
                    confidence *= float(q.max())
                drafted.append(token)
                if i == gamma - 1 or confidence < min_confidence:
                    break
                logits = self._forward(session, [token])
            # The last draft token is not fed yet; the next round feeds it if it is accepted.
            state.extend(drafted, cached=len(state.tokens) + len(drafted) - 1)
            q_all = torch.stack(probs).cpu() if probs else None  # [γ', V]
            return Proposal(drafted, q_all, time.perf_counter() - began, rollback, self._load(session),
                            session.reused)
