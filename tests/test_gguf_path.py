"""The gguf compute path: weights in their GGUF blocks, expanded exactly, float32 activations and sums.

The kernel's weights are checked bit for bit against gguf-py's dequantizer; its products against a
float64 matmul of those weights (the float32 path's numbers up to summation order); its rows against
themselves computed alone; and the model built on it against the float32 path on the same weights.
"""

from __future__ import annotations

import os
import time

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from specdec.engine.compute import resolve_path
from specdec.engine.cpu import blockquant
from specdec.engine.cpu.blockquant import (BF16, BLOCK, F16, F32, IQ4_NL, IQ4_XS, NAMES, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K,
                                           Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, BlockQuantKernel, BlockTensor)
from specdec.engine.gguf_model import load_gguf_model, pack_tiny
from specdec.engine.models import build_tiny_model, load_model
from specdec.engine.runner import Step

FORMATS = [Q4_K, Q5_K, Q6_K, Q3_K, Q8_0, Q5_0, Q4_0, IQ4_XS, IQ4_NL, Q5_1, Q4_1, Q2_K, F16, BF16]
TINY_GGUF = "tiny:seed=0,hidden=256,gguf=1"
# |y − x·Wᵀ| ≤ TOLERANCE · Σ_k |x_k·w_k|: float32 rounding of K products summed in 16 lanes (a
# 512-term sum's worst case is about 32·2⁻²⁴ of that; typical errors are far smaller).
TOLERANCE = 2e-6


def random_blocks(qtype: int, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random bytes in `qtype`'s layout, with finite float16 scales: every code and scale pattern. F16's and BF16's
    values are finite, of magnitudes 2^-30 to 2^10 (F16's subnormals among them) and both signs."""
    rng = np.random.default_rng(seed)
    if qtype in (F16, BF16):
        values = rng.standard_normal((rows, cols)) * 2.0 ** rng.integers(-30, 10, (rows, cols))
        return gguf.quants.quantize(values.astype(np.float32), gguf.GGMLQuantizationType(qtype)).view(np.uint8)
    per, size = BLOCK[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // per, size), dtype=np.uint8)
    scales = (rng.random((rows, cols // per, 2)) * 0.02 + 1e-4).astype(np.float16).view(np.uint8)
    offsets = {Q4_K: (0, 2), Q5_K: (0, 2), Q6_K: (208,), Q3_K: (108,), Q8_0: (0,), Q5_0: (0,), Q4_0: (0,), IQ4_XS: (0,),
               IQ4_NL: (0,), Q5_1: (0, 2), Q4_1: (0, 2), Q2_K: (80, 82)}[qtype]
    for offset, which in zip(offsets, range(2)):
        raw[..., offset:offset + 2] = scales[..., 2 * which:2 * which + 2].reshape(rows, cols // per, 2)
    return raw.reshape(rows, -1)


def gguf_dequantize(qtype: int, raw: np.ndarray, cols: int) -> torch.Tensor:
    values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype)).reshape(raw.shape[0], cols)
    return torch.from_numpy(np.array(values, dtype=np.float32))


@pytest.mark.parametrize("qtype", FORMATS, ids=NAMES.get)
def test_weights_expand_to_gguf_values_bit_for_bit(qtype):
    raw = random_blocks(qtype, 24, 512)
    tensor = BlockTensor.from_numpy(qtype, raw, 512)
    assert torch.equal(tensor.dequantize(), gguf_dequantize(qtype, raw, 512))
    rows = torch.tensor([5, 0, 23, 5])
    assert torch.equal(tensor.dequantize(rows), gguf_dequantize(qtype, raw, 512)[rows])


@pytest.mark.parametrize("qtype", FORMATS, ids=NAMES.get)
def test_products_are_float32_matmul_of_the_dequantized_weights(qtype):
    raw = random_blocks(qtype, 43, 512, seed=1)  # 43: a thread's columns not a whole number of F16's groups
    weight = gguf_dequantize(qtype, raw, 512)
    bias = torch.randn(43)
    kernel = BlockQuantKernel([BlockTensor.from_numpy(qtype, raw, 512)], bias)
    x = torch.randn(9, 512) * torch.logspace(-2, 2, 9)[:, None]
    exact = x.double() @ weight.double().T + bias.double()
    bound = TOLERANCE * (x.double().abs() @ weight.double().abs().T) + 1e-6
    assert bool(((kernel(x).double() - exact).abs() <= bound).all())


def test_each_row_is_the_same_whatever_it_is_computed_with():
    """1..14 rows cross every pass size (12 rows a pass with AVX-512, 6 with AVX2, 3 otherwise), and
    parts in different formats share one output."""
    parts = [BlockTensor.from_numpy(q, random_blocks(q, 16, 512, seed=q), 512) for q in FORMATS]
    assert_rows_invariant(BlockQuantKernel(parts), torch.randn(14, 512))


def assert_rows_invariant(kernel, x: torch.Tensor) -> None:
    """Each of x's rows gives the same bits alone, among its first 1..all neighbours, and in reverse order."""
    alone = torch.cat([kernel(row[None]) for row in x])
    for rows in range(1, x.shape[0] + 1):
        assert torch.equal(kernel(x[:rows]), alone[:rows]), f"{rows} rows"
    assert torch.equal(kernel(x.flip(0)), alone.flip(0))


def test_quantizers_round_trip_through_gguf():
    """The test-model quantizers write blocks gguf-py reads back to nearly the same weights."""
    weight = torch.randn(32, 512)
    for qtype, worst in ((Q4_K, 0.15), (Q5_K, 0.08), (Q6_K, 0.04)):
        tensor = blockquant.quantize(weight, qtype)
        back = gguf_dequantize(qtype, tensor.data.numpy(), 512)
        assert torch.equal(back, tensor.dequantize())
        assert (back - weight).abs().mean() / weight.abs().mean() < worst, NAMES[qtype]
    for qtype, worst in ((Q3_K, 0.25), (IQ4_XS, 0.12), (IQ4_NL, 0.12), (Q2_K, 0.4)):
        tensor = blockquant.quantize(weight, qtype)
        back = gguf_dequantize(qtype, tensor.data.numpy(), 512)
        assert torch.equal(back, tensor.dequantize())
        assert (back - weight).abs().mean() / weight.abs().mean() < worst, NAMES[qtype]


def test_q3_k_expands_to_gguf_values_at_its_ends():
    """Q3_K (a Q3_K_M file's most tensors) bit for bit against gguf-py at every code and both ends of its scales
    (−32 and 31), d of either sign, on the dequantizer and through the exact kernel's products."""
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, (24, 2, 110), dtype=np.uint8)
    raw[..., 108:110] = (rng.standard_normal((24, 2)) * 0.01).astype(np.float16).view(np.uint8).reshape(24, 2, 2)
    raw[0, 0, :108], raw[1, 0, :108] = 255, 0  # every code 7 and scale 31; every code 0 and scale −32
    raw = raw.reshape(24, -1)
    values = gguf_dequantize(Q3_K, raw, 512)
    assert values[0, :256].abs().min() > 0 and values[1, :256].abs().min() > 0  # the ends are really in it
    tensor = BlockTensor.from_numpy(Q3_K, raw, 512)
    assert torch.equal(tensor.dequantize(), values)
    for k in range(0, 512, 37):  # one weight at a time: the kernel's product with a unit vector is the weight
        assert torch.equal(BlockQuantKernel([tensor])(torch.eye(512)[k:k + 1])[0], values[:, k]), k


def test_tiny_gguf_model_on_both_paths():
    """Per layer the gguf kernels give the float32 products of the dequantized weights; the model's
    logits match the float32 path's on those weights (the default, gguf-q8, has tests/test_q8dot.py)."""
    gguf_model = load_model(TINY_GGUF, "cpu", dtype="gguf")
    fp32_model = load_model(TINY_GGUF, "cpu", dtype="float32")
    assert gguf_model.choice.path == "gguf" and gguf_model.choice.kernel == "gguf-Q4_K+Q6_K"
    assert fp32_model.choice.path == "fp32" and gguf_model.choice.row_invariant
    assert resolve_path("auto", "none", "cpu", packed_source=False) == "fp32"
    reference = build_tiny_model(TINY_GGUF)  # its float weights are the dequantized blocks
    x = torch.randn(5, 256)
    layers = gguf_model.runner.layers
    for index, kernel, linears in ((0, layers[0].qkv, ("q_proj", "k_proj", "v_proj")), (1, layers[1].out, ("o_proj",))):
        attn = reference.model.layers[index].self_attn
        weight = torch.cat([getattr(attn, name).weight for name in linears]).detach()
        bias = torch.cat([getattr(attn, name).bias if getattr(attn, name).bias is not None
                          else torch.zeros(getattr(attn, name).out_features) for name in linears]).detach()
        exact = x.double() @ weight.double().T + bias.double()
        bound = TOLERANCE * (x.double().abs() @ weight.double().abs().T) + 1e-6
        assert bool(((kernel(x).double() - exact).abs() <= bound).all())
        torch.testing.assert_close(kernel(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    tokens = [5, 17, 101, 3, 250, 42, 7, 9]
    logits = [m.runner.forward([Step(m.runner.new_cache(), tokens, logits=len(tokens))])[0]
              for m in (gguf_model, fp32_model)]
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)
    assert torch.equal(logits[0].argmax(-1), logits[1].argmax(-1))


def write_gguf(model, path, arch: str = "qwen2", vocabulary=None, leave_out: tuple[str, ...] = (),
               extra: dict[str, np.ndarray] | None = None) -> None:
    """`model` (a tiny one, packed or not) as a GGUF file as llama.cpp's converter lays it out (for arch llama, its
    query and key rows reordered as the converter's `permute` does). vocabulary(writer, size), if given, writes the
    header's vocabulary in place of a vocab_size key; the tensors named in leave_out are not written, those in extra
    are, as they are."""
    config = model.config
    writer = gguf.GGUFWriter(path, arch)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    if hasattr(config, "rms_norm_eps"):
        writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    else:
        writer.add_layer_norm_eps(config.layer_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"] if hasattr(config, "rope_parameters")
                              else config.rope_theta)
    if vocabulary is None:
        writer.add_vocab_size(config.vocab_size)
    else:
        vocabulary(writer, config.vocab_size)
    names = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch),
                                     config.num_hidden_layers)
    for name, param in model.named_parameters():
        owner, _, kind = name.rpartition(".")
        target = f"{names.get_name(owner)}.{kind}"
        if target in leave_out:
            continue
        block = getattr(model.get_submodule(owner), "block_weight", None) if kind == "weight" else None
        heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}.get(
            owner.rpartition(".")[2]) if arch == "llama" else None
        if block is None:
            writer.add_tensor(target, converter_rows(param.detach().float().numpy(), heads))
        else:
            writer.add_tensor(target, converter_rows(block.data.numpy(), heads), raw_shape=block.data.shape,
                              raw_dtype=gguf.GGMLQuantizationType(block.qtype))
    for name, array in (extra or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def converter_rows(array: np.ndarray, heads: int | None) -> np.ndarray:
    """llama.cpp's converter's reordering of a llama query or key tensor's rows (`heads` of them; None: as it is):
    within a head, rows i and i + D/2 become rows 2i and 2i + 1."""
    if heads is None:
        return array
    rows = array.shape[0]
    return array.reshape(heads, 2, rows // heads // 2, *array.shape[1:]).swapaxes(1, 2).reshape(array.shape)


@pytest.mark.parametrize("dtype", ["gguf-q8", "gguf"])
def test_a_gguf_file_computes_its_models_logits_and_is_not_mapped_after_the_load(tmp_path, dtype):
    """A GGUF file through `load_model` gives the logits of the model it was written from, bit for bit, and no view
    of the file's mapping outlives the load (its blocks are read where they lie; what the kernels and the
    embedding keep is copied once)."""
    file = tmp_path / "tiny.gguf"
    write_gguf(build_tiny_model(TINY_GGUF), file)
    from_file, in_code = (load_model(spec, "cpu", dtype=dtype) for spec in (str(file), TINY_GGUF))
    kernels = [m.choice.kernel.replace("-pairs-", "-") for m in (from_file, in_code)]  # pairs: timed at each load
    assert from_file.choice.path == dtype and kernels[0] == kernels[1]
    tokens = [5, 17, 101, 3, 250, 42, 7, 9]
    logits = [m.runner.forward([Step(m.runner.new_cache(), tokens, logits=len(tokens))])[0]
              for m in (from_file, in_code)]
    assert torch.equal(logits[0], logits[1])
    mapped = [line for line in open("/proc/self/maps").read().splitlines() if line.endswith(str(file))]
    assert not mapped, "a view of the file outlived the load"


def test_a_gguf_file_loads_with_its_blocks(tmp_path):
    """A GGUF file written here (qwen2 layout) loads on the gguf path with its tensors' own bytes, and
    on the float32 path to the same values as transformers' own GGUF loader gives."""
    from transformers import AutoModelForCausalLM

    source = build_tiny_model(TINY_GGUF)
    write_gguf(source, tmp_path / "tiny.gguf")
    ours = load_gguf_model(tmp_path / "tiny.gguf", source.config, packed=True)
    written = {name: m.block_weight for name, m in source.named_modules() if hasattr(m, "block_weight")}
    loaded = {name: m.block_weight for name, m in ours.named_modules() if hasattr(m, "block_weight")}
    assert set(loaded) == set(written) and len(written) == 7 * source.config.num_hidden_layers + 2
    for name, block in written.items():
        assert loaded[name].qtype == block.qtype and torch.equal(loaded[name].data, block.data), name
    assert ours.model.layers[1].self_attn.q_proj.block_weight.qtype == Q4_K
    floats = load_gguf_model(tmp_path / "tiny.gguf", source.config, packed=False)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf", dtype=torch.float32)
    for (name, mine), (_, hf) in zip(sorted(floats.state_dict().items()), sorted(theirs.state_dict().items()),
                                     strict=True):
        assert torch.equal(mine, hf), name


def write_ternary_gguf(path):
    """The tiny GGUF model with its first q projection in TQ2_0 (ternary, which no kernel reads), written to `path`:
    the model and those blocks."""
    from types import SimpleNamespace

    model = build_tiny_model(TINY_GGUF)
    q_proj = model.model.layers[0].self_attn.q_proj
    blocks = gguf.quants.quantize(q_proj.weight.detach().numpy(), gguf.GGMLQuantizationType.TQ2_0)
    q_proj.block_weight = SimpleNamespace(data=torch.from_numpy(blocks), qtype=int(gguf.GGMLQuantizationType.TQ2_0))
    write_gguf(model, path)
    return model, blocks


def test_a_tensor_in_a_format_the_kernels_do_not_read_is_held_as_float32_and_said(tmp_path, caplog):
    """A TQ2_0 linear (ternary) loads on the packed paths as float32 with gguf-py's values, and the load says which
    formats and how many MiB went that way."""
    model, blocks = write_ternary_gguf(tmp_path / "tq2_0.gguf")
    q_proj, ternary = model.model.layers[0].self_attn.q_proj, gguf.GGMLQuantizationType.TQ2_0
    with caplog.at_level("WARNING", logger="specdec.engine.gguf_model"):
        loaded = load_model(str(tmp_path / "tq2_0.gguf"), "cpu", dtype="gguf-q8")
    assert loaded.choice.path == "gguf-q8" and "F32" in loaded.choice.kernel.split("-")[-1].split("+")
    mib = q_proj.weight.numel() * 4 / 2**20
    assert "formats the gguf kernels do not read" in caplog.text and f"TQ2_0 ×1, held as float32 ({mib:.1f} MiB)" \
        in caplog.text, caplog.text
    held = load_gguf_model(tmp_path / "tq2_0.gguf", model.config).model.layers[0].self_attn.q_proj.block_weight
    assert held.qtype == F32
    expected = gguf.quants.dequantize(blocks, ternary).reshape(q_proj.weight.shape)
    assert torch.equal(held.dequantize(), torch.from_numpy(expected.astype(np.float32)))


@pytest.mark.parametrize("formats",
                         [{Q4_K: Q3_K}, {Q4_K: IQ4_XS, Q6_K: IQ4_NL}, {Q4_K: Q4_1, Q6_K: Q5_1}, {Q4_K: Q2_K},
                          {Q4_K: F16, Q6_K: BF16}],
                         ids=["Q3_K", "IQ4_XS+IQ4_NL", "Q4_1+Q5_1", "Q2_K", "F16+BF16"])
def test_a_gguf_in_other_formats_runs_on_both_block_paths_as_it_ships(tmp_path, caplog, formats):
    """A GGUF file whose Q4_K linears are Q3_K (as a Q3_K_M file's are) or Q2_K (a Q2_K file's), or IQ4_XS with
    IQ4_NL (an IQ4_XS file's, the latter where a width is not a multiple of 256: here the Q6_K ones), or Q4_1 with
    Q5_1 (older files'; Q5_1 is a Q5_K_M file's where a width is not a multiple of 256), or F16 and BF16 (unquantized
    files), keeps them in their own blocks on both block paths, with nothing in float32, and the exact path computes
    what the float32 path computes with the same file."""
    model = build_tiny_model(TINY_GGUF)
    written = {}
    for name, module in model.named_modules():
        block = getattr(module, "block_weight", None)
        if block is not None and block.qtype in formats:
            module.block_weight = written[name] = blockquant.quantize(block.dequantize(), formats[block.qtype])
    assert len(written) >= 4 * model.config.num_hidden_layers
    file = tmp_path / "other.gguf"
    write_gguf(model, file)
    kept = {NAMES[qtype] for qtype in formats.values()} | ({"Q6_K"} if Q6_K not in formats else set())
    tokens = [5, 17, 101, 3, 250, 42, 7, 9, 33, 64, 128, 11]
    logits = {}
    for path in ("gguf", "gguf-q8", "fp32"):
        with caplog.at_level("WARNING", logger="specdec.engine.gguf_model"):
            loaded = load_model(str(file), "cpu", dtype=path)
        assert loaded.choice.path == path
        if path != "fp32":  # nothing in float32
            assert set(loaded.choice.kernel.split("-")[-1].split("+")) == kept, loaded.choice.kernel
        logits[path] = loaded.runner.forward([Step(loaded.runner.new_cache(), tokens, logits=len(tokens))])[0]
    assert "do not read" not in caplog.text
    held = load_gguf_model(file, model.config)
    for name, block_written in written.items():
        block = held.get_submodule(name).block_weight
        assert block.qtype == block_written.qtype and torch.equal(block.data, block_written.data), name
    torch.testing.assert_close(logits["gguf"], logits["fp32"], rtol=1e-4, atol=1e-4)
    # the integer path tracks the exact one (8-bit activations: a near tie of random weights may flip)
    assert bool((F.cosine_similarity(logits["gguf-q8"], logits["gguf"], dim=-1) > 0.995).all())
    assert (logits["gguf-q8"].argmax(-1) == logits["gguf"].argmax(-1)).float().mean() >= 0.75


def test_a_gguf_of_another_architecture_goes_to_transformers_and_is_refused_clearly(tmp_path, caplog):
    """The gguf loader reads qwen2, qwen3 and llama layouts; another GGUF goes to transformers' loader (float32),
    with a warning, and a model the runner cannot compute is refused at load with the reason (here StableLM's
    rotary embedding over a quarter of each head: before, it loaded and its first pass raised a shape error);
    `--dtype gguf` refuses the file clearly."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from specdec.engine.gguf_model import UnsupportedGguf
    from specdec.engine.runner import UnsupportedModel

    torch.manual_seed(0)
    other = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "stablelm", vocab_size=260, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512))
    write_gguf(pack_tiny(other), tmp_path / "other.gguf", arch="stablelm")
    with caplog.at_level("WARNING", logger="specdec.engine.models"), \
            pytest.raises(UnsupportedModel, match="rotary embeddings over part of each head"):
        load_model(str(tmp_path / "other.gguf"), "cpu")
    assert "architecture 'stablelm'" in caplog.text
    with pytest.raises(UnsupportedGguf, match="stablelm"):
        load_model(str(tmp_path / "other.gguf"), "cpu", dtype="gguf")


@pytest.mark.parametrize("path", ["gguf", "gguf-q8"])
def test_hf_baseline_gets_the_same_kernels(path, tmp_path):
    """The benchmark's Hugging Face baseline runs on the same block kernels (a slow baseline is no win). Its
    attention is Hugging Face's, over a float32 cache; gguf-q8's keeps keys and values in halves (within 2^-12
    of themselves), which moves some activations across an 8-bit rounding edge: the same greedy choices, logits
    at a cosine ≥ 0.999 (0.9995 and above measured)."""
    from specdec.engine.cpu.q8dot import Q8Kernel
    from specdec.engine.models import load_hf_model
    from specdec.tools.bench.baseline import swap_linears

    hf = swap_linears(load_hf_model(TINY_GGUF, torch.device("cpu"), packed=True), path)
    file = tmp_path / "tiny.gguf"  # the same from a file: transformers' modules, which `generate` runs
    write_gguf(build_tiny_model(TINY_GGUF), file)
    from_file = swap_linears(load_hf_model(str(file), torch.device("cpu"), packed=True), path)
    assert hasattr(from_file, "generate")
    assert isinstance(hf.model.layers[0].mlp.down_proj, Q8Kernel if path == "gguf-q8" else BlockQuantKernel)
    ours = load_model(TINY_GGUF, "cpu", dtype=path).runner
    tokens = [5, 17, 101, 3, 250, 42]
    with torch.inference_mode():
        theirs = hf(input_ids=torch.tensor([tokens])).logits[0]
        assert torch.equal(from_file(input_ids=torch.tensor([tokens])).logits[0], theirs)
    mine = ours.forward([Step(ours.new_cache(), tokens, logits=len(tokens))])[0]
    if path == "gguf":
        torch.testing.assert_close(theirs, mine, rtol=1e-4, atol=1e-4)
    assert torch.nn.functional.cosine_similarity(theirs, mine, dim=-1).min() >= 0.999
    assert torch.equal(theirs.argmax(-1), mine.argmax(-1))


def test_without_a_compiler_the_kernel_is_refused_clearly(tmp_path, monkeypatch):
    from specdec.engine.cpu import native

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", "")
    with pytest.raises(native.KernelUnavailable, match="no C compiler"):
        native.build("x86-64-v2")


def test_a_new_kernel_build_removes_old_builds_long_unused(tmp_path, monkeypatch):
    """Every change of the C files makes a new build; one leaves the builds of its library and variant past the
    last three used where no one loaded them for a week, and nothing else."""
    from specdec.engine.cpu import native

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    folder = tmp_path / "kernels"
    folder.mkdir()
    week = 7 * 24 * 3600
    ages = {"0" * 16: 2 * week, "1" * 16: 3 * week, "2" * 16: 60.0, "3" * 16: 4 * week}  # by digest: seconds unused
    for digest, age in ages.items():
        for name in (f"blockquant-{digest}-x86-64-v2.so", f".blockquant-{digest}-x86-64-v2.so.lock"):
            (folder / name).touch()
            os.utime(folder / name, (time.time() - age,) * 2)
    others = [folder / f"blockquant-{'3' * 16}-x86-64-v3.so", folder / f"q8dot-{'3' * 16}-x86-64-v2.so"]
    for other in others:  # another variant's, and another library's
        other.touch()
        os.utime(other, (time.time() - 5 * week,) * 2)
    built = native.build("x86-64-v2")

    def files(digest: str) -> set[str]:
        return {f"blockquant-{digest}-x86-64-v2.so", f".blockquant-{digest}-x86-64-v2.so.lock"}

    # kept: the new build, the one used a minute ago, the next most recent (two weeks); gone: three and four weeks
    kept = files(built.name.split("-")[1]) | files("2" * 16) | files("0" * 16)
    assert {p.name for p in folder.glob("*blockquant-*-x86-64-v2.so*")} == kept
    assert all(other.exists() for other in others)
    before = built.stat().st_mtime
    os.utime(built, (before - week,) * 2)
    assert native.build("x86-64-v2") == built and built.stat().st_mtime > before - 60, "a load marks it used"


def test_without_the_kernel_a_gguf_model_runs_on_fp32_with_the_same_weights(monkeypatch, caplog):
    with_kernel = load_model(TINY_GGUF, "cpu", dtype="float32").runner
    monkeypatch.setattr(blockquant, "available", lambda: False)  # as on a machine with no compiler
    with caplog.at_level("WARNING", logger="specdec.engine.compute"):
        loaded = load_model(TINY_GGUF, "cpu")
    assert loaded.choice.path == "fp32"
    assert "the gguf kernels cannot be built here" in caplog.text, "the fallback must be said, not silent"
    with pytest.raises(ValueError, match="C kernel"):
        resolve_path("gguf", "none", "cpu", packed_source=True)
    tokens = [5, 17, 101, 3]
    logits = [r.forward([Step(r.new_cache(), tokens, logits=4)])[0] for r in (with_kernel, loaded.runner)]
    assert torch.equal(logits[0], logits[1]), "gguf-py's numpy dequantizer gives the kernel's values"


def test_tensor_parallel_shards_a_gguf_model_on_fp32(caplog):
    """A Q4_K row splits only at 256-column blocks, which the MLP width need not give each rank: a
    sharded GGUF model runs on fp32 weights (the same values) instead of failing."""
    from specdec.engine.runner import Collectives

    with caplog.at_level("INFO", logger="specdec.engine.models"):
        loaded = load_model(TINY_GGUF, "cpu", shard=lambda model: Collectives())
    assert loaded.choice.path == "fp32"
    assert "runs on the fp32 path" in caplog.text, "the switch to fp32 must be logged"


def test_a_q4_0_gguf_runs_on_both_block_paths(tmp_path):
    """A GGUF file whose linears are Q4_0 (as many published ones are) keeps them as Q4_0 on the exact path and
    the integer path, and the exact path computes what the float32 path computes with the same file."""
    from specdec.engine.requantize import requantize_linears

    model = build_tiny_model("tiny:seed=0,hidden=224,gguf=1")  # Q5_0 and Q8_0: requantized to Q4_0 below
    requantize_linears(model, Q4_0)
    write_gguf(model, tmp_path / "q4_0.gguf")
    tokens = [5, 17, 101, 3, 250, 42]
    logits = {}
    for path in ("gguf", "gguf-q8", "fp32"):
        loaded = load_model(str(tmp_path / "q4_0.gguf"), "cpu", dtype=path)
        assert loaded.choice.path == path
        if path != "fp32":
            assert loaded.choice.kernel.endswith("-Q4_0"), loaded.choice.kernel
        logits[path] = loaded.runner.forward([Step(loaded.runner.new_cache(), tokens, logits=len(tokens))])[0]
    torch.testing.assert_close(logits["gguf"], logits["fp32"], rtol=1e-4, atol=1e-4)
    assert torch.equal(logits["gguf-q8"].argmax(-1), logits["gguf"].argmax(-1))
