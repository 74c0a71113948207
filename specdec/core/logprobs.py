"""Log-probabilities of emitted tokens, computed by the target from the rows it verifies with.

What the numbers are: the log-probability of each emitted token under the distribution it was
drawn from, the target's alone (the rejection sampler makes the emitted token's law exactly that):
- greedy (temperature 0): log_softmax of the raw logits (temperature 1, no filters): the
  distribution whose argmax was taken. vLLM's default ("raw" logprobs) is the same number.
- sampled: log_softmax of the logits after temperature, top-k and top-p (`filtered_logits`), i.e.
  log p of the very p the rejection sampler used. vLLM calls this "processed" logprobs. Tokens the
  filters drop have log-probability -inf: they are never emitted and never listed among the top
  alternatives (a row lists fewer than k when the filters keep fewer).

A prompt's tokens were drawn from nothing: their log-probabilities (`prompt_logprobs`, OpenAI's `echo`
with `logprobs`) are under the model's raw distribution, log_softmax of the raw logits, with no
penalties, bias, filters or grammar (vLLM's prompt logprobs are the same number). For a greedy request
with none of those, a generated token's number is the same.

Rows are computed one at a time, each a [1, V] row, so a token's numbers are the same bits
whether its row was verified alone, in a γ-token block or in a shared pass, wherever the logits
themselves are row-invariant (every compute path's `row_invariant`).
"""

from __future__ import annotations

import torch

from specdec.core.params import SamplingParams, TokenLogprob
from specdec.core.sampling import filtered_logits


def row_logprobs(logits: torch.Tensor, params: SamplingParams | None) -> torch.Tensor:
    """logits: [1, V] -> log-probabilities [1, V] float32 of the distribution a token is drawn from
    (params None: the raw distribution, as for a prompt's tokens)."""
    if params is None or params.greedy:
        return logits.float().log_softmax(dim=-1)
    return filtered_logits(logits, params).log_softmax(dim=-1)


def token_logprobs(logits: torch.Tensor, tokens: list[int], params: SamplingParams | None,
                   top: int) -> list[TokenLogprob]:
    """logits: [≥n, V], row i the distribution of tokens[i] (n = len(tokens)) -> one TokenLogprob each
    (params None: under the raw distribution)."""
    out = []
    for i, token in enumerate(tokens):
        row = row_logprobs(logits[i:i + 1], params)[0]  # [V]
        alternatives: tuple[tuple[int, float], ...] = ()
        if top:
            values, ids = torch.topk(row, top)  # [top]
            alternatives = tuple((int(t), float(v)) for t, v in zip(ids.tolist(), values.tolist())
                                 if v != float("-inf"))
        out.append(TokenLogprob(float(row[token]), alternatives, int((row > row[token]).sum()) + 1))
    return out
