"""IQ3_S tensors read as Q6_K blocks of the same values (specdec/engine/cpu/iq3_s.py): bit for bit against gguf-py's
dequantizer, and through a GGUF file on both block paths."""

from __future__ import annotations

from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_gguf_path import TINY_GGUF, gguf_dequantize, write_gguf

from specdec.engine.cpu import iq3_s
from specdec.engine.cpu.blockquant import F32, Q6_K, BlockTensor
from specdec.engine.gguf_model import load_gguf_model
from specdec.engine.models import build_tiny_model, load_model
from specdec.engine.runner import Step

IQ3_XXS = int(gguf.GGMLQuantizationType.IQ3_XXS)


def random_iq3_s(rows: int, cols: int, seed: int = 0, scale: float = 0.02) -> np.ndarray:
    """Random bytes in IQ3_S's layout (every grid row, sign pattern and block scale), with float16 d of both signs
    from scale/1000 to scale (float16 subnormals among them for the tiny model's scales)."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, cols // 256, iq3_s.BYTES), dtype=np.uint8)
    d = scale * 10.0 ** -rng.uniform(0, 3, (rows, cols // 256, 1)) * rng.choice([-1, 1], (rows, cols // 256, 1))
    raw[..., :2] = d.astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("in_c", [True, False], ids=["C", "numpy"])
@pytest.mark.parametrize("scale", [0.02, 2e-5], ids=["normal", "subnormal"])
def test_iq3_s_blocks_become_q6_k_blocks_of_the_same_values(scale, in_c):
    raw = random_iq3_s(40, 1024, scale=scale)
    rewritten = iq3_s.as_q6_k(raw, in_c=in_c)
    assert rewritten.shape == (40, 4 * 210)
    expected = gguf_dequantize(iq3_s.IQ3_S, raw, 1024)
    assert torch.equal(BlockTensor.from_numpy(Q6_K, rewritten, 1024).dequantize(), expected)  # the exact kernel
    assert torch.equal(gguf_dequantize(Q6_K, rewritten, 1024), expected)  # and gguf-py's reading of the Q6_K bytes


def test_the_rewrite_in_c_and_in_numpy_steps_give_the_same_bytes(monkeypatch):
    """The C kernel's blocks are numpy's, and a tensor longer than one numpy step gives the blocks it gives in one."""
    raw = random_iq3_s(9, 768, seed=3)
    whole = iq3_s.as_q6_k(raw, in_c=False)
    assert np.array_equal(iq3_s.as_q6_k(raw), whole)
    monkeypatch.setattr(iq3_s, "SUPERBLOCKS_AT_ONCE", 5)
    assert np.array_equal(iq3_s.as_q6_k(raw, in_c=False), whole)


def with_blocks(model, formats: dict[str, tuple[int, object]]) -> dict[str, np.ndarray]:
    """Give each linear of `model` named by a key of `formats` (a suffix of its module name) blocks of that format
    from its maker (rows, cols, seed, scale), its largest values about its weights' largest; returns {module name:
    the blocks}."""
    written = {}
    for name, module in model.named_modules():
        qtype, make = next((spec for suffix, spec in formats.items() if name.endswith(suffix)), (None, None))
        if qtype is not None:
            rows, cols = module.weight.shape
            raw = make(rows, cols, len(written), float(module.weight.detach().abs().max()) / 465)  # 465 = 31 · 15
            module.block_weight = SimpleNamespace(data=torch.from_numpy(raw), qtype=qtype)
            written[name] = raw
    return written


def test_a_gguf_with_iq3_s_linears_runs_on_both_block_paths_as_q6_k(tmp_path, caplog):
    """A file whose linears but the output layer are IQ3_S (as an IQ3_M file's are) loads them as Q6_K blocks of
    gguf-py's values, nothing in float32, says so, and the exact path computes what the float32 path computes with
    the same file; the integer path tracks it."""
    model = build_tiny_model(TINY_GGUF)
    written = with_blocks(model, {suffix: (iq3_s.IQ3_S, random_iq3_s)
                                  for suffix in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj")})
    file = tmp_path / "iq3_s.gguf"
    write_gguf(model, file)
    with caplog.at_level("INFO", logger="specdec.engine.gguf_model"):
        held = load_gguf_model(file, model.config)
    assert f"IQ3_S ×{7 * model.config.num_hidden_layers} read as Q6_K blocks" in caplog.text, caplog.text
    for name, raw in written.items():
        block = held.get_submodule(name).block_weight
        assert block.qtype == Q6_K and torch.equal(block.dequantize(), gguf_dequantize(iq3_s.IQ3_S, raw, block.cols))
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


def test_iq3_xxs_stays_float32_and_is_said(tmp_path, caplog):
    """IQ3_XXS, which no Q6_K block holds exactly (its d/2 is often no float16), is held as float32 with gguf-py's
    values, and the load says so."""
    def random_iq3_xxs(rows, cols, seed, scale):
        raw = np.random.default_rng(seed).integers(0, 256, size=(rows, cols // 256, 98), dtype=np.uint8)
        raw[..., :2] = np.full((rows, cols // 256, 1), scale, dtype=np.float16).view(np.uint8)
        return raw.reshape(rows, -1)

    model = build_tiny_model(TINY_GGUF)
    (name, raw), = with_blocks(model, {"layers.0.self_attn.q_proj": (IQ3_XXS, random_iq3_xxs)}).items()
    write_gguf(model, tmp_path / "iq3_xxs.gguf")
    with caplog.at_level("WARNING", logger="specdec.engine.gguf_model"):
        block = load_gguf_model(tmp_path / "iq3_xxs.gguf", model.config).get_submodule(name).block_weight
    assert "IQ3_S (as Q6_K)" in caplog.text and "IQ3_XXS ×1, held as float32" in caplog.text, caplog.text
    assert block.qtype == F32 and torch.equal(block.dequantize(), gguf_dequantize(IQ3_XXS, raw, block.cols))
