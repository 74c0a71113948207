"""Fill in the middle: `suffix` in /v1/completions, as code models are trained for it.

A model that can fill a gap reads the code before it and the code after it between special tokens, then writes
the middle: prefix marker, the prefix, suffix marker, the suffix, middle marker (the "PSM" order of Qwen2.5-Coder's
<|fim_prefix|> <|fim_suffix|> <|fim_middle|> and StarCoder's <fim_prefix> <fim_suffix> <fim_middle>). It ends
the middle with its end-of-text token, which ends the generation. A tokenizer without such markers cannot.
"""

from __future__ import annotations

MARKERS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))


class InfillError(ValueError):
    """The model has no fill-in-the-middle markers."""


def markers(tokenizer) -> tuple[int, int, int] | None:
    """The (prefix, suffix, middle) marker ids of `tokenizer`, or None."""
    for names in MARKERS:
        ids = [tokenizer.convert_tokens_to_ids(name) for name in names]
        if all(isinstance(i, int) and i != tokenizer.unk_token_id for i in ids):
            return ids[0], ids[1], ids[2]
    return None


def infill_prompt(tokenizer, prefix: str, suffix: str) -> list[int]:
    """The token ids that ask the model for the code between `prefix` and `suffix`."""
    found = markers(tokenizer)
    if found is None:
        raise InfillError("this model has no fill-in-the-middle tokens: suffix is not supported for it")
    before, after, middle = found

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    return [before, *encode(prefix), after, *encode(suffix), middle]
