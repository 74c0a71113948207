"""Per-position logit processing: repetition, frequency and presence penalties and a logit bias,
applied before temperature and the top-k/top-p filters.

A row of logits is the distribution of the token at one position, and its processing depends on the
tokens before that position. A verify block scores γ+1 positions at once; row i is processed with
the committed tokens plus the first i drafts, the very counts target-only decoding would have had at
that position if those drafts are emitted. So the rejection sampler compares p and q of the processed
distributions, and speculation stays exact with penalties and bias. The draft processes each q it
samples the same way, with its own drafts so far.

The definition (vLLM's order and conventions; OpenAI's for the two penalties and the bias):
1. repetition_penalty r (≠ 1): a token seen in the prompt or the output so far has its logit divided
   by r if positive and multiplied by r otherwise;
2. frequency and presence penalties, over the output so far (not the prompt):
   logit −= frequency · count + presence · [count > 0];
3. logit_bias: logit += bias[token];
4. min_tokens: at an output position before min_tokens, the ids that would end the output (EOS and the
   request's stop ids, `SamplingParams.ending_ids`) get −∞, so the output has at least that many tokens.
"""

from __future__ import annotations

from collections import Counter

import torch


def _penalise(x: torch.Tensor, counts: torch.Tensor, params) -> torch.Tensor:
    """Steps 1 and 2 on the logits x of tokens seen before, with their output counts (float, like x)."""
    if params.repetition_penalty != 1.0:
        x = torch.where(x > 0, x / params.repetition_penalty, x * params.repetition_penalty)
    if params.frequency_penalty or params.presence_penalty:
        x = x - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).float()
    return x


def process_logits(logits: torch.Tensor, params, history: list[int], proposed: list[int] = ()) -> torch.Tensor:
    """logits [N, V] -> processed float32 logits [N, V]; row i is the token after history + proposed[:i].

    `params` is a `SamplingParams`; `history` the committed tokens, prompt first (its first
    `params.prompt_tokens` are the prompt). Returns `logits` itself when there is nothing to do.
    Only the columns of tokens seen before (and biased ones) change, so the work is a copy of the
    logits plus a few gathers: every row with the history's counts, then the entries a row's earlier
    proposals change, recomputed from the raw logits.
    """
    rows, _ = logits.shape
    early = min(rows, max(params.min_tokens - (len(history) - params.prompt_tokens), 0)) if params.ending_ids else 0
    if not params.processes and not early:
        return logits
    device = logits.device
    raw = logits.float()
    out = raw.clone()
    output = Counter(history[params.prompt_tokens:])
    seen = sorted(set(history)) if params.repetition_penalty != 1.0 else sorted(output)
    if seen:
        ids = torch.tensor(seen, dtype=torch.long, device=device)
        counts = torch.tensor([float(output[t]) for t in seen], device=device)
        out[:, ids] = _penalise(raw[:, ids], counts, params)
    bias = dict(params.logit_bias)
    if bias:
        ids = torch.tensor(list(bias), dtype=torch.long, device=device)
        out[:, ids] += torch.tensor(list(bias.values()), dtype=torch.float32, device=device)
    pairs = [(i, t) for i in range(1, rows) for t in sorted(set(proposed[:i]))]
    if pairs:  # row i also counts proposed[:i]: those entries from the raw logits again
        row = torch.tensor([i for i, _ in pairs], dtype=torch.long, device=device)
        token = torch.tensor([t for _, t in pairs], dtype=torch.long, device=device)
        counts = torch.tensor([float(output[t] + list(proposed[:i]).count(t)) for i, t in pairs], device=device)
        value = _penalise(raw[row, token], counts, params)
        out[row, token] = value + torch.tensor([bias.get(t, 0.0) for _, t in pairs], dtype=torch.float32, device=device)
    if early:  # rows [0, early) are output positions before min_tokens: last, so nothing above undoes it
        out[:early, torch.tensor(params.ending_ids, dtype=torch.long, device=device)] = float("-inf")
    return out
