"""Model and tokenizer loading from a model spec.

A spec is one of:
- a local Hugging Face folder (the packaged pair's "packaged:draft" / "packaged:target" become
  one through `weights.resolve`, outside the core);
- a local .gguf file (dequantised on load);
- "tiny:key=value,...": a tiny randomly initialised Qwen2 model built in code (tests).
  Keys: seed, layers, hidden, heads, kv_heads, vocab, ctx, perturb (relative weight noise,
  seeded by perturb_seed, used to make a draft that disagrees with its target now and then).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from specdec.compute import WEIGHT_DTYPE, PathChoice, build_runner, resolve_path
from specdec.runner import Collectives, ModelRunner

log = logging.getLogger(__name__)

TINY_DEFAULTS = {"seed": 0, "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "vocab": 260,
                 "ctx": 512, "perturb": 0.0, "perturb_seed": 1}


@dataclass(frozen=True)
class LoadedModel:
    runner: ModelRunner  # the forward pass on the chosen compute path
    choice: PathChoice
    name: str
    vocab_size: int
    max_context: int
    eos_token_ids: tuple[int, ...]
    device: torch.device


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def parse_tiny_spec(spec: str) -> dict:
    options = dict(TINY_DEFAULTS)
    body = spec.removeprefix("tiny:")
    for item in filter(None, body.split(",")):
        key, _, value = item.partition("=")
        if key not in options:
            raise ValueError(f"unknown tiny-model option {key!r}; known: {sorted(options)}")
        options[key] = type(TINY_DEFAULTS[key])(value)
    return options


def import_model_code() -> None:
    """Import transformers' model and tokenizer code: seconds of CPU on first use.

    Services starting together call this before they take the machine lock (which serialises
    loading and timing), so that they import in parallel instead of one after the other."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM  # noqa: F401


def build_tiny_model(spec: str) -> torch.nn.Module:
    """A seeded, randomly initialised tiny Qwen2 causal LM; same spec -> same weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    o = parse_tiny_spec(spec)
    config = Qwen2Config(
        vocab_size=o["vocab"], hidden_size=o["hidden"], intermediate_size=2 * o["hidden"],
        num_hidden_layers=o["layers"], num_attention_heads=o["heads"], num_key_value_heads=o["kv_heads"],
        max_position_embeddings=o["ctx"], initializer_range=0.2, tie_word_embeddings=False,
        eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(o["seed"])
    model = Qwen2ForCausalLM(config)
    if o["perturb"] > 0:
        gen = torch.Generator().manual_seed(o["perturb_seed"])
        with torch.no_grad():
            for param in model.parameters():
                noise = torch.randn(param.shape, generator=gen) * param.std() * o["perturb"]
                param.add_(noise)
    return model


def build_byte_tokenizer():
    """A byte-level tokenizer built in code: ids 0-255 are bytes, 256 is <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in _gpt2_byte_chars().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"eos_token": "<|endoftext|>", "pad_token": "<|pad|>"})
    return fast


def _gpt2_byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which byte-level BPE vocabularies are written in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    for offset, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = chr(256 + offset)
    return chars


def _resolve_path(spec: str) -> Path:
    if spec.startswith("packaged:"):
        raise ValueError(f"{spec!r} must be fetched first: pass weights.resolve({spec!r})")
    path = Path(spec).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model {spec!r} is neither a known spec nor an existing path")
    return path


def load_hf_model(spec: str, device: torch.device, weight_dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The Hugging Face model for `spec`, in `weight_dtype` on `device`, in eval mode."""
    from transformers import AutoModelForCausalLM

    if spec.startswith("tiny:"):
        model = build_tiny_model(spec).to(weight_dtype)
    else:
        path = _resolve_path(spec)
        kwargs = {"dtype": weight_dtype, "local_files_only": True}
        if path.suffix == ".gguf":
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, **kwargs)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        if device.type == "cpu":
            _into_private_memory(model)
    return model.to(device).eval()


def load_model(spec: str, device: str = "auto", dtype: str = "auto", quantize: str = "none",
               shard: Callable[[torch.nn.Module], Collectives] | None = None, max_tokens: int = 9) -> LoadedModel:
    """Load `spec` and build its runner on the compute path the flags name (`specdec.compute`).

    shard: for tensor parallelism, slices the loaded model in place and returns its collectives.
    max_tokens: the largest forward the fp32 kernel race weighs (γ_max + 1).
    """
    dev = resolve_device(device)
    path = resolve_path(dtype, quantize, dev)
    model = load_hf_model(spec, dev, WEIGHT_DTYPE[path])
    config = model.config
    eos = () if spec.startswith("tiny:") else _eos_ids(model)
    collectives = shard(model) if shard is not None else None
    runner, choice = build_runner(model, path, max_tokens, collectives)
    return LoadedModel(runner, choice, spec, config.vocab_size, config.max_position_embeddings, eos, dev)


def _into_private_memory(model: torch.nn.Module) -> None:
    """Copy weights out of the safetensors mmap into process memory.

    File-backed pages get no transparent huge pages, and the kernel may evict them under memory
    pressure, stalling a decode step on disk reads. Measured on the 1.5B target, 2 cores:
    462 ms/token mmap-backed, 388 copied, 368 copied with THP_MEM_ALLOC_ENABLE=1.
    """
    with torch.no_grad():
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            tensor.data = tensor.data.clone()


def _eos_ids(model) -> tuple[int, ...]:
    eos = getattr(model.generation_config, "eos_token_id", None) or model.config.eos_token_id
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def load_tokenizer(spec: str):
    from transformers import AutoTokenizer

    if spec.startswith("tiny:"):
        return build_byte_tokenizer()
    path = _resolve_path(spec)
    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantise a GGUF file and save it as an fp32 safetensors folder with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                 local_files_only=True)
    # transformers 5.x refuses to save a GGUF-loaded model while it carries its quantizer marker.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True).save_pretrained(out_dir)
