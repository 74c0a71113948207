"""Where a model spec's files are, and what reads them without building a model: its tokenizer, and
the GGUF metadata saved as a Hugging Face folder. Light enough for the orchestrator and the HTTP API,
which need a tokenizer and never a model."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

from specdec.weights import resolved_if_present

log = logging.getLogger(__name__)


def model_path(spec: str) -> Path:
    if spec.startswith("packaged:"):
        raise ValueError(f"{spec!r} must be fetched first: pass specdec.weights.resolve({spec!r})")
    path = Path(spec).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model {spec!r} is neither a known spec nor an existing path")
    return path


def import_model_code() -> None:
    """Import transformers' model and tokenizer code: seconds of CPU on first use.

    Services starting together call this before they take the machine lock (which serialises
    loading and timing), so that they import in parallel instead of one after the other."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM  # noqa: F401


def import_config_code() -> None:
    """Import transformers' configuration code alone (what a GGUF model on the block paths needs of it): 0.8 s of
    CPU on a Zen 4, most of it transformers listing its model folders."""
    from transformers import AutoConfig  # noqa: F401


def import_tokenizer_code() -> None:
    """Import transformers' tokenizer code alone (what an orchestrator uses): 0.8 s of CPU on a Zen 4, where the
    model code would add 1.5 s more, on the cores that services starting beside it import and load on."""
    from transformers import AutoTokenizer  # noqa: F401


def preload_tokenizer(spec: str) -> Callable[[], object | None]:
    """Begin loading `spec`'s tokenizer on a thread of its own (an embedded orchestrator's, while its services
    load: 0.9 s for the packaged target's, after 2 s of imports). Returns a call that waits for it: the tokenizer,
    or None where it was not loaded here (a packaged model not fetched yet, which its service fetches, or any
    error, which `load_tokenizer` then raises where the orchestrator starts)."""
    result: list = [None]

    def load() -> None:
        try:
            import_tokenizer_code()
            local = resolved_if_present(spec)
            if local is not None:
                result[0] = load_tokenizer(local)
        except Exception:  # noqa: BLE001 - reported where it is loaded again
            log.debug("preloading the tokenizer of %s failed", spec, exc_info=True)

    thread = threading.Thread(target=load, name="tokenizer", daemon=True)
    thread.start()

    def wait() -> object | None:
        thread.join()
        return result[0]
    return wait


BUILT_IN = ("tiny:", "synthetic:")  # models built in code (`specdec.engine.models`): the byte tokenizer


def build_byte_tokenizer():
    """A byte-level tokenizer built in code: ids 0-255 are bytes, 256 is <|endoftext|>; a ChatML
    chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in gpt2_byte_chars().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"eos_token": "<|endoftext|>", "pad_token": "<|pad|>"})
    fast.chat_template = CHATML  # written out in bytes, like everything else
    return fast


# ChatML, and tools as Qwen2.5's template renders them, tersely (in the system message, and calls in <tool_call> tags,
# which the template names, as the tool-call reader wants: `specdec.http.tool_calls.check_template`), and Qwen3's
# `enable_thinking: false` (an empty thought after the generation prompt), a variable clients set through
# `chat_template_kwargs`.
CHATML = ("{% if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n"
          "{% endif %}<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools> <tool_call>"
          "<|im_end|>\n{% endif %}"
          "{% for m in messages %}{% if not (tools and loop.first and m.role == 'system') %}"
          "<|im_start|>{{ m.role }}\n{{ m.content }}{% for call in m.tool_calls or [] %}\n<tool_call>\n"
          "{\"name\": \"{{ call.function.name }}\", \"arguments\": {{ call.function.arguments | tojson }}}\n"
          "</tool_call>{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n"
          "{% if enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


def gpt2_byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which byte-level BPE vocabularies are written in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    for offset, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = chr(256 + offset)
    return chars


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "vocab.txt")


def load_tokenizer(spec: str):
    """The tokenizer of a model spec: a folder's own files; a .gguf file's header, or a folder's where it holds one
    .gguf and no tokenizer files (a GGUF beside its config.json alone). ValueError where there is none: without it
    transformers gives a folder without tokenizer files a tokenizer that encodes every text to nothing."""
    from transformers import AutoTokenizer

    if spec.startswith(BUILT_IN):
        return build_byte_tokenizer()
    path = model_path(spec)
    if path.is_dir() and not any((path / name).exists() for name in TOKENIZER_FILES):
        ggufs = list(path.glob("*.gguf"))
        if len(ggufs) != 1:
            raise ValueError(f"{path}: no tokenizer files ({', '.join(TOKENIZER_FILES)}) and "
                             f"{len(ggufs)} .gguf files to read one from")
        path = ggufs[0]
    if path.suffix == ".gguf":
        tokenizer_class = _gguf_tokenizer_class(path) or AutoTokenizer
        return tokenizer_class.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _gguf_tokenizer_class(file: Path):
    """For a GGUF of an architecture the gguf loader reads, the tokenizer class `AutoTokenizer` gives its model type
    (the one registered for it, else `TokenizersBackend`, as for llama), from our header reader; None for another.
    `AutoTokenizer` alone builds the file's whole config through gguf-py's reader to learn the class (12 s for the
    1.5B target); the tokenizer itself transformers reads with its own fast reader either way."""
    from transformers import TokenizersBackend
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name

    from specdec.weights.gguf_file import ARCHITECTURES, GgufFormatError, read_gguf

    try:
        architecture = read_gguf(file).architecture
    except GgufFormatError:  # e.g. big-endian: transformers' reader may still take it
        return None
    if architecture not in ARCHITECTURES:
        return None
    registered = TOKENIZER_MAPPING_NAMES.get(architecture)
    return tokenizer_class_from_name(registered) if registered else TokenizersBackend


# Tokens that end a generation wherever a model's vocabulary has them as special tokens, as llama.cpp's end-of-
# generation list has them: a GGUF's config names one EOS (Qwen2.5-Instruct's <|im_end|>), while the model ends
# other texts with another (its fill-in-the-middle reply with <|endoftext|>; upstream's generation config lists both).
END_OF_GENERATION = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|end|>",
                     "<end_of_turn>", "<｜end▁of▁sentence｜>")


def end_of_generation_ids(spec: str) -> tuple[int, ...]:
    """The ids of `spec`'s special tokens in END_OF_GENERATION, from its folder's tokenizer.json (a few hundred
    milliseconds): a packaged model's bundle, or a Hugging Face folder. None for a model built in code or a bare
    .gguf file, whose tokenizer takes seconds to convert (its config's EOS stands alone there)."""
    import json

    if spec.startswith(BUILT_IN):
        return ()
    path = model_path(spec)
    if not (path.is_dir() and (path / "tokenizer.json").exists()):
        return ()
    added = json.loads((path / "tokenizer.json").read_text(encoding="utf-8")).get("added_tokens", [])
    return tuple(sorted(t["id"] for t in added if t.get("special") and t.get("content") in END_OF_GENERATION))


def save_gguf_metadata(gguf: Path, out_dir: Path) -> None:
    """Save a GGUF file's config and tokenizer as a Hugging Face folder (seconds to read, instead of
    the ~20 s that converting them from the GGUF's metadata takes on every start)."""
    from transformers import AutoConfig, AutoTokenizer

    AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True).save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True).save_pretrained(out_dir)
