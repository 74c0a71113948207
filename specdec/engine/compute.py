"""Choosing a compute path for this machine and building the model's runner on it.

Paths (`specdec.engine.kernels` has the numerics):
- "fp32": the exact default on CPU. The kernel (MKL sgemm or prepacked oneDNN) is chosen by
  timing both on the model's own weights; oneDNN is kept unless MKL is clearly faster, because
  only its results are the same for every row count (see `kernels.Kernel.min_rows`).
- "bf16" / "fp16": half-precision weights; bf16 is the default on CUDA. On a CPU without native
  bf16 (avx512_bf16 / AMX) it is emulated and scales badly with tokens per forward: a warning says so.
- "int8": W8A8 with per-token activation scales, CPU only, lossy (one flag away: --quantize int8).
- "gguf": the weights of a GGUF model kept in their block formats (Q4_K, Q6_K, ...) and expanded
  in registers to their exact float32 values; float32 activations and sums (`specdec.engine.cpu.blockquant`):
  the float32 path's numbers at a fraction of the bytes.
- "gguf-q8": the same blocks against activations quantized to 8 bits per 32 values, with integer dot
  products (`specdec.engine.cpu.q8dot`), as llama.cpp computes them; row-invariant, and the same bits on
  every CPU level. The default on CPU for a GGUF-sourced model, by the rule in docs/PERFORMANCE.md:
  the fastest row-invariant path whose teacher-forced greedy agreement with "gguf" is ≥ 0.98.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from specdec.engine.cpu import blockquant, q8dot
from specdec.engine.cpu.features import cpu_features
from specdec.engine.cpu.q8dot import PACKED_PATHS
from specdec.engine.kernels import PATHS, fastest_fp32_kernel
from specdec.engine.runner import Collectives, ModelRunner
from specdec.planning.controller import GAMMA_MAX

log = logging.getLogger(__name__)

MKL_MARGIN = 0.9  # MKL must take under 90% of oneDNN's time to be chosen over it
RACE_MIN_BYTES = 64 * 2**20  # smaller weights stay in cache and time nothing real: oneDNN without a race
ALL_PATHS = (*PATHS, "fp16", "gguf", "gguf-q8")
WEIGHT_DTYPE = {"fp32": torch.float32, "int8": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                "gguf": torch.float32, "gguf-q8": torch.float32}
DEFAULT_PACKED_PATH = "gguf-q8"  # the rule's pick (docs/PERFORMANCE.md, "The integer path")


@dataclass(frozen=True)
class PathChoice:
    """What `build_runner` decided, for logs, `Info` and the benchmark."""

    path: str
    kernel: str  # the fp32 kernel, or the path's own ("onednn-int8-vnni", "onednn-int8-w7a8", "dense", "dense-emulated")
    device: str  # "cpu: <model> [flags]" or the CUDA device name
    row_invariant: bool  # a token's logits do not depend on the tokens computed with it
    kernel_seconds: dict[str, float] = field(default_factory=dict)  # the fp32 kernel race, if run


def resolve_path(dtype: str = "auto", quantize: str = "none", device: torch.device | str = "cpu",
                 packed_source: bool = False) -> str:
    """Flags -> path name: --quantize int8 wins; else the dtype. auto: bf16 on CUDA; on CPU, for a model
    whose weights come in GGUF blocks (`packed_source`), DEFAULT_PACKED_PATH where its kernel can run,
    else fp32."""
    device = torch.device(device)
    if quantize not in ("none", "", "int8"):
        raise ValueError(f"unknown --quantize {quantize!r}; choose none or int8")
    if quantize == "int8":
        if device.type != "cpu":
            raise ValueError("--quantize int8 is a CPU path; on CUDA use --dtype bfloat16 (the default)")
        return "int8"
    if dtype in PACKED_PATHS:
        if device.type != "cpu" or not packed_source:
            raise ValueError(f"--dtype {dtype} runs a GGUF model's own weight blocks, on CPU")
        if not _kernel_available(dtype):
            raise ValueError(f"--dtype {dtype} needs its C kernel, which cannot be built here (no C compiler?)")
        return dtype
    if dtype == "auto" and device.type == "cpu" and packed_source:
        if _kernel_available(DEFAULT_PACKED_PATH):
            return DEFAULT_PACKED_PATH
        log.warning("the gguf kernels cannot be built here (no C compiler?): this GGUF model runs on float32")
    names = {"auto": "bf16" if device.type == "cuda" else "fp32", "float32": "fp32", "fp32": "fp32",
             "bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16"}
    if dtype not in names:
        raise ValueError(f"unknown --dtype {dtype!r}; choose auto, float32, bfloat16, float16, gguf or gguf-q8")
    return names[dtype]


def _kernel_available(path: str) -> bool:
    return blockquant.available() and (path != "gguf-q8" or q8dot.available())


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu: {cpu_features().describe()}"


def choose_fp32_kernel(model: nn.Module, max_tokens: int) -> tuple[str, dict[str, float]]:
    """Race MKL against oneDNN on the MLP weights of the first layers (enough to leave the cache)."""
    layers = model.model.layers
    weights, size = [], 0
    for layer in layers:
        for linear in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
            weights.append(linear.weight.detach())
            size += linear.weight.numel() * 4
        if size > 256 * 2**20:
            break
    if not torch.backends.mkldnn.is_available():
        return "dense", {}
    if size < RACE_MIN_BYTES:
        return "onednn", {}
    fastest, seconds = fastest_fp32_kernel(weights, max_tokens)
    if seconds and fastest == "dense" and seconds["dense"] > MKL_MARGIN * seconds["onednn"]:
        fastest = "onednn"
    return fastest, seconds


RUNNERS = ("auto", "ragged", "static")


def resolve_runner(runner: str, device: torch.device | str, path: str) -> str:
    """auto: "static" (`specdec.engine.static`: KV pool, fixed shapes, CUDA graphs) on CUDA, "ragged"
    (`specdec.engine.runner`) on CPU, whose kernels are row-invariant at any row count, and for the
    gguf path, whose block kernels only the ragged runner runs."""
    if runner not in RUNNERS:
        raise ValueError(f"unknown runner {runner!r}; choose {', '.join(RUNNERS)}")
    if runner == "static" and path in PACKED_PATHS:
        raise ValueError(f"the static runner runs dense weights; the {path} path runs on the ragged runner")
    if runner == "auto":
        return "static" if torch.device(device).type == "cuda" and path not in PACKED_PATHS else "ragged"
    return runner


def build_runner(model: nn.Module, path: str, max_tokens: int = GAMMA_MAX + 1,
                 collectives: Collectives | None = None, runner: str = "ragged", slots: int = 64,
                 context: int = 0) -> tuple[ModelRunner, PathChoice]:
    """Rebuild `model`'s linear layers for `path` (measuring where there is a choice), on the
    "ragged" or "static" runner (`resolve_runner`); the static one gets `slots` sessions of `context`
    positions (0: its default) and decode pieces of `max_tokens` rows."""
    device = torch.device("cpu") if path in PACKED_PATHS else next(model.parameters()).device
    if runner == "static":
        return _build_static(model, path, max_tokens, collectives, slots, context, device)
    described = describe_device(device)
    kernel, seconds = "dense", {}
    if device.type == "cpu":
        features = cpu_features()
        if path in ("bf16", "fp16") and not features.native_bf16:
            log.warning("%s on a CPU without native bf16 (%s) is emulated: it is slower than fp32 for "
                        "multi-token forwards, which speculation and batching rely on", path, features.model_name)
        if path == "fp32":
            kernel, seconds = choose_fp32_kernel(model, max_tokens)
        runner = ModelRunner(model, path, fp32_kernel=kernel, collectives=collectives)
        if path == "int8":
            kernel = runner.lm_head.name
        elif path in PACKED_PATHS:
            kernel = runner_kernel_name(runner)
        elif path in ("bf16", "fp16") and not features.native_bf16:
            kernel = "dense-emulated"  # said in Info, so a user sees why this path is slow here
    else:
        runner = ModelRunner(model, path, collectives=collectives)
    invariant = device.type == "cpu" and (path in ("int8", *PACKED_PATHS) or (path == "fp32" and kernel == "onednn")
                                          or (path == "bf16" and cpu_features().native_bf16))
    choice = PathChoice(path, kernel, described, invariant, seconds)
    log.info("compute path %s, kernel %s, on %s%s", path, kernel, described,
             f" (fp32 kernels timed: {', '.join(f'{k} {v * 1e3:.0f} ms' for k, v in seconds.items())})"
             if seconds else "")
    return runner, choice


def runner_kernel_name(runner: ModelRunner, one_row_pairs: bool = False) -> str:
    """A packed path's kernel with the block formats it reads, e.g. "gguf-Q4_K+Q6_K", or for gguf-q8 its
    build and whether its process takes one-row pairs too, e.g. "gguf-q8-avx512-vnni-pairs-Q4_K+Q6_K"."""
    prefix = "gguf-q8-" if runner.path == "gguf-q8" else "gguf-"
    formats = dict.fromkeys(f for k in runner.linear_kernels() for f in k.name.removeprefix(prefix).split("+"))
    build = f"{q8dot.library().q8_level().decode()}-" if runner.path == "gguf-q8" else ""
    pairs = f"{q8dot.ONE_ROW_PAIRS}-" if one_row_pairs else ""
    return prefix + build + pairs + "+".join(sorted(formats))


def _build_static(model: nn.Module, path: str, max_tokens: int, collectives: Collectives | None, slots: int,
                  context: int, device: torch.device) -> tuple[ModelRunner, PathChoice]:
    from specdec.engine.static.runner import DEFAULT_CONTEXT, StaticRunner

    # On CPU the static runner is for tests of its logic; oneDNN keeps fp32 rows invariant there.
    kernel = "onednn" if device.type == "cpu" and path == "fp32" and torch.backends.mkldnn.is_available() else "dense"
    runner = StaticRunner(model, path, collectives, slots=slots, context=context or DEFAULT_CONTEXT,
                          rows=max_tokens, fp32_kernel=kernel)
    runner.capture()
    name = "-".join(["static", kernel, *(["pool"] if runner.attention == "pool" else []),
                     *(["compiled"] if runner.compiled else []), *(["graphs"] if runner.graphs is not None else [])])
    choice = PathChoice(path, name, describe_device(device), device.type == "cuda" or path == "fp32")
    log.info("compute path %s on the static runner (%s), %d slots of %d positions (%.0f MiB of KV), on %s",
             path, name, slots, runner.max_context, runner.pool.slot_bytes() * (slots + 1) / 2**20, choice.device)
    return runner, choice
