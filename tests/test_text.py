"""Incremental detokenisation and stop strings."""

import random

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


class _WholeText(TextStream):
    """The stream as it was: every push decodes the whole output."""

    def _text(self) -> str:
        return self.tokenizer.decode(self.token_ids, skip_special_tokens=True)


def test_pushes_give_the_deltas_of_decoding_the_whole_output_each_time():
    """Random text with multi-byte characters, cut into bytes and pushed in random runs, with stop strings:
    the same deltas, stops and final text as decoding everything on every push."""
    tok = build_byte_tokenizer()
    rng = random.Random(0)
    alphabet = ["a", " ", "\n", "é", "€", "😀", "x", "END"[rng.randrange(3)], "\t"]
    for _ in range(60):
        ids = tok.encode("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 80))))
        stop = rng.choice([(), ("END",), ("\n\n", "😀a")])
        streams = TextStream(tok, stop), _WholeText(tok, stop)
        begin = 0
        while begin < len(ids) and not streams[1].stopped:
            run = ids[begin:begin + rng.randrange(0, 5)]
            begin += len(run)
            assert streams[0].push(run) == streams[1].push(run)
            assert streams[0].stopped == streams[1].stopped
        assert streams[0].finish() == streams[1].finish()
        assert streams[0].emitted_text == streams[1].emitted_text


def test_a_push_decodes_a_window_not_the_whole_output():
    tok = build_byte_tokenizer()
    decoded = []

    class Counting:
        def decode(self, ids, **kwargs):
            decoded.append(len(ids))
            return tok.decode(ids, **kwargs)

    stream = TextStream(Counting())
    for byte in ("abc" * 400).encode():
        stream.push([byte])
    assert stream.emitted_text == "abc" * 400
    assert max(decoded) <= 2, f"a push decoded {max(decoded)} tokens"
