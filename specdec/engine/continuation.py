"""A verify followed by target-only steps in the same call: several tokens for one round trip.

A target-only round costs one step and one hop between the orchestrator and the target, and at GPU
speeds the hop and the host's work around it are a third of the round (docs/PERFORMANCE.md). Here
the target takes the next steps itself: each is the verify the orchestrator would send next (the
tokens just emitted committed, no drafts), so each token is sampled exactly as it would be a round
later, with the same keyed randomness for its position, and the output cannot change.
"""

from __future__ import annotations

import dataclasses

import torch

from specdec.core.errors import InvalidArgument
from specdec.core.rounds import MAX_EXTRA_STEPS
from specdec.engine.backend import TargetBackend, Verification


def verify_and_continue(engine: TargetBackend, session_id: str, start: int, tokens: list[int],
                        draft_tokens: list[int], draft_probs: torch.Tensor | None, top_logprobs: int | None,
                        extra_steps: int = 0, stop_ids: frozenset[int] = frozenset(),
                        prompt_top: int | None = None) -> Verification:
    """`engine.verify`, then up to `extra_steps` target-only steps, each after the tokens before it; they
    end early after a token in `stop_ids` or at the model's context. Returns one Verification: the
    verdict's tokens followed by the steps' (num_accepted is the verify's), compute and the passes' seconds
    summed (the load's rows and tokens are the verify's pass), `passes` counting the verify and each step.
    `prompt_top`: the verify's (`TargetBackend.verify`)."""
    if not 0 <= extra_steps <= MAX_EXTRA_STEPS:
        raise InvalidArgument(f"extra_steps must be in [0, {MAX_EXTRA_STEPS}], got {extra_steps}")
    first = engine.verify(session_id, start, tokens, draft_tokens, draft_probs, top_logprobs, prompt_top)
    emitted, logprobs = list(first.verdict.tokens), list(first.logprobs or [])
    compute_s, forward_s, wait_s, passes = first.compute_s, first.load.forward_s, first.load.wait_s, 1
    position, new = start + len(tokens), emitted[:]
    context = engine.loaded.max_context
    while passes <= extra_steps and stop_ids.isdisjoint(new) and position + len(new) < context:
        step = engine.verify(session_id, position, new, [], None, top_logprobs)
        position, new = position + len(new), list(step.verdict.tokens)
        emitted += new
        logprobs += step.logprobs or []
        compute_s, passes = compute_s + step.compute_s, passes + 1
        forward_s, wait_s = forward_s + step.load.forward_s, wait_s + step.load.wait_s
    if passes == 1:
        return first
    return dataclasses.replace(first, verdict=dataclasses.replace(first.verdict, tokens=emitted),
                               compute_s=compute_s, logprobs=None if first.logprobs is None else logprobs,
                               load=dataclasses.replace(first.load, forward_s=forward_s, wait_s=wait_s),
                               passes=passes)
