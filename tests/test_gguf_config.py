"""A bare GGUF file's model config, read from its header by our reader: the config transformers builds from the same
file (through gguf-py's reader, seconds over a real vocabulary), and what `load_model` uses."""

from __future__ import annotations

import pytest
import torch
import transformers.modeling_gguf_pytorch_utils as hf_gguf
from test_gguf_path import TINY_GGUF, write_gguf
from transformers import AutoConfig

from specdec.engine.gguf_model import UnreadGguf, gguf_config, load_gguf_model
from specdec.engine.models import build_tiny_model, load_model
from specdec.engine.runner import Step
from specdec.weights.sources import _gguf_tokenizer_class


def write_full_gguf(path, arch: str, tied: bool) -> None:
    """A tiny model's GGUF with what a converted file's header carries beside its sizes: a name, a token list (no
    vocab_size key: the list's length is the vocabulary, as llama.cpp's files have it), special token ids; and
    without output.weight where the embedding is tied."""

    def header_extras(writer, size):
        writer.add_name("Tiny Test Model")
        writer.add_token_list([f"t{i}" for i in range(size)])
        writer.add_eos_token_id(size - 1)
        writer.add_bos_token_id(size - 2)
        writer.add_pad_token_id(size - 2)

    write_gguf(build_tiny_model(TINY_GGUF), path, arch=arch, vocabulary=header_extras,
               leave_out=("output.weight",) if tied else ())


@pytest.mark.parametrize("arch,tied", [("qwen2", False), ("qwen2", True), ("qwen3", False)])
def test_the_header_gives_transformers_config(tmp_path, arch, tied):
    file = tmp_path / "model.gguf"
    write_full_gguf(file, arch, tied)
    theirs = AutoConfig.from_pretrained(tmp_path, gguf_file=file.name, local_files_only=True)
    ours = gguf_config(file)
    assert type(ours) is type(theirs) and ours.to_dict() == theirs.to_dict()
    assert ours.tie_word_embeddings is tied and ours.vocab_size == build_tiny_model(TINY_GGUF).config.vocab_size
    assert ours.eos_token_id == ours.vocab_size - 1


def test_a_bare_gguf_loads_without_gguf_pys_reader(tmp_path, monkeypatch):
    """`load_model` on a .gguf file with no config.json beside it never reads the file through transformers' GGUF
    checkpoint reader, and builds the model the file holds; another architecture still goes to transformers."""
    file = tmp_path / "model.gguf"
    write_full_gguf(file, "qwen2", tied=False)
    monkeypatch.setattr(hf_gguf, "load_gguf_checkpoint", lambda *a, **k: pytest.fail("gguf-py's reader was used"))
    tokens = [5, 17, 101, 3, 250]
    logits = [m.runner.forward([Step(m.runner.new_cache(), tokens, logits=len(tokens))])[0]
              for m in (load_model(spec, "cpu", dtype="gguf-q8") for spec in (str(file), TINY_GGUF))]
    assert torch.equal(logits[0], logits[1])
    other = tmp_path / "other.gguf"
    write_gguf(build_tiny_model(TINY_GGUF), other, arch="gemma")
    assert gguf_config(other) is None
    other.write_bytes(b"GGUF" + (3 << 24).to_bytes(4, "little") + bytes(64))  # version 3, big-endian
    assert gguf_config(other) is None and _gguf_tokenizer_class(other) is None  # transformers' reader may take it


def write_tokenizer_gguf(path, arch: str = "qwen2") -> None:
    """A tiny model's GGUF with a byte-level BPE vocabulary in its header, as llama.cpp's converter writes a Qwen's
    (arch llama: a Llama 3's, with a BOS that every text starts with, the token before EOS)."""
    def vocabulary(writer, size):
        letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
        merged = ["ab", "abc", "Ġa", "Ġab"]
        tokens = letters + ["Ġ"] + merged + [f"<|pad{i}|>" for i in range(size - len(letters) - len(merged) - 3)]
        tokens += ["<|begin_of_text|>", "<|endoftext|>"]
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre({"qwen2": "qwen2", "llama": "llama-bpe"}[arch])
        writer.add_token_list(tokens)
        writer.add_token_types([1] * (size - 2) + [3, 3])
        writer.add_token_merges(["a b", "ab c", "Ġ a", "Ġa b"])
        writer.add_eos_token_id(size - 1)
        if arch == "llama":
            writer.add_bos_token_id(size - 2)
            writer.add_add_bos_token(True)

    model = build_tiny_model(TINY_GGUF.replace("tiny:", f"tiny:arch={arch},"))
    write_gguf(model, path, arch=arch, vocabulary=vocabulary)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_a_bare_ggufs_tokenizer_is_transformers_without_gguf_pys_reader(tmp_path, monkeypatch, arch):
    """The tokenizer of a .gguf file: transformers' own from its header, the same class, vocabulary and encodings as
    `AutoTokenizer` builds by itself, without reading the file through gguf-py's checkpoint reader."""
    from transformers import AutoTokenizer

    from specdec.weights.sources import load_tokenizer

    file = tmp_path / "model.gguf"
    write_tokenizer_gguf(file, arch)
    theirs = AutoTokenizer.from_pretrained(tmp_path, gguf_file=file.name, local_files_only=True)
    monkeypatch.setattr(hf_gguf, "load_gguf_checkpoint", lambda *a, **k: pytest.fail("gguf-py's reader was used"))
    ours = load_tokenizer(str(file))
    assert type(ours) is type(theirs) and ours.get_vocab() == theirs.get_vocab()
    for text in ("abc ab a", "zab c<|endoftext|>", ""):
        assert ours.encode(text) == theirs.encode(text), text
    assert ours.eos_token == theirs.eos_token == "<|endoftext|>"


def test_a_folder_with_a_gguf_and_no_tokenizer_files_reads_the_ggufs(tmp_path):
    """A folder holding a GGUF beside its config.json alone (no tokenizer files) gets the GGUF's tokenizer, as the
    file itself does; a folder with neither is refused clearly. Before, transformers gave it a tokenizer that
    encoded every prompt to nothing, and the server answered "prompt is empty"."""
    from specdec.weights.sources import load_tokenizer

    folder = tmp_path / "model"
    folder.mkdir()
    write_tokenizer_gguf(folder / "model.gguf")
    build_tiny_model(TINY_GGUF).config.save_pretrained(folder)
    from_folder, from_file = load_tokenizer(str(folder)), load_tokenizer(str(folder / "model.gguf"))
    assert from_folder.get_vocab() == from_file.get_vocab() and len(from_folder) > 30
    assert from_folder.encode("abc ab a") == from_file.encode("abc ab a") != []
    (folder / "model.gguf").unlink()
    with pytest.raises(ValueError, match="no tokenizer files"):
        load_tokenizer(str(folder))


SCALINGS = {"linear": {"rope_type": "linear", "factor": 4.0},
            "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
                     "beta_slow": 1.0}}


def write_scaled_gguf(path, kind: str, **extra) -> None:
    """The tiny GGUF model with `{arch}.rope.scaling.*` in its header as llama.cpp's converter writes them (factor 4,
    YaRN's original context 64), and any `extra` scaling keys."""
    import gguf

    def header_extras(writer, size):
        writer.add_vocab_size(size)
        writer.add_rope_scaling_type({"linear": gguf.RopeScalingType.LINEAR, "yarn": gguf.RopeScalingType.YARN,
                                      "longrope": gguf.RopeScalingType.LONGROPE}[kind])
        writer.add_rope_scaling_factor(4.0)
        if kind == "yarn":
            writer.add_rope_scaling_orig_ctx_len(64)
        for key, value in extra.items():
            writer.add_float32(f"qwen2.rope.scaling.{key}", value)

    write_gguf(build_tiny_model(TINY_GGUF), path, vocabulary=header_extras)


@pytest.mark.parametrize("kind", ["linear", "yarn"])
def test_the_headers_rotary_scaling_is_the_models(tmp_path, kind):
    """A bare file's rotary scaling (which transformers' config mapping leaves out) becomes the config's rope
    parameters, llama.cpp's YaRN defaults filled in: its logits are the float model's with that scaling, within
    1e-4, and not the unscaled one's. (Against llama-server on converted files: docs/PERFORMANCE.md, "Llama GGUFs".)"""
    file = tmp_path / "scaled.gguf"
    write_scaled_gguf(file, kind)
    config = gguf_config(file)
    assert config.rope_parameters == {**SCALINGS[kind], "rope_theta": 10000.0}
    source = build_tiny_model(TINY_GGUF)
    scaled = type(source)(type(source.config)(**{**source.config.to_dict(), "rope_parameters": config.rope_parameters}))
    scaled.load_state_dict(source.state_dict())  # the dequantized weights the file holds
    tokens = torch.tensor([[5, 17, 101, 3, 250, 42, 7, 9, 120, 33, 64, 2]])
    with torch.no_grad():
        ours, theirs, unscaled = (m.eval()(tokens).logits[0]
                                  for m in (load_gguf_model(file, config, packed=False), scaled, source))
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    assert (ours - unscaled).abs().max() > 1e-2


@pytest.mark.parametrize("kind,extra", [("longrope", {}), ("yarn", {"yarn_attn_factor": 1.0})])
def test_a_rotary_scaling_not_read_is_refused_not_ignored(tmp_path, kind, extra):
    file = tmp_path / "scaled.gguf"
    write_scaled_gguf(file, kind, **extra)
    with pytest.raises(UnreadGguf, match=f"rotary scaling '{kind}'"):
        gguf_config(file)
    with pytest.raises(UnreadGguf):
        load_model(str(file), "cpu")
