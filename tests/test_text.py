"""Incremental detokenisation and stop strings."""

from specdec.core.text import TextStream
from specdec.weights.sources import build_byte_tokenizer


def test_stop_string_split_across_tokens_is_held_back():
    tok = build_byte_tokenizer()
    stream = TextStream(tok, ["\n\n"])
    deltas = [stream.push(tok.encode(piece)) for piece in ["ab", "\n", "c", "\n", "\n", "zz"]]
    assert "".join(deltas) == "ab\nc" and stream.stopped


def test_multibyte_character_waits_for_its_last_byte():
    tok = build_byte_tokenizer()
    stream = TextStream(tok)
    assert [stream.push([b]) for b in "é".encode()] == ["", "é"]
