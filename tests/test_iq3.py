"""IQ3_XXS and IQ3_S tensors read as Q6_K blocks of the same values (specdec/engine/cpu/iq3.py): bit for bit against
gguf-py's dequantizer, through a GGUF file on both block paths, and left to float32 where a block cannot be."""

from __future__ import annotations

from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_gguf_path import TINY_GGUF, write_gguf

from specdec.engine.cpu import iq3
from specdec.engine.cpu.blockquant import F32, Q6_K, BlockTensor
from specdec.engine.gguf_model import load_gguf_model
from specdec.engine.models import build_tiny_model, load_model
from specdec.engine.runner import Step

FORMATS = [iq3.IQ3_XXS, iq3.IQ3_S]


def random_iq3(qtype: int, rows: int, cols: int, seed: int = 0, scale: float = 0.02) -> np.ndarray:
    """Random bytes in `qtype`'s layout (every grid row, sign pattern and block scale), with float16 d of both signs
    from scale/1000 to scale: the smallest of them float16 subnormals whose halves are float16 too."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, cols // 256, iq3.BYTES[qtype]), dtype=np.uint8)
    d = scale * 10.0 ** -rng.uniform(0, 3, (rows, cols // 256, 1)) * rng.choice([-1, 1], (rows, cols // 256, 1))
    d = d.astype(np.float16)
    bits = d.view(np.uint16)
    d = np.where((np.abs(d) < 2.0**-13) & (bits & 1 == 1), (bits ^ 1).view(np.float16), d)  # halves exact
    raw[..., :2] = d.view(np.uint8)
    return raw.reshape(rows, -1)


def gguf_values(qtype: int, raw: np.ndarray, cols: int) -> torch.Tensor:
    values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype)).reshape(raw.shape[0], cols)
    return torch.from_numpy(np.array(values, dtype=np.float32))


@pytest.mark.parametrize("qtype", FORMATS, ids=iq3.NAMES.get)
def test_iq3_blocks_become_q6_k_blocks_of_the_same_values(qtype):
    raw = random_iq3(qtype, 40, 1024)
    rewritten = iq3.as_q6_k(qtype, raw)
    assert rewritten.shape == (40, 4 * 210)
    expected = gguf_values(qtype, raw, 1024)
    assert torch.equal(BlockTensor.from_numpy(Q6_K, rewritten, 1024).dequantize(), expected)  # the exact kernel
    assert torch.equal(gguf_values(Q6_K, rewritten, 1024), expected)  # and gguf-py's reading of the Q6_K bytes


def test_the_rewrite_goes_in_steps_that_join_up(monkeypatch):
    """A tensor longer than one numpy step gives the blocks it gives in one."""
    raw = random_iq3(iq3.IQ3_S, 9, 768, seed=3)
    whole = iq3.as_q6_k(iq3.IQ3_S, raw)
    monkeypatch.setattr(iq3, "ROWS_AT_ONCE", 5)
    assert np.array_equal(iq3.as_q6_k(iq3.IQ3_S, raw), whole)


def test_an_iq3_xxs_block_whose_half_scale_is_no_float16_is_refused():
    raw = random_iq3(iq3.IQ3_XXS, 4, 512)
    assert iq3.as_q6_k(iq3.IQ3_XXS, raw) is not None
    raw[2, 98:100] = np.array([0x0003], dtype=np.uint16).view(np.uint8)  # 3 · 2⁻²⁴: its half is 1.5 · 2⁻²⁴
    assert iq3.as_q6_k(iq3.IQ3_XXS, raw) is None


def iq3_model(formats: dict[str, int]):
    """The tiny GGUF model with each linear named by a key of `formats` (a suffix of its module name) in that IQ3
    format, random blocks at the scale of its weights: the model, and {module name: the blocks written}."""
    model = build_tiny_model(TINY_GGUF)
    written = {}
    for name, module in model.named_modules():
        qtype = next((q for suffix, q in formats.items() if name.endswith(suffix)), None)
        if qtype is not None:
            rows, cols = module.weight.shape
            raw = random_iq3(qtype, rows, cols, seed=len(written), scale=float(module.weight.detach().abs().max()) / 60)
            module.block_weight = SimpleNamespace(data=torch.from_numpy(raw), qtype=qtype)
            written[name] = raw
    return model, written


def test_a_gguf_with_iq3_linears_runs_on_both_block_paths_as_q6_k(tmp_path, caplog):
    """A file whose q, k, v, gate and up projections are IQ3_XXS and whose down projections are IQ3_S (as an IQ3_XS
    file mixes them) loads them as Q6_K blocks of gguf-py's values, nothing in float32, says so, and the exact path
    computes what the float32 path computes with the same file."""
    formats = {"q_proj": iq3.IQ3_XXS, "k_proj": iq3.IQ3_XXS, "v_proj": iq3.IQ3_XXS, "gate_proj": iq3.IQ3_XXS,
               "up_proj": iq3.IQ3_XXS, "down_proj": iq3.IQ3_S}
    model, written = iq3_model(formats)
    file = tmp_path / "iq3.gguf"
    write_gguf(model, file)
    with caplog.at_level("INFO", logger="specdec.engine.gguf_model"):
        held = load_gguf_model(file, model.config)
    layers = model.config.num_hidden_layers
    assert f"IQ3_S ×{layers}, IQ3_XXS ×{5 * layers} read as Q6_K blocks" in caplog.text, caplog.text
    for name, raw in written.items():
        block = held.get_submodule(name).block_weight
        qtype = next(q for suffix, q in formats.items() if name.endswith(suffix))
        assert block.qtype == Q6_K and torch.equal(block.dequantize(), gguf_values(qtype, raw, block.cols)), name
    tokens = [5, 17, 101, 3, 250, 42, 7, 9, 33, 64, 128, 11]
    logits = {}
    for path in ("gguf", "gguf-q8", "fp32"):
        loaded = load_model(str(file), "cpu", dtype=path)
        assert loaded.choice.path == path
        if path != "fp32":
            assert "F32" not in loaded.choice.kernel.split("-")[-1].split("+"), loaded.choice.kernel
        logits[path] = loaded.runner.forward([Step(loaded.runner.new_cache(), tokens, logits=len(tokens))])[0]
    assert "do not read" not in caplog.text
    torch.testing.assert_close(logits["gguf"], logits["fp32"], rtol=1e-4, atol=1e-4)
    assert bool((F.cosine_similarity(logits["gguf-q8"], logits["gguf"], dim=-1) > 0.995).all())


def test_an_iq3_xxs_tensor_that_cannot_be_rewritten_is_held_as_float32_and_said(tmp_path, caplog):
    model, written = iq3_model({"layers.0.self_attn.q_proj": iq3.IQ3_XXS})
    (name, raw), = written.items()
    raw[0, :2] = np.array([0x0001], dtype=np.uint16).view(np.uint8)  # 2⁻²⁴, the smallest float16
    write_gguf(model, tmp_path / "iq3_xxs.gguf")
    with caplog.at_level("WARNING", logger="specdec.engine.gguf_model"):
        block = load_gguf_model(tmp_path / "iq3_xxs.gguf", model.config).get_submodule(name).block_weight
    assert "IQ3_XXS ×1, held as float32" in caplog.text, caplog.text
    assert block.qtype == F32 and torch.equal(block.dequantize(), gguf_values(iq3.IQ3_XXS, raw, block.cols))
