"""A synthetic draft/target pair: random weights in any Qwen2 shape, with the draft's greedy agreement
with the target set by one number. For benchmarking hardware that can download nothing.

Spec: "synthetic:<draft|target>[,key=value...]". Keys: shape ("qwen2.5-coder": the packaged
0.5B/1.5B pair's shapes; "small": a few-MB pair for tests), eps (how far the layers move each
model off the shared core; smaller agrees more), seed.

Construction: both models share a bigram core, the draft's embedding and LM head, zero-padded to
the target's width in the target, whose final norm weight is sqrt(d_draft / d_target) so that the
padded core gives the same logits. Every layer's output projections (o_proj, down_proj) are scaled
by eps, so each model is the core plus its own small perturbation, and the two argmaxes agree
unless the perturbations reorder the top. Heads are untied (a tied head would make every token
its own likeliest successor). Measured greedy agreement is reported by `specdec bench`.
"""

from __future__ import annotations

import math

import torch

PREFIX = "synthetic:"
# The packaged pair's shapes (Qwen2.5-Coder 0.5B and 1.5B instruct), and a small pair for tests.
SHAPES = {
    "qwen2.5-coder": {
        "draft": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2),
        "target": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                       num_key_value_heads=2),
        "common": dict(vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6),
    },
    "small": {
        "draft": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2),
        "target": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=8,
                       num_key_value_heads=2),
        "common": dict(vocab_size=512, max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-6),
    },
}
DEFAULTS = {"shape": "qwen2.5-coder", "eps": 0.0005, "seed": 0}


def is_synthetic(spec: str) -> bool:
    return spec.startswith(PREFIX)


def parse(spec: str) -> tuple[str, dict]:
    role, *items = spec.removeprefix(PREFIX).split(",")
    if role not in ("draft", "target"):
        raise ValueError(f"{spec!r}: a synthetic model is synthetic:draft or synthetic:target")
    options = dict(DEFAULTS)
    for item in filter(None, items):
        key, _, value = item.partition("=")
        if key not in options:
            raise ValueError(f"unknown synthetic-model option {key!r}; known: {sorted(options)}")
        options[key] = type(DEFAULTS[key])(value)
    if options["shape"] not in SHAPES:
        raise ValueError(f"unknown synthetic shape {options['shape']!r}; known: {sorted(SHAPES)}")
    return role, options


def config_of(shape: str, role: str):
    from transformers import Qwen2Config

    return Qwen2Config(**SHAPES[shape][role], **SHAPES[shape]["common"], tie_word_embeddings=False,
                       initializer_range=0.02, eos_token_id=None, bos_token_id=None, pad_token_id=None)


def _random_model(config, seed: int, device: torch.device, dtype: torch.dtype):
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    return model.to(dtype).eval()


@torch.no_grad()
def build_synthetic_model(spec: str, device: torch.device, dtype: torch.dtype = torch.float32):
    """The model `spec` names, built on `device` in `dtype`; the same spec gives the same weights on
    one device (seeded), and the draft and target of one seed share their core."""
    role, o = parse(spec)
    draft_config = config_of(o["shape"], "draft")
    core = _random_model(draft_config, o["seed"], device, dtype)
    model = core if role == "draft" else _random_model(config_of(o["shape"], "target"), o["seed"] + 1, device, dtype)
    if role == "target":
        width = draft_config.hidden_size
        model.model.embed_tokens.weight.zero_()[:, :width] = core.model.embed_tokens.weight
        model.lm_head.weight.zero_()[:, :width] = core.lm_head.weight
        model.model.norm.weight.fill_(math.sqrt(width / model.config.hidden_size))
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.mul_(o["eps"])
        layer.mlp.down_proj.weight.mul_(o["eps"])
    return model
