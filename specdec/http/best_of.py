"""`best_of` (OpenAI's legacy completions): each prompt's `best_of` choices are generated, and the `n` with the
highest log-probability per token come back, likeliest first. The log-probabilities are the ones the reply
reports (`logprobs`): those of the distribution each token was drawn from."""

from __future__ import annotations

from protos import specdec_pb2 as pb


class BestOf:
    """Scores every generated choice from its messages, then keeps each prompt's `n` best of `best_of`."""

    def __init__(self, n: int, best_of: int, keep_logprobs: bool):
        self.n, self.best_of, self.keep_logprobs = n, best_of, keep_logprobs
        self._sums: dict[int, float] = {}  # choice -> its generated tokens' summed logprob
        self._counts: dict[int, int] = {}

    def add(self, message: pb.GenerateResponse) -> None:
        self._sums[message.choice] = self._sums.get(message.choice, 0.0) + sum(lp.logprob for lp in message.logprobs)
        self._counts[message.choice] = self._counts.get(message.choice, 0) + len(message.logprobs)

    def score(self, choice: int) -> float:
        """The mean logprob of the choice's tokens; a choice that generated none ranks last."""
        count = self._counts.get(choice, 0)
        return self._sums[choice] / count if count else float("-inf")

    def pick(self, choices: list[dict]) -> list[dict]:
        """Each prompt's n best choices (by their index: prompt · best_of + k), renumbered prompt · n + rank; their
        logprobs dropped unless the client asked for them."""
        kept = []
        for prompt in sorted({c["index"] // self.best_of for c in choices}):
            ranked = sorted((c for c in choices if c["index"] // self.best_of == prompt),
                            key=lambda c: (-self.score(c["index"]), c["index"]))
            for rank, choice in enumerate(ranked[:self.n]):
                kept.append({**choice, "index": prompt * self.n + rank,
                             "logprobs": choice["logprobs"] if self.keep_logprobs else None})
        return kept
