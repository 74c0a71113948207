"""What a generation is asked for (`GenerationRequest`) and what it yields each round (`Chunk`): the contract
between the servicer, the resumable records and the speculate/verify loop (`orchestrator.generation`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.core.params import SamplingParams
from specdec.core.rounds import Estimates, RoundRecord
from specdec.core.stats import GenerationStats


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    max_new_tokens: int
    params: SamplingParams
    gamma: int | None  # None = adaptive
    stop: tuple[str, ...] = ()
    resumed: tuple[int, ...] = ()  # tokens generated before a resume, from the session record
    resume_from: int = 0  # of those, how many the client already holds
    top_logprobs: int | None = None  # None: no log-probabilities; k: each token's, with k alternatives
    prompt_top: int | None = None  # the same for the prompt's tokens (the target's raw distribution)
    proposer: str = "model"  # "model": the draft service; "ngram": prompt lookup here (`specdec.core.ngram`);
    # "hybrid": each round, whichever of the two promises more tokens per second
    overlap: str = "off"  # draft the next round during the verify: "on", "off", or "auto" (where it pays)
    stop_ids: tuple[int, ...] = ()  # ids that end the output as EOS does
    ignore_eos: bool = False  # the model's EOS does not end the output
    prediction: tuple[int, ...] = ()  # the output the client expects, a lookup source (`specdec.core.ngram.Prediction`)


@dataclass
class Chunk:
    token_ids: list[int]
    text: str
    record: RoundRecord
    estimates: Estimates = Estimates()  # the controller's, after the round
    stats: GenerationStats | None = None  # on the last chunk only
    logprobs: list = field(default_factory=list)  # pb.TokenLogprob per token, when asked for
    # On the first chunk, when the prompt's log-probabilities were asked for: its tokens, and theirs from position 1.
    prompt_ids: list[int] = field(default_factory=list)
    prompt_logprobs: list = field(default_factory=list)
