"""The module tree of a GGUF model on the block paths (`specdec.engine.decoder_tree`): transformers' parameters and
buffers for each architecture the GGUF reader takes, its norms and rotary embeddings computing transformers' bits,
a packed file's logits those of transformers' modules carrying the same blocks, and a service that loads such a file
without importing transformers' model code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_gguf_path import write_gguf
from transformers import AutoConfig, AutoModelForCausalLM

from specdec.engine import decoder_tree
from specdec.engine.compute import build_runner
from specdec.engine.gguf_model import pack_tiny
from specdec.engine.models import imports_model_code, load_model
from specdec.engine.runner import Step

ROOT = Path(__file__).resolve().parent.parent
SHAPE = dict(vocab_size=260, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=False)
CONFIGS = {"qwen2": {}, "qwen3": {"head_dim": 128}, "qwen3-biased": {"head_dim": 128, "attention_bias": True},
           "llama": {}, "llama-biased": {"attention_bias": True, "mlp_bias": True}}
ROPES = {"default": None, "linear": {"rope_type": "linear", "factor": 4.0},
         "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
         "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64}}
TOKENS = [5, 17, 101, 3, 250, 42, 7, 9, 120, 33, 64, 2, 199, 18]


def config_of(name: str, rope: dict | None = None):
    arch = name.split("-")[0]
    extra = {} if rope is None else {"rope_parameters": {**rope, "rope_theta": 10000.0}}
    return AutoConfig.for_model(arch, **SHAPE, **CONFIGS[name], **extra)


def transformers_model(config):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


@pytest.mark.parametrize("name", CONFIGS)
def test_the_tree_has_transformers_parameters_and_buffers(name):
    config = config_of(name)
    with torch.device("meta"):
        ours = decoder_tree.CausalLM(config)
    theirs = transformers_model(config)
    shapes = [{n: tuple(p.shape) for n, p in m.named_parameters()} for m in (ours, theirs)]
    assert shapes[0] == shapes[1]
    assert decoder_tree.supports(config)
    rotary = decoder_tree.RotaryEmbedding(config)
    assert torch.equal(rotary.inv_freq, theirs.model.rotary_emb.inv_freq)


def test_a_config_the_tree_does_not_stand_for_is_left_to_transformers():
    assert not decoder_tree.supports(AutoConfig.for_model("stablelm", **SHAPE))
    assert not decoder_tree.supports(AutoConfig.for_model("llama", **SHAPE, hidden_act="gelu"))


@pytest.mark.parametrize("rope", ROPES)
def test_rotary_norms_and_rotation_compute_transformers_bits(rope):
    config = config_of("llama", ROPES[rope])
    theirs = transformers_model(config)
    module = sys.modules[type(theirs).__module__]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, 9, 256, generator=gen)
    positions = torch.tensor([[0, 1, 2, 7, 63, 64, 200, 511, 300]])
    cos, sin = decoder_tree.RotaryEmbedding(config)(x, positions)
    their_cos, their_sin = theirs.model.rotary_emb(x, positions)
    assert torch.equal(cos, their_cos) and torch.equal(sin, their_sin)
    q, k = torch.randn(1, 2, 9, 128, generator=gen), torch.randn(1, 1, 9, 128, generator=gen)
    assert all(map(torch.equal, decoder_tree.apply_rotary_pos_emb(q, k, cos, sin),
                   module.apply_rotary_pos_emb(q, k, cos, sin)))
    norm = decoder_tree.RMSNorm(256, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(256, generator=gen))
        theirs.model.norm.weight.copy_(norm.weight)
    theirs.model.norm.variance_epsilon = 1e-5
    assert torch.equal(norm(x), theirs.model.norm(x))


@pytest.mark.parametrize("name", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("path", ["gguf", "gguf-q8"])
def test_a_packed_file_computes_what_transformers_modules_do_with_its_blocks(tmp_path, name, path):
    """A GGUF of each architecture, loaded from the file (its config from its header) onto our tree, gives the logits
    of transformers' own model carrying the same blocks on the same path, bit for bit."""
    model = pack_tiny(transformers_model(config_of(name)))
    file = tmp_path / f"{name}.gguf"
    write_gguf(model, file, arch=name)
    loaded = load_model(str(file), "cpu", dtype=path)
    assert loaded.runner.apply_rotary is decoder_tree.apply_rotary_pos_emb
    theirs, _ = build_runner(model, path)
    logits = [r.forward([Step(r.new_cache(), TOKENS, logits=len(TOKENS))])[0] for r in (loaded.runner, theirs)]
    assert torch.equal(logits[0], logits[1])


LOAD = """
import sys
from specdec.engine.target_engine import TargetEngine
from specdec.runtime.model_service import load_and_profile, load_engine
from specdec.runtime.model_service_config import ModelServiceConfig
config = ModelServiceConfig(model=sys.argv[1], profile_cache="off")
engine = load_and_profile(config, lambda: load_engine(config, TargetEngine))
heavy = ("transformers.modeling_utils", "transformers.models.qwen2.modeling_qwen2", "torch._dynamo")
model_code = [m for m in heavy if m in sys.modules]
print("path", engine.loaded.choice.path, "model code", model_code)
"""


def test_a_service_loads_a_packed_gguf_without_transformers_model_code(tmp_path):
    """What a service does at start-up (`load_and_profile`) on a GGUF file: the gguf-q8 path, and none of
    transformers' model code imported (1.5 s of CPU and 166 MB a service with the packaged target)."""
    file = tmp_path / "qwen2.gguf"
    write_gguf(pack_tiny(transformers_model(config_of("qwen2"))), file)
    run = subprocess.run([sys.executable, "-c", LOAD, str(file)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "path gguf-q8 model code []"
    assert not imports_model_code("packaged:target") and not imports_model_code(str(file))
    assert imports_model_code(str(file), dtype="float32") and imports_model_code(str(file), sharded=True)
    assert imports_model_code("tiny:seed=0") and imports_model_code("synthetic:target")
    assert imports_model_code(str(tmp_path / "missing.gguf"))


LOOKUP = """
import sys
from specdec.engine.lookup_engine import LookupEngine
from specdec.runtime.model_service import load_and_profile
from specdec.runtime.model_service_config import ModelServiceConfig
config = ModelServiceConfig(model="lookup", profile_cache="off")
load_and_profile(config, lambda: LookupEngine(config.max_sessions, config.gamma_max, config.lookup_memory_tokens))
print("transformers" in sys.modules)
"""


def test_a_lookup_service_imports_none_of_transformers():
    """A draft service without a model (`--model lookup`) starts without transformers' code (before, its model
    code: 3.5 s of CPU to serving against 1.3, 418 MB resident against 232)."""
    run = subprocess.run([sys.executable, "-c", LOOKUP], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "False"
