"""Llama GGUFs (Llama 2 and 3, Mistral 7B, SmolLM, TinyLlama: what llama.cpp's converter writes as "llama") on the
block paths: the converter's reordering of query and key rows undone at load, bit for bit; Llama 3.1's rotary
frequency factors (rope_freqs) applied as llama.cpp applies them; a layer tensor the model has no place for refused;
the tokenizer read without gguf-py's reader; greedy speculation through the services identical to target-only."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers.modeling_gguf_pytorch_utils as hf_gguf
from conftest import assert_speculated, tiny_options
from test_gguf_config import write_tokenizer_gguf
from test_gguf_path import write_gguf
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from specdec.cli.client import generate, make_request
from specdec.engine.gguf_model import UnreadGguf, gguf_config, load_gguf_model
from specdec.engine.models import build_tiny_model, load_model
from specdec.engine.runner import Step
from specdec.launch.stack import EmbeddedStack

LLAMA = "tiny:arch=llama,seed=0,hidden=256,gguf=1"  # 4 query heads over 2 key heads of 64: Q4_K and Q6_K blocks
LLAMA_DRAFT = LLAMA + ",perturb=0.05"
TOKENS = [5, 17, 101, 3, 250, 42, 7, 9, 120, 33, 64, 2, 199, 18, 77, 150, 91, 4, 230, 61]
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # every regime at head_dim 64


def converter_rope_factors(rope: dict, head_dim: int) -> np.ndarray:
    """rope_freqs as llama.cpp's converter computes it from a Llama 3 rope config."""
    freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    old, factor = rope["original_max_position_embeddings"], rope["factor"]
    low, high = old / rope["low_freq_factor"], old / rope["high_freq_factor"]
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high:
            factors.append(1.0)
        elif wavelen > low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - rope["low_freq_factor"]) / (rope["high_freq_factor"] - rope["low_freq_factor"])
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def logits_of(model) -> torch.Tensor:
    return model.runner.forward([Step(model.runner.new_cache(), TOKENS, logits=len(TOKENS))])[0]


def test_the_converters_row_order_is_undone_bit_for_bit(tmp_path):
    """A llama GGUF, its query and key rows reordered as the converter writes them, loads with every linear's blocks
    the bytes of the model it was written from, and on the float32 path to the values transformers' own GGUF loader
    gives (its own reverse permutation); without the undoing the blocks would differ."""
    source = build_tiny_model(LLAMA)
    file = tmp_path / "llama.gguf"
    write_gguf(source, file, arch="llama")
    ours = load_gguf_model(file, source.config, packed=True)
    written = {name: m.block_weight for name, m in source.named_modules() if hasattr(m, "block_weight")}
    loaded = {name: m.block_weight for name, m in ours.named_modules() if hasattr(m, "block_weight")}
    assert set(loaded) == set(written) and len(written) == 7 * source.config.num_hidden_layers + 2
    for name, block in written.items():
        assert loaded[name].qtype == block.qtype and torch.equal(loaded[name].data, block.data), name
    layer = ours.model.layers[0].self_attn
    assert layer.q_proj.block_weight.rows == 256 and layer.k_proj.block_weight.rows == 128  # 4 and 2 heads of 64
    floats = load_gguf_model(file, source.config, packed=False)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=file.name, dtype=torch.float32)
    for (name, mine), (_, hf) in zip(sorted(floats.state_dict().items()), sorted(theirs.state_dict().items()),
                                     strict=True):
        assert torch.equal(mine, hf), name


@pytest.mark.parametrize("dtype", ["gguf-q8", "gguf"])
def test_a_bare_llama_gguf_computes_its_models_logits(tmp_path, dtype, monkeypatch):
    """`load_model` on a bare llama .gguf (its config from the header) gives the logits of the model it was written
    from, bit for bit, on both block paths, without transformers' GGUF reader or its model code (our module tree:
    the llama layout, no query-key-value biases, which the file has none of)."""
    file = tmp_path / "llama.gguf"
    write_gguf(build_tiny_model(LLAMA), file, arch="llama")
    monkeypatch.setattr(hf_gguf, "load_gguf_checkpoint", lambda *a, **k: pytest.fail("gguf-py's reader was used"))
    from_file, in_code = (load_model(spec, "cpu", dtype=dtype) for spec in (str(file), LLAMA))
    assert from_file.choice.path == dtype and from_file.runner.apply_rotary.__module__ == "specdec.engine.decoder_tree"
    assert torch.equal(logits_of(from_file), logits_of(in_code))


def test_rope_freqs_divide_the_rotary_frequencies_as_llama_cpps_do(tmp_path):
    """A bare Llama 3.1-style GGUF (rope_freqs, no scaling in its header) computes the model with transformers'
    Llama 3 rotary scaling: its frequencies are the default ones divided by the file's factors (transformers' Llama 3
    ones within float rounding), its logits those of the float model with that scaling, and not the unscaled
    model's. A config.json that names the scaling itself is not scaled twice."""
    source = build_tiny_model(LLAMA)
    config = LlamaConfig(**{**source.config.to_dict(), "rope_parameters": LLAMA3_ROPE})
    factors = converter_rope_factors(LLAMA3_ROPE, config.head_dim)
    assert (factors == 1).any() and (factors == 8).any() and ((factors > 1) & (factors < 8)).any()
    file = tmp_path / "llama3.gguf"
    write_gguf(source, file, arch="llama", extra={"rope_freqs.weight": factors})

    bare = load_gguf_model(file, gguf_config(file), packed=False)
    default = 1.0 / (10000.0 ** (torch.arange(0, 64, 2, dtype=torch.int64).float() / 64))
    assert torch.equal(bare.model.rotary_emb.inv_freq, default / torch.from_numpy(factors))
    scaled = LlamaForCausalLM(config).eval()
    scaled.load_state_dict(source.state_dict())  # the dequantized weights the file holds
    torch.testing.assert_close(bare.model.rotary_emb.inv_freq, scaled.model.rotary_emb.inv_freq, rtol=1e-6, atol=0)
    tokens = torch.tensor([TOKENS])
    with torch.no_grad():
        ours, theirs, unscaled = (m(tokens).logits[0] for m in (bare, scaled, source))
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    assert (ours - unscaled).abs().max() > 1e-2  # the factors matter at these positions

    with_config = load_gguf_model(file, config, packed=False)
    torch.testing.assert_close(with_config.model.rotary_emb.inv_freq, scaled.model.rotary_emb.inv_freq,
                               rtol=0, atol=0)


def test_rope_freqs_of_another_length_are_refused_on_every_path(tmp_path):
    """Factors that do not match the rotary frequencies are refused, not handed to transformers' loader, which
    ignores rope_freqs and would compute the unscaled model."""
    source = build_tiny_model(LLAMA)
    file = tmp_path / "odd.gguf"
    write_gguf(source, file, arch="llama", extra={"rope_freqs.weight": np.full(7, 2.0, dtype=np.float32)})
    for dtype in ("gguf-q8", "float32"):
        with pytest.raises(UnreadGguf, match=r"rope_freqs\.weight: \(7,\) factors for 32 rotary frequencies"):
            load_model(str(file), "cpu", dtype=dtype)


def test_a_layer_tensor_the_config_has_no_place_for_is_refused(tmp_path):
    """A llama GGUF whose layers carry query, key and value biases that the model built from its header lacks is
    refused with their names on every path, not loaded without them."""
    qwen = build_tiny_model("tiny:seed=0,hidden=256,gguf=1")  # Qwen2: biases on q, k and v
    file = tmp_path / "biased.gguf"
    write_gguf(qwen, file, arch="llama")
    for dtype in ("gguf-q8", "float32"):  # not handed to transformers' loader either, which would drop them
        with pytest.raises(UnreadGguf, match=r"no place for: blk\.0\.attn_k\.bias, blk\.0\.attn_q\.bias"):
            load_model(str(file), "cpu", dtype=dtype)


def test_greedy_speculation_on_llama_models_equals_target_only():
    """A llama draft and target (GGUF blocks, the default gguf-q8 path) through the real services: greedy output
    at every γ and adaptive is target-only's."""
    with EmbeddedStack(tiny_options(LLAMA_DRAFT, LLAMA)) as running:
        for prompt in ("def fibonacci(n):", "The quick brown fox"):
            baseline = generate(running.endpoint, make_request(prompt=prompt, max_new_tokens=32, gamma=0)).token_ids
            for gamma in (1, 4, None):
                result = generate(running.endpoint, make_request(prompt=prompt, max_new_tokens=32, gamma=gamma))
                assert result.token_ids == baseline, f"γ={gamma} diverged from target-only on {prompt!r}"
                if gamma is not None:
                    assert_speculated(result, f"at γ={gamma} on {prompt!r}")


def test_a_completions_prompt_gets_the_tokenizers_bos(tmp_path):
    """A prompt string is encoded with the tokens its tokenizer adds (a Llama's BOS, as llama.cpp and vLLM give a
    completion's prompt; nothing for a Qwen): the stack's prompt starts with BOS."""
    file = tmp_path / "llama.gguf"
    write_tokenizer_gguf(file, "llama")
    bos = build_tiny_model(LLAMA).config.vocab_size - 2
    with EmbeddedStack(tiny_options(str(file), str(file))) as running:
        result = generate(running.endpoint, make_request(prompt="abc ab", max_new_tokens=4, prompt_top=1))
    assert result.prompt_token_ids == [bos, 28, 26, 27]  # BOS, abc, Ġ, ab


def test_a_sentencepiece_llama_files_tokenizer_loads(tmp_path):
    """A Llama 2 / Mistral 7B / TinyLlama-style file (tokenizer model "llama": SentencePiece pieces with scores and
    byte fallback) gets transformers' tokenizer for it, BOS first, and decodes back to the text."""
    from specdec.weights.sources import load_tokenizer

    def vocabulary(writer, size):
        tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "a", "b", "c", "▁a", "ab",
                                                                                  "▁ab", "▁c"]
        tokens += [f"▁x{i}" for i in range(size - len(tokens))]
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(size - 259)])
        writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * (size - 259))
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_unk_token_id(0)
        writer.add_add_bos_token(True)

    file = tmp_path / "sentencepiece.gguf"
    write_gguf(build_tiny_model(LLAMA + ",vocab=300"), file, arch="llama", vocabulary=vocabulary)
    tokenizer = load_tokenizer(str(file))
    ids = tokenizer.encode("ab c")
    assert tokenizer.convert_ids_to_tokens(ids) == ["<s>", "▁ab", "▁c"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "ab c"
