"""Fill in the middle (`specdec.http.infill`) and the tokens that end a generation (`END_OF_GENERATION`). Through
the HTTP API: tests/test_http_api.py; on the packaged pair: tests/test_real_pair.py (slow)."""

from __future__ import annotations

import pytest

from specdec.http.infill import InfillError, infill_prompt, markers
from specdec.weights.sources import build_byte_tokenizer, end_of_generation_ids

QWEN_STYLE = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]


def test_the_prompt_has_prefix_suffix_and_middle_markers_around_the_code():
    tokenizer = build_byte_tokenizer()
    with pytest.raises(InfillError, match="no fill-in-the-middle tokens"):
        infill_prompt(tokenizer, "a", "b")
    assert markers(tokenizer) is None
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_STYLE})
    before, after, middle = (tokenizer.convert_tokens_to_ids(name) for name in QWEN_STYLE)
    assert markers(tokenizer) == (before, after, middle)
    assert infill_prompt(tokenizer, "x = ", "\nprint(x)") == [before, *b"x = ", after, *b"\nprint(x)", middle]


def test_special_end_of_generation_tokens_end_a_generation_and_others_do_not(tmp_path):
    """A folder's special <|endoftext|> and <|im_end|> are end-of-generation ids; a non-special <|end|> is text."""
    tokenizer = build_byte_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_end|>", "<|fim_prefix|>"]})
    tokenizer.add_tokens(["<|end|>"])  # not special
    tokenizer.save_pretrained(tmp_path)
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in ("<|endoftext|>", "<|im_end|>")}
    assert end_of_generation_ids(str(tmp_path)) == tuple(sorted(ids.values()))
    assert end_of_generation_ids("tiny:seed=0") == ()
