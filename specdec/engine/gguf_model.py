"""A GGUF model as a Hugging Face module whose weights stay in their block formats.

`load_gguf_model(file, config)` builds the model's modules without weights (the meta device),
then gives every linear layer its GGUF tensor as a `BlockTensor` (attribute `block_weight`, read by
`specdec.engine.runner` on the "gguf" path), the embedding included. Norms and biases are
small and become ordinary float32 parameters. With `packed=False` the same tensors are dequantized
into ordinary float32 weights instead: the float32 path then computes with exactly the weights the
gguf path expands in registers, and nothing goes through transformers' slower GGUF conversion.

Supported: the Llama-family architectures qwen2, qwen3 and llama (Llama 2 and 3, Mistral 7B, SmolLM, TinyLlama and
the others llama.cpp's converter writes as "llama": their query and key rows are put back in transformers' order, and
Llama 3.1's rotary frequency factors applied); others load through transformers (`specdec.engine.models`).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from specdec.engine import decoder_tree
from specdec.engine.cpu import blockquant, iq3_s
from specdec.engine.cpu.blockquant import BLOCK, F32, Q6_K, BlockTensor
from specdec.engine.memory_budget import check_fits
from specdec.weights.gguf_file import ARCHITECTURES, GgufFormatError, GgufTensor, read_gguf

log = logging.getLogger(__name__)


class UnsupportedGguf(ValueError):
    """A GGUF file this loader does not handle (its architecture or a tensor's layout)."""


class UnreadGguf(ValueError):
    """A GGUF that defines more than this loader (or transformers') reads: a rotary scaling, or layer tensors the
    model built from its config has no place for. Refused, not computed without them."""


# llama.cpp's converter reorders a llama model's query and key rows (weights and biases) for its rotary embedding,
# which rotates neighbouring pairs: within each head, rows i and i + D/2 become rows 2i and 2i + 1. By architecture:
# the tensors it reorders, and the config's count of heads in each.
REORDERED_ROWS = {"llama": {"attn_q": "num_attention_heads", "attn_k": "num_key_value_heads"}}
ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's per-frequency divisors (Llama 3.1's long-context scaling)


def transformers_row_order(tensor: GgufTensor, arch: str, config) -> np.ndarray | None:
    """The row order that undoes the converter's reordering of `tensor` (None where it reorders nothing): row i of
    transformers' tensor is row order[i] of the file's. Rows are whole blocks, so no value changes."""
    parts = tensor.name.split(".")  # blk.N.attn_q.weight
    heads_key = REORDERED_ROWS.get(arch, {}).get(parts[2] if len(parts) == 4 and parts[0] == "blk" else "")
    if heads_key is None:
        return None
    rows, heads = int(tensor.shape[-1]), getattr(config, heads_key)
    if rows % (2 * heads):
        raise UnsupportedGguf(f"{tensor.name}: {rows} rows do not split into {heads} heads of pairs")
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(1, 2).reshape(-1)


def _held_format(tensor: GgufTensor) -> int:
    """The format a packed load keeps a GGUF tensor in: its own where the kernels read it, Q6_K for IQ3_S's, else
    F32."""
    cols = int(tensor.shape[0])  # GGUF lists dimensions innermost first
    qtype = int(tensor.tensor_type)
    if qtype in BLOCK and qtype != F32 and cols % BLOCK[qtype][0] == 0:  # else float32 (F16, BF16 widths)
        return qtype
    if qtype == iq3_s.IQ3_S and cols % 256 == 0:
        return Q6_K
    return F32


def _block_tensor(tensor: GgufTensor) -> BlockTensor:
    """A GGUF tensor as a `BlockTensor` in its held format (`_held_format`)."""
    import gguf

    cols, held = int(tensor.shape[0]), _held_format(tensor)
    if held == int(tensor.tensor_type) and held != F32:
        return BlockTensor.from_numpy(held, tensor.data, cols)
    if held == Q6_K:
        return BlockTensor.from_numpy(Q6_K, iq3_s.as_q6_k(np.asarray(tensor.data)), cols)
    values = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type).reshape(-1, cols)
    if cols % BLOCK[F32][0]:
        raise UnsupportedGguf(f"{tensor.name}: {cols} columns is not a multiple of {BLOCK[F32][0]}")
    return BlockTensor.from_float(torch.from_numpy(values.astype(np.float32)))


def held_bytes(tensors: list[GgufTensor], packed: bool) -> tuple[int, Counter[str]]:
    """The bytes a load keeps of `tensors` (in their own blocks, IQ3_S's as Q6_K's, the rest float32; all float32
    without `packed`), and the formats held as float32 where packed: tensors of each."""
    total, as_float = 0, Counter()
    for tensor in tensors:
        held = _held_format(tensor) if packed else F32
        weights, size = BLOCK[held]
        total += int(np.prod(tensor.shape)) * size // weights
        if held == F32 and packed and int(tensor.tensor_type) != F32:
            as_float[tensor.tensor_type.name] += 1
    return total, as_float


def _float_tensor(tensor: GgufTensor, shape: torch.Size, rows: np.ndarray | None = None) -> torch.Tensor:
    """`tensor`'s values in float32 as `shape`, its outer dimension in the order `rows` if given."""
    import gguf

    values = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
    values = torch.from_numpy(np.array(values, dtype=np.float32)).reshape(shape)
    return values if rows is None else values[torch.from_numpy(rows)].contiguous()


def gguf_config(file: Path):
    """The transformers config of a GGUF file of an architecture this loader reads (None for another, or a file our
    reader does not take), from its header: transformers' own key mapping (`GGUF_CONFIG_MAPPING`), its tied-embedding
    rule (no output.weight) and its vocabulary size (the token list's length), applied to our reader's fields.
    transformers builds the same config through gguf-py's reader: 12 s over the 1.5B target's vocabulary."""
    from transformers import AutoConfig
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    try:
        header = read_gguf(file)
    except GgufFormatError:  # e.g. big-endian: transformers' reader may still take it
        return None
    arch = header.architecture
    if arch not in ARCHITECTURES:
        return None
    values = {"tie_word_embeddings": all(t.name != "output.weight" for t in header.tensors),
              **GGUF_CONFIG_DEFAULTS_MAPPING.get(arch, {})}
    for key, value in header.fields.items():
        prefix, _, rest = key.partition(".")
        name = GGUF_CONFIG_MAPPING.get(prefix, {}).get(rest)
        if name not in (None, -1):
            values[name] = value
    if "vocab_size" not in values and "tokenizer.ggml.tokens" in header.array_lengths:
        values["vocab_size"] = header.array_lengths["tokenizer.ggml.tokens"]
    rope = rope_scaling(header.fields, arch)
    if rope is not None:
        values["rope_parameters"] = {**rope, **({"rope_theta": values["rope_theta"]} if "rope_theta" in values else {})}
    config = AutoConfig.for_model(**values)
    config.name_or_path = str(file.parent)  # as transformers names a config read from a file in that folder
    return config


# llama.cpp's YaRN defaults (its context parameters), where a file names none; transformers' are the same.
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0


def rope_scaling(fields: dict, arch: str) -> dict | None:
    """transformers' rope parameters for the rotary scaling a GGUF header names (`{arch}.rope.scaling.*`, which
    transformers' own config mapping leaves out): linear (positions divided by the factor) or YaRN, as llama.cpp
    reads them; None where the file names none. UnreadGguf for another type, or a YaRN setting beyond these."""
    def field(name):
        return fields.get(f"{arch}.rope.scaling.{name}")

    kind = field("type")
    if kind in (None, "none"):
        return None
    factor = field("factor")
    if kind == "linear" and factor:
        return {"rope_type": "linear", "factor": float(factor)}
    unread = [name for name in ("yarn_ext_factor", "yarn_attn_factor", "yarn_log_multiplier", "attn_factor")
              if field(name) is not None]
    if kind == "yarn" and factor and field("original_context_length") and not unread:
        return {"rope_type": "yarn", "factor": float(factor),
                "original_max_position_embeddings": int(field("original_context_length")),
                "beta_fast": float(field("yarn_beta_fast") or YARN_BETA_FAST),
                "beta_slow": float(field("yarn_beta_slow") or YARN_BETA_SLOW)}
    named = f" with {', '.join(unread)}" if unread else ""
    raise UnreadGguf(f"{arch}: rotary scaling {kind!r}{named} is not read here (nor by transformers' GGUF "
                     "loader): the model would be computed without it")


def load_gguf_model(file: Path, config, packed: bool = True, hf_modules: bool = True) -> nn.Module:
    """The causal LM in `file` (a GGUF), its linear weights packed (or dequantized to float32); on transformers'
    modules, or (hf_modules=False, packed) on our module tree where it stands for the model (`_module_tree`)."""
    import gguf

    try:
        header = read_gguf(file)
    except GgufFormatError as error:  # e.g. a big-endian file: transformers' loader may still take it
        raise UnsupportedGguf(str(error)) from error
    arch = header.architecture
    if arch not in ARCHITECTURES:
        raise UnsupportedGguf(f"{file.name}: architecture {arch!r}; the gguf path reads {', '.join(ARCHITECTURES)}")
    need, as_float = held_bytes(header.tensors, packed)
    held = ", ".join(f"{name} ×{n}" for name, n in sorted(as_float.items()))
    check_fits(f"{file.name} {'in its blocks' if packed else 'in float32'}", need,
               f" ({held} held as float32: formats no gguf kernel reads)" if held else "")
    names = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch),
                                     config.num_hidden_layers)
    tensors = {t.name: t for t in header.tensors}
    unused = {name for name in tensors if name.startswith("blk.")}  # a layer's tensor the model has no place for
    with torch.device("meta"):
        model = _module_tree(config, packed and not hf_modules)
    modules = dict(model.named_modules())
    as_float: Counter[str] = Counter()  # the formats no kernel reads, held as float32: tensors of each
    rewritten: Counter[str] = Counter()  # IQ3_S's, read as Q6_K blocks of the same values
    float_bytes = 0
    with torch.no_grad():
        for name, param in list(model.named_parameters()):
            owner_name, _, kind = name.rpartition(".")
            owner = modules[owner_name]
            tensor = tensors.get(f"{names.get_name(owner_name)}.{kind}")
            if tensor is None and owner_name == "lm_head":  # tied: the output layer reads the embedding
                tensor = tensors[f"{names.get_name('model.embed_tokens')}.weight"]
            if tensor is None:
                raise UnsupportedGguf(f"{file.name}: no tensor for {name}")
            unused.discard(tensor.name)
            rows = transformers_row_order(tensor, arch, config)
            if kind == "weight" and isinstance(owner, (nn.Linear, nn.Embedding)):
                if rows is not None:
                    tensor = replace(tensor, data=np.ascontiguousarray(tensor.data[rows]))
                block = _block_tensor(tensor)
                if block.qtype == F32 and int(tensor.tensor_type) != F32:
                    as_float[tensor.tensor_type.name] += 1
                    float_bytes += block.data.numel() * block.data.element_size()
                elif block.qtype != int(tensor.tensor_type):
                    rewritten[tensor.tensor_type.name] += 1
                if (block.rows, block.cols) != tuple(param.shape):
                    raise UnsupportedGguf(f"{tensor.name}: shape {(block.rows, block.cols)}, model wants "
                                          f"{tuple(param.shape)}")
                attach(owner, block, packed)
            else:
                setattr(owner, kind, nn.Parameter(_float_tensor(tensor, param.shape, rows), requires_grad=False))
        head = model.get_output_embeddings()
        if getattr(config, "tie_word_embeddings", False):
            if packed:
                head.block_weight = model.model.embed_tokens.block_weight
            else:
                head.weight = model.model.embed_tokens.weight
    if unused:
        raise UnreadGguf(f"{file.name}: tensors the {arch} model built from its config has no place for: "
                         f"{', '.join(sorted(unused)[:4])}{' …' if len(unused) > 4 else ''}")
    _materialize_buffers(model)
    if ROPE_FREQS in tensors:
        _divide_rotary_frequencies(model, _float_tensor(tensors[ROPE_FREQS], (-1,)))
    if rewritten:
        log.info("%s: %s read as Q6_K blocks of the same values", file.name,
                 ", ".join(f"{name} ×{n}" for name, n in sorted(rewritten.items())))
    if as_float and packed:
        held = ", ".join(f"{name} ×{n}" for name, n in sorted(as_float.items()))
        read = ", ".join(blockquant.NAMES[t] for t in BLOCK if t != F32) + ", IQ3_S (as Q6_K)"
        log.warning("%s: tensors in formats the gguf kernels do not read (they read %s): %s, held as float32 "
                    "(%.1f MiB) and multiplied as such", file.name, read, held, float_bytes / 2**20)
    return model.eval()


def _module_tree(config, ours: bool) -> nn.Module:
    """The model's modules to attach the file's tensors to: our own tree where asked and it stands for the model
    (`specdec.engine.decoder_tree`: no transformers model code to import), else transformers' model (one that its
    `generate` runs too: float32 weights, or the baselines' blocks)."""
    if ours and decoder_tree.supports(config):
        return decoder_tree.CausalLM(config)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def attach(module: nn.Module, block: BlockTensor, packed: bool) -> None:
    """Give a linear (or embedding) layer its weights: the block tensor, or its dequantized values."""
    if packed:
        module.block_weight = block
        module.weight = nn.Parameter(torch.empty(module.weight.shape, device="meta"), requires_grad=False)
    else:
        module.weight = nn.Parameter(block.dequantize(), requires_grad=False)


def _materialize_buffers(model: nn.Module) -> None:
    """Rebuild the buffers (rotary frequencies) that `from_config` left on the meta device (our tree computes its
    own on the CPU)."""
    decoder = model.model
    if decoder.rotary_emb.inv_freq.is_meta:
        decoder.rotary_emb = type(decoder.rotary_emb)(config=model.config)
    left = [name for name, b in model.named_buffers() if b.is_meta]
    if left:
        raise UnsupportedGguf(f"buffers left without values: {left}")


def _divide_rotary_frequencies(model: nn.Module, factors: torch.Tensor) -> None:
    """llama.cpp's rope_freqs: each rotary frequency divided by its factor [head_dim / 2], as llama.cpp computes
    them, where the config names no scaling of its own (a bare file's never does; a config.json's Llama 3 scaling
    gives transformers' own frequencies, from which the converter wrote these factors)."""
    rotary = model.model.rotary_emb
    if (getattr(model.config, "rope_parameters", None) or {}).get("rope_type", "default") != "default":
        return
    if factors.shape != rotary.inv_freq.shape:
        raise UnreadGguf(f"{ROPE_FREQS}: {tuple(factors.shape)} factors for {rotary.inv_freq.numel()} "
                         "rotary frequencies")
    rotary.inv_freq = rotary.inv_freq / factors
    rotary.original_inv_freq = rotary.inv_freq


def pack_tiny(model: nn.Module) -> nn.Module:
    """Quantize a float model's linear layers and embedding in place, as a Q4_K_M file would
    (Q6_K for v and down projections and the output layer, Q4_K elsewhere; Q8_0 and Q5_0 where a
    width is not a multiple of 256), and set its float weights to the dequantized values.

    The result runs on either path: packed (`block_weight`) or float32 (the same values)."""
    decoder = model.model
    wide = {id(layer.self_attn.v_proj) for layer in decoder.layers} | {id(layer.mlp.down_proj)
                                                                        for layer in decoder.layers}
    wide.add(id(model.get_output_embeddings()))
    with torch.no_grad():
        for module in [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Embedding))]:
            k_quant = module.weight.shape[1] % 256 == 0
            qtype = ((blockquant.Q6_K if k_quant else blockquant.Q5_0) if id(module) in wide
                     else (blockquant.Q4_K if k_quant else blockquant.Q8_0))
            block = blockquant.quantize(module.weight, qtype)
            module.block_weight = block
            module.weight.copy_(block.dequantize())
    return model
