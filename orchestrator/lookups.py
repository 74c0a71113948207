"""Lookup proposals in the speculate/verify loop: found (prompt lookup, earlier sessions, a client's prediction:
`specdec.core.ngram`), priced against the draft model and target-only rounds (hybrid), and learned per kind.

A lookup is a point mass with no q and no hop: it costs no draft time, so it is priced as a free proposer at
its kind's learned α (`GammaController.best_free`).
"""

from __future__ import annotations

import dataclasses
import math

from specdec.core.ngram import Lookup, LookupProposer, Prediction, RecentSequences
from specdec.core.rounds import ALPHA_MAX
from specdec.core.sequence import common_prefix
from specdec.planning.controller import GammaController
from specdec.planning.prior import LookupPrior

LOOKUP_MIN_N, LOOKUP_MAX_N = 2, 4  # suffix lengths prompt lookup matches (vLLM's prompt_lookup_min/max)
# What a lookup's α is learned under (`Lookup.kind`): where it matched (this sequence, or an earlier
# session's), how long a suffix, and whether that suffix recurred there.
LOOKUP_KINDS = [("self", n, False) for n in range(LOOKUP_MIN_N, LOOKUP_MAX_N + 1)] + \
    [("shared", n, often) for n in range(LOOKUP_MIN_N, LOOKUP_MAX_N + 1) for often in (False, True)] + \
    [("prediction", n, False) for n in range(LOOKUP_MIN_N, LOOKUP_MAX_N + 3)]  # + 1, + 2: `Prediction`'s own
# The α hybrid prices the first lookup of a kind no session tried at (`Lookups.priced`): as if accepted whole
# (the largest an estimate gives), or a kind whose prior loses to a good draft model would never be tried, nor
# learned. A miss costs one round.
UNTRIED_ALPHA = ALPHA_MAX
# The most tokens that first try proposes. Its verdict on them measures the kind's α (and rounds that find a lookup
# but draft otherwise go on measuring it: `observe_shadow`), while a miss costs a verify of 3, not of 9: on a CPU a
# pass of 9 tokens costs about 3 of one, and beside other sessions it is their pass that grows (8 users on a Zen 5:
# three such tries of 8 tokens, 0 / 0 / 3 accepted, in every burst).
UNTRIED_TOKENS = 2


class Lookups:
    """One generation's lookups: its index over the committed tokens, and α per kind (from `prior`, which
    gets them back at the end: `finish`). `with_model`: hybrid, whose lookups compete with a draft model."""

    def __init__(self, prompt_length: int, prediction: list[int], recent: RecentSequences | None,
                 prior: LookupPrior, controller: GammaController, with_model: bool):
        predicted = Prediction(prediction, prompt_length, LOOKUP_MIN_N, LOOKUP_MAX_N) if prediction else None
        self.proposer = LookupProposer(LOOKUP_MIN_N, LOOKUP_MAX_N, recent, predicted)
        self.prior, self.controller, self.with_model = prior, controller, with_model
        self.acceptance = prior.estimates()
        self.shadow: Lookup | None = None  # found this round but not proposed (`observe_shadow`)
        self.prediction_tried = False  # a prediction was proposed in this generation (`priced`)
        self.misses = 0  # `propose`'s rounds in a row that found nothing
        self._found: tuple[tuple[int, int], Lookup] | None = None  # ((tokens synced, cap), what `_find` found there)

    def sync(self, committed: list[int]) -> None:
        self.proposer.sync(committed)

    def _find(self, cap: int) -> Lookup:
        """The synced index's lookup of at most `cap` tokens, looked up once for each length synced."""
        key = (len(self.proposer.index.tokens), cap)
        if self._found is None or self._found[0] != key:
            self._found = key, self.proposer.propose(cap)
        return self._found[1]

    def propose(self, gamma: int) -> Lookup:
        """Up to γ looked-up tokens (prompt lookup alone: no pricing)."""
        found = self.proposer.propose(gamma)
        self.misses = 0 if found.tokens else self.misses + 1
        return found

    def quiet_steps(self, chunk: int) -> int:
        """How many steps a target-only round takes after `propose` found nothing `misses` rounds in a row:
        2^(misses - 1), at most `chunk`. Each round looks once, at its start, so a copy that begins soon after
        a match is caught within a few tokens, and a text with nothing to copy soon takes whole chunks (one
        hop each: on the H200, one step a round cost 1.45× a token)."""
        return max(1, min(chunk, 2 ** max(0, self.misses - 1)))

    def priced(self, cap: int) -> tuple[float, Lookup] | None:
        """The synced index's lookup of at most `cap` tokens, cut to its best γ' ≤ its length, and its
        expected tokens per second E(α_k, γ')/T(γ'), with α_k learned for its kind (`UNTRIED_ALPHA` for a
        kind not yet tried, whose try is at most `UNTRIED_TOKENS` long) and no draft cost; None when it finds
        nothing worth a token. A client's prediction is proposed whole on its first find in a generation, at an
        infinite rate: its α is this request's, which no other session measures, and a busy machine's noisy
        verify cost could price it out before it was ever tried (a verify of 2 at 2.8× a step, on CI)."""
        found = self._find(cap)
        if not found.tokens:
            return None
        if found.source == "prediction" and not self.prediction_tried:
            return math.inf, found
        longest, alpha = self._priced_at(found)
        best, rate = self.controller.best_free(alpha, longest)
        return (rate, dataclasses.replace(found, tokens=found.tokens[:best])) if best > 0 else None

    def _priced_at(self, found: Lookup) -> tuple[int, float]:
        """The most tokens of `found` that `priced` prices, and the α it prices them at: its kind's learned α, or
        `UNTRIED_ALPHA` for at most `UNTRIED_TOKENS` where no session tried its kind."""
        if self.with_model and self.prior.untried(found.kind):
            return min(len(found.tokens), UNTRIED_TOKENS), UNTRIED_ALPHA
        return len(found.tokens), self.acceptance[found.kind].alpha

    def found_alphas(self, cap: int, committed: list[int]) -> dict[int, float]:
        """The α `priced` would price this round's lookup of at most `cap` tokens over `committed` at, by the most
        tokens it would propose ({}: nothing found; a client's first prediction is not priced: the caller's case).
        Only what is found counts: priced at the highest α of every kind it could find, an untried kind's
        `UNTRIED_ALPHA` kept 8 users' rounds on a Zen 4 from settling, each priced in full (0.2 ms of Python a
        round, the 8 one after another between passes) to decode target-only in all but a few."""
        self.sync(committed)
        found = self._find(cap)
        if not found.tokens:
            return {}
        longest, alpha = self._priced_at(found)
        return {longest: alpha}

    def over(self, drafted: int, cap: int, committed: list[int]) -> Lookup | None:
        """With the model's proposal of `drafted` tokens already drafted (a prefetched branch): a lookup of at
        most `cap` tokens that promises more tokens per second than it, or None. Neither costs draft time
        now, so each is priced as a free proposer at its own α."""
        self.sync(committed)
        priced = self.priced(cap)
        _, drafted_rate = self.controller.best_free(self.controller.acceptance.alpha, drafted)
        if priced is not None and priced[0] > drafted_rate:
            return priced[1]
        self.shadow = priced[1] if priced is not None else None
        return None

    def proposed(self, lookup: Lookup) -> None:
        """`lookup` goes to the target this round: its kind counts as tried from now on (`LookupPrior.tried`)."""
        self.prior.tried(lookup.kind)
        self.prediction_tried |= lookup.source == "prediction"

    def observe(self, lookup: Lookup, drafted: int, accepted: int) -> None:
        """A proposed lookup's verdict: `accepted` of its `drafted` tokens."""
        self.acceptance[lookup.kind].observe(drafted, accepted)

    def observe_shadow(self, committed: list[int]) -> None:
        """Learn the α of a lookup that was found this round but not proposed, from the tokens the round
        committed, as if it had been: its tokens up to the first that differs would have been accepted (a point
        mass x is accepted with probability p(x), the probability that the target's token is x), and what lies
        past the round's tokens is unknown (no rejection is counted there). Without it a kind priced below the
        draft model at its prior α would never be proposed, nor learned."""
        shadow, self.shadow = self.shadow, None
        if shadow is None:
            return
        seen = shadow.tokens[:len(committed)]
        same = common_prefix(seen, committed)
        self.acceptance[shadow.kind].observe(min(same + 1, len(seen)), same)

    def finish(self) -> None:
        """Hand the learned α back to the prior, for later generations (hybrid's only: plain prompt lookup
        is not priced)."""
        if self.with_model:
            self.prior.absorb(self.acceptance)
