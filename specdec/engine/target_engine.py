"""The target side of a round: `TargetEngine.verify` scores the drafts in one pass and runs the rejection
sampler (no RPC code)."""

from __future__ import annotations

import time

import torch

from specdec.core.coupling import coupled_tokens
from specdec.core.errors import InvalidArgument
from specdec.core.logprobs import token_logprobs
from specdec.core.params import TokenLogprob, check_top_logprobs
from specdec.core.rejection import verify_choices, verify_greedy, verify_sampled
from specdec.core.sampling import filtered_logits, position_generator, probs_from_logits
from specdec.engine.backend import Verification
from specdec.engine.model_engine import Engine

PROB_SUM_TOLERANCE = 1e-3  # float32 sums over a 152k vocabulary stay well inside this


class TargetEngine(Engine):
    def verify(self, session_id: str, start: int, tokens: list[int], draft_tokens: list[int],
               draft_probs: torch.Tensor | None, top_logprobs: int | None = None,
               prompt_top: int | None = None) -> Verification:
        """Score committed tail + drafts in one forward pass and run the rejection sampler.

        draft_probs: [γ, V] or None (greedy, or a deterministic proposer).
        With no draft tokens this is a plain target-only decoding step.
        top_logprobs: None = no log-probabilities; k = each emitted token's, with its k most likely
        alternatives (`specdec.core.logprobs`), from the rows just verified.
        prompt_top: None, or k = each committed token's raw log-probability after the ones before it
        (positions 1.., a prompt's: the session's first call), with k alternatives; that call computes
        every position, taking no shared prefix from another session's cache.
        """
        self.check_request(draft_tokens, draft_probs, top_logprobs, prompt_top)
        with self._held(session_id) as session:
            began = time.perf_counter()
            prompt: list[TokenLogprob] = []
            sink = None if prompt_top is None else \
                lambda i, rows: prompt.extend(token_logprobs(rows, tokens[i + 1:i + 1 + rows.shape[0]], None, prompt_top))
            committed, logits, rollback = self._score(session, start, tokens, draft_tokens, sink)
            params = session.params
            # Row i is processed with the committed tokens and the first i drafts: target-only's state.
            logits = self._process(session, logits, session.state.tokens[:committed], draft_tokens)
            if params.greedy:
                verdict = verify_greedy(draft_tokens, logits)
            elif params.coupled:  # each position's coupled draw, whatever was drafted; q is not needed
                draws = coupled_tokens(filtered_logits(logits, params), params.seed, committed)  # [γ+1]
                verdict = verify_choices(draft_tokens, draws)
            else:
                p = probs_from_logits(logits, params)  # [γ+1, V]
                q = None if draft_probs is None else draft_probs.to(p.device, torch.float32)
                gen = position_generator(params.seed, committed, "target", p.device)
                drafts = torch.tensor(draft_tokens, dtype=torch.long, device=p.device)  # [γ]
                verdict = verify_sampled(drafts, q, p, gen)
            logprobs = None if top_logprobs is None else \
                token_logprobs(logits, verdict.tokens, params, top_logprobs)
            return Verification(verdict, time.perf_counter() - began, rollback, self._load(session), logprobs,
                                reused=session.reused, prompt_logprobs=None if prompt_top is None else prompt)

    def check_request(self, draft_tokens: list[int], draft_probs: torch.Tensor | None,
                      top_logprobs: int | None, prompt_top: int | None = None) -> None:
        """Everything about a verify request that can be refused before any forward pass (and, with
        tensor parallelism, before any rank is told to run it)."""
        for top in (top_logprobs, prompt_top):
            if top is not None:
                check_top_logprobs(top)
        self.check_draft_probs(draft_tokens, draft_probs)

    def check_draft_probs(self, draft_tokens: list[int], draft_probs: torch.Tensor | None) -> None:
        """The target trusts no draft: q must be a distribution per row that could have drawn each
        proposed token. Raised before any forward pass, so a bad proposal commits nothing."""
        gamma = len(draft_tokens)
        if draft_probs is None:
            return
        if tuple(draft_probs.shape) != (gamma, self.loaded.vocab_size):
            raise InvalidArgument(f"draft probabilities have shape {tuple(draft_probs.shape)}, "
                                  f"expected ({gamma}, {self.loaded.vocab_size})")
        if gamma == 0:
            return
        q = draft_probs.to(torch.float64)
        if not bool(torch.isfinite(q).all()) or bool((q < 0).any()):
            raise InvalidArgument("draft probabilities must be finite and non-negative")
        sums = q.sum(dim=-1)  # [γ]
        if bool(((sums - 1.0).abs() > PROB_SUM_TOLERANCE).any()):
            raise InvalidArgument(f"each row of draft probabilities must sum to 1 (±{PROB_SUM_TOLERANCE}), "
                                  f"got sums {[round(float(s), 6) for s in sums[:4]]}")
        chosen = q[torch.arange(gamma), torch.tensor(draft_tokens, dtype=torch.long).clamp(0, q.shape[1] - 1)]
        if bool((chosen <= 0).any()):
            raise InvalidArgument("a proposed token has draft probability 0: q could not have drawn it")
