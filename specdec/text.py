"""Incremental detokenisation with stop strings."""

from __future__ import annotations


class TextStream:
    """Turns a growing list of generated token ids into text deltas.

    Holds back a trailing U+FFFD (a multi-byte character cut between tokens) and any tail
    that could begin a stop string, and ends the text at the first stop string.
    """

    def __init__(self, tokenizer, stop: list[str] | tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.token_ids: list[int] = []
        self.emitted_text = ""
        self.stopped = False

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; returns the new text to show (may be empty)."""
        self.token_ids.extend(token_ids)
        text = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            text, self.stopped = text[:cut], True
        else:
            text = text.rstrip("\ufffd")
            text = text[:len(text) - self._partial_stop_len(text)]
        if not text.startswith(self.emitted_text):  # decoding changed earlier text; emit nothing new
            return ""
        delta = text[len(self.emitted_text):]
        self.emitted_text = text
        return delta

    def _partial_stop_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that could begin a stop string."""
        return max((k for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)

    def finish(self) -> str:
        """Flush whatever was held back at the end of generation."""
        if self.stopped:
            return ""
        text = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        delta = text[len(self.emitted_text):] if text.startswith(self.emitted_text) else ""
        self.emitted_text += delta
        return delta
