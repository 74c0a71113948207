"""Model and tokenizer loading from a model spec.

A spec is one of:
- a local Hugging Face folder (the packaged pair's "packaged:draft" / "packaged:target" become
  one through `specdec.weights.resolve`, outside the core);
- a local .gguf file, or a folder holding one .gguf beside its config.json and tokenizer (the
  packaged pair): a GGUF source, whose weights the "gguf" path keeps in their blocks
  (`specdec.engine.gguf_model`) and the float32 path dequantizes to the same values;
- "synthetic:draft|target,...": random weights in the packaged pair's shapes (or a small pair), the
  draft's agreement with the target set by one number (`specdec.engine.synthetic`), for benchmarks;
- "tiny:key=value,...": a tiny randomly initialised Qwen2 (or Llama) model built in code (tests).
  Keys: seed, layers, hidden, heads, kv_heads, vocab, ctx, perturb (relative weight noise,
  seeded by perturb_seed, used to make a draft that disagrees with its target now and then),
  gguf (1: weights quantized as a Q4_K_M file would be, so that the model is a GGUF source),
  eos (a token id that ends generation; -1, the default, for none), logit_scale, arch (qwen2 or llama).
"""

from __future__ import annotations

import functools
import gc
import itertools
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from specdec.engine.compute import (WEIGHT_DTYPE, PathChoice, build_runner, resolve_path, resolve_runner,
                                    runner_kernel_name)
from specdec.engine.cpu.hugepages import return_freed_heap
from specdec.engine.cpu.q8dot import PACKED_PATHS, choose_one_row_pairs, set_one_row_pairs
from specdec.engine.defaults import DRAFT_VOCAB_AUTO
from specdec.engine.gguf_model import UnsupportedGguf, gguf_config, load_gguf_model
from specdec.engine.memory_budget import check_fits, safetensors_elements
from specdec.engine.profile_cache import ProfileCache, setting_key, setting_or_time
from specdec.engine.requantize import draft_format, requantize_linears
from specdec.engine.runner import Collectives, ModelRunner
from specdec.engine.synthetic import build_synthetic_model, is_synthetic
from specdec.planning.controller import GAMMA_MAX
from specdec.weights.sources import end_of_generation_ids, model_path

log = logging.getLogger(__name__)

TINY_DEFAULTS = {"seed": 0, "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "vocab": 260,
                 "ctx": 512, "perturb": 0.0, "perturb_seed": 1, "gguf": 0, "eos": -1, "logit_scale": 1.0,
                 "arch": "qwen2"}
TINY_ARCHITECTURES = ("qwen2", "llama")  # "llama": no biases (transformers' Llama, as a llama GGUF holds it)


@dataclass(frozen=True)
class LoadedModel:
    runner: ModelRunner  # the forward pass on the chosen compute path
    choice: PathChoice
    name: str
    vocab_size: int
    max_context: int
    eos_token_ids: tuple[int, ...]
    device: torch.device

    @property
    def scored_tokens(self) -> int:
        """Token ids the output layer scores: all, or fewer on a cut draft (`ModelRunner.limit_vocabulary`)."""
        return self.runner.scored_tokens() or self.vocab_size


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


def build_tiny_model(spec: str) -> torch.nn.Module:
    """A seeded, randomly initialised tiny Qwen2 (or Llama: arch=llama) causal LM; same spec -> same weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    o = parse_tiny_spec(spec)
    if o["arch"] not in TINY_ARCHITECTURES:
        raise ValueError(f"tiny-model arch {o['arch']!r}; known: {', '.join(TINY_ARCHITECTURES)}")
    config = AutoConfig.for_model(
        o["arch"], vocab_size=o["vocab"], hidden_size=o["hidden"], intermediate_size=2 * o["hidden"],
        num_hidden_layers=o["layers"], num_attention_heads=o["heads"], num_key_value_heads=o["kv_heads"],
        max_position_embeddings=o["ctx"], initializer_range=0.2, tie_word_embeddings=False,
        eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(o["seed"])
    model = AutoModelForCausalLM.from_config(config)
    if o["perturb"] > 0:
        gen = torch.Generator().manual_seed(o["perturb_seed"])
        with torch.no_grad():
            for param in model.parameters():
                noise = torch.randn(param.shape, generator=gen) * param.std() * o["perturb"]
                param.add_(noise)
    if o["logit_scale"] != 1.0:  # sharper (or flatter) distributions, the same argmax: a confident model
        with torch.no_grad():
            model.lm_head.weight.mul_(o["logit_scale"])
    if o["gguf"]:
        from specdec.engine.gguf_model import pack_tiny

        pack_tiny(model)
    return model


def gguf_file(spec: str) -> Path | None:
    """The GGUF file behind `spec`, if its weights come in GGUF blocks (a .gguf file, or a folder with
    one and no safetensors); None otherwise. Tiny specs with gguf=1 are GGUF sources without a file."""
    if spec.startswith("tiny:"):
        return None
    path = model_path(spec)
    if path.suffix == ".gguf":
        return path
    files = list(path.glob("*.gguf")) if path.is_dir() else []
    return files[0] if len(files) == 1 and not any(path.glob("*.safetensors")) else None


def is_packed_source(spec: str) -> bool:
    if is_synthetic(spec):
        return False
    return parse_tiny_spec(spec)["gguf"] == 1 if spec.startswith("tiny:") else gguf_file(spec) is not None


def imports_model_code(spec: str, dtype: str = "auto", quantize: str = "none", device: str = "auto",
                       sharded: bool = False) -> bool:
    """Whether loading `spec` with these flags imports transformers' model code (seconds of CPU): all but a GGUF
    model on its packed path, whose modules are `specdec.engine.decoder_tree`'s. From the spec and flags alone: a
    packaged model, fetched or not, is a GGUF file; where this guesses wrong the load imports it itself."""
    if sharded or quantize == "int8" or dtype not in ("auto", *PACKED_PATHS) or resolve_device(device).type != "cpu":
        return True
    if spec.startswith("packaged:"):
        return False
    try:
        return spec.startswith("tiny:") or is_synthetic(spec) or gguf_file(spec) is None
    except (OSError, ValueError):  # not a path: the load says why
        return True


def _gguf_config(spec: str, file: Path):
    """The config beside `file`, else from its header; None where the gguf loader refuses the file (its
    architecture, or a header our reader does not take), which then goes to transformers whole."""
    from transformers import AutoConfig

    path = Path(spec)
    if path.is_dir() and (path / "config.json").exists():
        return AutoConfig.from_pretrained(path, local_files_only=True)
    return gguf_config(file)


def load_hf_model(spec: str, device: torch.device, weight_dtype: torch.dtype = torch.float32,
                  packed: bool = False, hf_modules: bool = True) -> torch.nn.Module:
    """The Hugging Face model for `spec`, in `weight_dtype` on `device`, in eval mode.

    packed: a GGUF source keeps its weights in their blocks (the "gguf" path) instead of float32; hf_modules=False:
    on our module tree where it stands for the model (`specdec.engine.decoder_tree`: for the runner, which needs no
    `generate`), without importing transformers' model code."""
    from transformers import AutoModelForCausalLM

    if spec.startswith("tiny:"):
        return build_tiny_model(spec).to(weight_dtype).to(device).eval()
    if is_synthetic(spec):
        return build_synthetic_model(spec, device, weight_dtype)
    path, file = model_path(spec), gguf_file(spec)
    kwargs = {"dtype": weight_dtype, "local_files_only": True}
    if file is not None:
        try:
            model = load_gguf_model(file, _gguf_config(spec, file), packed, hf_modules)
            if packed:  # CPU and float32 by definition; its meta-device placeholders cannot move
                return model
            model = model.to(weight_dtype)
        except UnsupportedGguf:
            if packed:
                raise
            model = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, **kwargs)
            _into_private_memory(model)
        return model.to(device).eval()
    if path.is_dir():  # transformers reads the weights into this machine's memory first, whatever the device
        check_fits(f"{path.name} in {str(weight_dtype).removeprefix('torch.')}",
                   safetensors_elements(path) * weight_dtype.itemsize)
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if device.type == "cpu":
        _into_private_memory(model)
    return model.to(device).eval()


def draft_vocabulary(vocab_size: int, eos_token_ids: tuple[int, ...], requested: int = -1) -> list[tuple[int, int]]:
    """The token-id ranges a draft's output layer scores (`ModelRunner.limit_vocabulary`): ids below the
    limit and the end-of-sequence ids. requested: the limit, 0 for every id, -1 for the rule (DRAFT_VOCAB_AUTO
    where the vocabulary is more than twice that). Byte-pair vocabularies number their tokens in merge order,
    so the low ids are the common ones. Empty: score every id."""
    limit = (DRAFT_VOCAB_AUTO if vocab_size > 2 * DRAFT_VOCAB_AUTO else 0) if requested < 0 else requested
    if not 0 < limit < vocab_size:
        return []
    ranges = [(0, limit)]
    for eos in sorted(e for e in set(eos_token_ids) if limit <= e < vocab_size):
        if ranges[-1][1] == eos:
            ranges[-1] = (ranges[-1][0], eos + 1)
        else:
            ranges.append((eos, eos + 1))
    return ranges


def load_model(spec: str, device: str = "auto", dtype: str = "auto", quantize: str = "none",
               shard: Callable[[torch.nn.Module], Collectives] | None = None, max_tokens: int = GAMMA_MAX + 1,
               runner: str = "auto", slots: int = 64, context: int = 0,
               draft_weights: str = "as-shipped", settings: ProfileCache | None = None) -> LoadedModel:
    """Load `spec` and build its runner on the compute path the flags name (`specdec.engine.compute`).

    shard: for tensor parallelism, slices the loaded model in place and returns its collectives.
    max_tokens: the largest forward the fp32 kernel race weighs (γ_max + 1), and the static runner's
    decode rows. runner: "auto", "ragged" or "static" (`resolve_runner`); slots and context size the
    static runner's KV pool. draft_weights: a draft's `--draft-weights` ("auto", "as-shipped", "q4_0";
    `specdec.engine.requantize`): a packed GGUF model's linears requantized at load; never for a target.
    settings: where a gguf-q8 model's kernel setting timed at load (one-row pairs) is kept for the next start
    (None: timed at every load).
    """
    dev = resolve_device(device)
    path = resolve_path(dtype, quantize, dev, is_packed_source(spec))
    runner = resolve_runner(runner, dev, path)
    if path in PACKED_PATHS and shard is not None:
        log.info("tensor parallelism shards float32 weights: this GGUF model runs on the fp32 path")
        path = "fp32"  # a Q4_K row splits only at 256-column blocks, which the MLP width need not have
    try:
        model = load_hf_model(spec, dev, WEIGHT_DTYPE[path], packed=path in PACKED_PATHS, hf_modules=False)
    except UnsupportedGguf as error:
        if path not in PACKED_PATHS or dtype in PACKED_PATHS:
            raise
        log.warning("%s: this model runs on the fp32 path", error)
        path = "fp32"
        model = load_hf_model(spec, dev, WEIGHT_DTYPE[path])
    qtype = draft_format(draft_weights, path)
    if qtype is not None and path in PACKED_PATHS:
        requantize_linears(model, qtype)
    config = model.config
    eos = _tiny_eos(spec) if spec.startswith("tiny:") else () if is_synthetic(spec) else eos_token_ids(model, spec)
    collectives = shard(model) if shard is not None else None
    built, choice = build_runner(model, path, max_tokens, collectives, runner, slots, context)
    if choice.path == "gguf-q8":
        pairs = _one_row_pairs(built, config.vocab_size, settings, lambda: setting_key("one_row_pairs", spec, choice))
        choice = replace(choice, kernel=runner_kernel_name(built, pairs))
    if path in PACKED_PATHS:
        del model
        gc.collect()  # the module tree's cycles: with them goes the last view of the GGUF file's mapping
        return_freed_heap()  # what the load freed on the heap: the weights live in mappings of their own
    return LoadedModel(built, choice, spec, config.vocab_size, built.max_context, eos, dev)


def _one_row_pairs(runner: ModelRunner, vocab: int, settings: ProfileCache | None, key: Callable[[], dict]) -> bool:
    """Whether this process's gguf-q8 one-token passes go over two weight rows at once: kept in `settings` from an
    earlier start, or timed on this model (`specdec.engine.cpu.q8dot.choose_one_row_pairs`; about 8 one-token
    passes after a short prefix, which is fed only where the build can pair)."""
    from specdec.engine.measure import PassTimer  # the measuring module imports the runner's

    timer = functools.cache(lambda: PassTimer(runner, 1, 1, vocab))
    return setting_or_time(settings, key, lambda: choose_one_row_pairs(lambda: timer().seconds(1)),
                           set_one_row_pairs, "gguf-q8: one-row pairs")


def _into_private_memory(model: torch.nn.Module) -> None:
    """Copy weights out of the safetensors mmap into process memory.

    File-backed pages get no transparent huge pages, and the kernel may evict them under memory
    pressure, stalling a decode step on disk reads. Measured on the 1.5B target, 2 cores:
    462 ms/token mmap-backed, 388 copied, 368 copied with THP_MEM_ALLOC_ENABLE=1.
    """
    with torch.no_grad():
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            tensor.data = tensor.data.clone()


def _tiny_eos(spec: str) -> tuple[int, ...]:
    eos = parse_tiny_spec(spec)["eos"]
    return () if eos < 0 else (eos,)


def eos_token_ids(model, spec: str) -> tuple[int, ...]:
    """The model's EOS ids (its generation config's, else its config's) and its vocabulary's end-of-generation
    tokens (`specdec.weights.sources.END_OF_GENERATION`), within the vocabulary."""
    eos = getattr(model.generation_config, "eos_token_id", None) or model.config.eos_token_id
    own = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
    ends = [i for i in end_of_generation_ids(spec) if i < model.config.vocab_size]
    return tuple(dict.fromkeys([*own, *ends]))
