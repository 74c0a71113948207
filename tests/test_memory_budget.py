"""A load that cannot fit is refused before it starts, saying what it needs and why (specdec/engine/memory_budget.py),
where it would have ended in the OOM killer."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file
from test_gguf_path import write_ternary_gguf

from specdec.engine import memory_budget
from specdec.engine.gguf_model import held_bytes
from specdec.engine.kvcache import HEADROOM_BYTES
from specdec.engine.memory_budget import NotEnoughMemory, available_bytes, safetensors_elements
from specdec.engine.models import build_tiny_model, load_model
from specdec.weights.gguf_file import read_gguf


def test_available_memory_is_what_meminfo_says_can_still_be_had(tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:          100000 kB\nMemAvailable:   20000000 kB\n"
                       "SwapTotal:       2000000 kB\nSwapFree:        1500000 kB\n")
    monkeypatch.setattr(memory_budget, "MEMINFO", meminfo)
    assert available_bytes() == (20000000 + 1500000) * 1024
    monkeypatch.setattr(memory_budget, "MEMINFO", tmp_path / "absent")
    assert available_bytes() is None  # no check where the OS does not say


@pytest.fixture
def ternary_file(tmp_path):
    """The tiny GGUF with one linear in TQ2_0, which the gguf kernels hold as float32."""
    write_ternary_gguf(tmp_path / "tq2_0.gguf")
    return tmp_path / "tq2_0.gguf"


@pytest.mark.parametrize("dtype, packed", [("gguf-q8", True), ("gguf", True), ("fp32", False)])
def test_a_load_that_does_not_fit_is_refused_with_what_it_needs(ternary_file, monkeypatch, dtype, packed):
    need, as_float = held_bytes(read_gguf(ternary_file).tensors, packed)
    assert dict(as_float) == ({"TQ2_0": 1} if packed else {})
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: need - 1)
    with pytest.raises(NotEnoughMemory) as refused:
        load_model(str(ternary_file), "cpu", dtype=dtype)
    words = str(refused.value)
    assert words.startswith(f"tq2_0.gguf in {'its blocks' if packed else 'float32'} needs about "), words
    assert ("(TQ2_0 ×1 held as float32: formats no gguf kernel reads)" in words) == packed, words
    assert "GiB available" in words
    # with room for the load's own timed passes besides (their KV caches grow only into memory left: kvcache.py)
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: need + HEADROOM_BYTES + 2**20)
    assert load_model(str(ternary_file), "cpu", dtype=dtype).choice.path == dtype


@pytest.mark.parametrize("dtype, bytes_each", [("fp32", 4), ("bf16", 2)])
def test_a_safetensors_folder_that_does_not_fit_is_refused_too(tmp_path, monkeypatch, dtype, bytes_each):
    model = build_tiny_model("tiny:seed=0")
    model.save_pretrained(tmp_path / "tiny")
    saved = [load_file(f) for f in (tmp_path / "tiny").glob("*.safetensors")]
    assert safetensors_elements(tmp_path / "tiny") == sum(t.numel() for part in saved for t in part.values()) > 0
    need = safetensors_elements(tmp_path / "tiny") * bytes_each
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: need - 1)
    with pytest.raises(NotEnoughMemory, match=f"tiny in {'float32' if dtype == 'fp32' else 'bfloat16'} needs about"):
        load_model(str(tmp_path / "tiny"), "cpu", dtype=dtype)
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: need)
    assert load_model(str(tmp_path / "tiny"), "cpu", dtype=dtype).choice.path == dtype
