"""Grammar constraints (structured output) with llguidance: the tokens each position may take.

A constrained session holds a matcher over its grammar. A verify block asks for the masks of its γ+1
rows: row i is the mask after the committed tokens plus the first i drafts, the state target-only
decoding would have at that position. The matcher consumes the drafts to compute them and rolls
them back after, so it always rests on the committed tokens; the next round's committed tokens
(whatever the sampler kept) are consumed then. A draft the grammar refuses has probability 0 under
the masked p and is rejected, and the rows after it are never used.

Choice of engine: llguidance (no dependencies, one 3 MB wheel, rollback built in, a mask in about
a millisecond for JSON schemas on large vocabularies). xgrammar needs torch at a given version and a
C++ build for some platforms; outlines-core compiles an index per regex up front.
"""

from __future__ import annotations

import threading

import torch

from specdec.core.errors import InvalidArgument
from specdec.core.sequence import common_prefix


class Grammars:
    """The model's tokenizer as llguidance sees it, built on first use (about a second), shared by
    every constrained session of an engine."""

    def __init__(self, tokenizer_spec: str, vocab: int):
        self.spec, self.vocab = tokenizer_spec, vocab
        self._tokenizer, self._eos = None, None
        self._lock = threading.Lock()

    def warm(self) -> None:
        """Build the tokenizer now, so that the first constrained session does not wait for it."""
        with self._lock:
            if self._tokenizer is None:
                from specdec.weights.sources import load_tokenizer

                tokenizer = load_tokenizer(self.spec)
                self._tokenizer = guidance_tokenizer(tokenizer, self.vocab)
                self._eos = tokenizer.eos_token_id

    def state(self, grammar: str) -> GrammarState:
        import llguidance

        self.warm()
        matcher = llguidance.LLMatcher(self._tokenizer, grammar)
        if matcher.is_error():
            raise InvalidArgument(f"grammar refused: {matcher.get_error()}")
        return GrammarState(matcher, self.vocab, self._eos)


def guidance_tokenizer(tokenizer, vocab: int):
    """llguidance's tokenizer for a Hugging Face one, with only the tokens the tokenizer calls special marked so.

    llguidance takes every added token for a special one. Qwen2.5's <tool_call> (id 151,657) is added but not
    special: its text is the model's, and the tokenizer encodes that text to it. A grammar whose text starts with
    it then allowed the token (the tokenizer's encoding of the forced text) and refused it once sampled, as a
    special token where text was due. Here every token keeps llguidance's bytes for it, the text is encoded as
    the tokenizer does, and special are the tokenizer's special tokens and the ids past it."""
    import llguidance
    import llguidance.hf

    read = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
    special = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}

    class Tokens:  # what llguidance.TokenizerWrapper reads
        def __init__(self):
            self.eos_token_id, self.bos_token_id = read.eos_token, None
            self.tokens = [read.decode_bytes([i]) for i in range(vocab)]
            self.special_token_ids = sorted(special | set(range(len(tokenizer), vocab)))

        def __call__(self, text: bytes) -> list[int]:
            return read.tokenize_bytes(text)

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(Tokens()), n_vocab=vocab)


class GrammarState:
    """One session's matcher, resting on the committed tokens it has consumed."""

    def __init__(self, matcher, vocab: int, eos: int | None):
        self.matcher, self.vocab, self.eos = matcher, vocab, eos
        self.consumed: list[int] = []
        self._bits = torch.arange(32, dtype=torch.int32)

    def sync(self, committed: list[int]) -> None:
        """Roll back to the prefix shared with `committed`, then consume the rest."""
        shared = common_prefix(self.consumed, committed)
        if shared < len(self.consumed):
            self.matcher.rollback(len(self.consumed) - shared)
        for token in committed[shared:]:
            if not self.matcher.consume_token(token):
                raise InvalidArgument(f"committed token {token} breaks the grammar: {self.matcher.get_error()}")
        self.consumed = list(committed)

    def _words(self) -> torch.Tensor:
        """[⌈V/32⌉] int32: the grammar's bitmask of the tokens allowed next (bit t % 32 of word t // 32).
        llguidance's has a word more where V is a multiple of 32 (room for V + 1 bits), as real vocabularies'
        sizes are (Qwen2.5's 151,936): the words past the vocabulary are dropped."""
        words = torch.frombuffer(bytearray(self.matcher.compute_bitmask()), dtype=torch.int32)
        return words[:(self.vocab + 31) // 32]

    def masks(self, committed: list[int], proposed: list[int], rows: int,
              device: torch.device | str = "cpu") -> torch.Tensor:
        """[rows, V] bool on `device`: row i allows what may follow committed + proposed[:i]. `committed`
        are the tokens after the prompt (the grammar constrains the output only). The packed bitmask
        crosses to the device (V/8 bytes a row) and is expanded there."""
        self.sync(committed)
        words = torch.full((rows, (self.vocab + 31) // 32), -1, dtype=torch.int32)  # [rows, W]; -1: all allowed
        taken = 0
        for i in range(rows):
            words[i] = self._words()
            if i + 1 == rows or i >= len(proposed):
                break
            token = proposed[i]
            if token == self.eos or not (int(words[i, token // 32]) >> (token % 32)) & 1:
                break  # an EOS ends the output (and a stopped matcher cannot roll back); a refused draft is
                # rejected at row i: either way the later rows are never used
            if not self.matcher.consume_token(proposed[i]):
                raise InvalidArgument(f"the grammar allowed token {proposed[i]} but did not take it: "
                                      f"{self.matcher.get_error()}")
            taken += 1
        if taken:
            self.matcher.rollback(taken)
        words = words.to(device, non_blocking=True)
        bits = (words[:, :, None] >> self._bits.to(words.device)) & 1  # [rows, W, 32]
        return bits.reshape(rows, -1)[:, :self.vocab].bool()
