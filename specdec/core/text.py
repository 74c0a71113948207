"""Incremental detokenisation with stop strings."""

from __future__ import annotations


def printable(text: str, limit: int = 64) -> str:
    """A client string made safe for a log line: escaped, and cut to `limit` characters."""
    escaped = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    return escaped if len(escaped) <= limit else f"{escaped[:limit]}…({len(text)} chars)"


def partial_len(text: str, strings: list[str] | tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that could begin one of `strings` (a proper prefix of it)."""
    return max((k for s in strings for k in range(1, min(len(s), len(text) + 1)) if text.endswith(s[:k])),
               default=0)


class TextStream:
    """Turns a growing list of generated token ids into text deltas.

    Holds back a trailing U+FFFD (a multi-byte character cut between tokens) and any tail
    that could begin a stop string, and ends the text at the first stop string. Stop strings
    are searched only where a match could be new, so matching stays linear in the output.
    `min_tokens`: stop strings count once that many tokens are in (vLLM's rule): a match that ends
    before then is not one.

    Each push decodes only the tokens since the last settled point, with the tokens of the push before
    them (so a character or a leading space that depends on them decodes as in the whole text): the
    tokenizer's work per push stays constant, not the length of the output so far.
    """

    def __init__(self, tokenizer, stop: list[str] | tuple[str, ...] = (), min_tokens: int = 0):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.min_tokens = min_tokens
        self.token_ids: list[int] = []
        self.emitted_text = ""
        self.stopped = False
        self._searched = 0  # stop strings do not occur wholly within text[:_searched]
        self._settled = ""  # the text of token_ids[:_read]
        self._prefix = self._read = 0  # a push decodes token_ids[_prefix:], of which [_prefix:_read] is settled

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; returns the new text to show (may be empty)."""
        self.token_ids.extend(token_ids)
        text = self._text()
        armed = len(self.token_ids) >= self.min_tokens
        found = (text.find(s, max(self._searched - len(s) + 1, 0)) for s in self.stop) if armed else ()
        cut = min((i for i in found if i >= 0), default=-1)
        # A re-decoded partial character may change the tail; before min_tokens nothing so far is a match.
        self._searched = max(len(text) - 8, 0) if armed else len(text)
        if cut >= 0:
            text, self.stopped = text[:cut], True
        else:
            text = text.rstrip("\ufffd")
            text = text[:len(text) - partial_len(text, self.stop)]
        if not text.startswith(self.emitted_text):  # decoding changed earlier text; emit nothing new
            return ""
        delta = text[len(self.emitted_text):]
        self.emitted_text = text
        return delta

    def _text(self) -> str:
        """The whole text so far: the settled text and the new tokens' text, decoded in their window. The
        window's end settles unless it is a cut character; where the new tokens change how the window's
        start decodes (no byte-level tokenizer does), the whole text is decoded instead."""
        decode = self.tokenizer.decode
        window = decode(self.token_ids[self._prefix:], skip_special_tokens=True)
        before = decode(self.token_ids[self._prefix:self._read], skip_special_tokens=True)
        if window.startswith(before):
            text = self._settled + window[len(before):]
        else:
            text = decode(self.token_ids, skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            self._settled, self._prefix, self._read = text, self._read, len(self.token_ids)
        return text

    def finish(self) -> str:
        """Flush whatever was held back at the end of generation."""
        if self.stopped:
            return ""
        text = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        delta = text[len(self.emitted_text):] if text.startswith(self.emitted_text) else ""
        self.emitted_text += delta
        return delta
