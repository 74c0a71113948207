"""The module tree a GGUF model's blocks hang on, without transformers' model code.

The gguf paths need a Llama-family decoder's names and shapes (`model.layers.N.self_attn.q_proj`, ...) to attach
each tensor of the file to, its norms' weights and epsilons, its rotary frequencies and its `apply_rotary_pos_emb`:
nothing of transformers' `PreTrainedModel`. Importing that (`transformers.modeling_utils` and a model's module)
cost a service 1.5 s of CPU and 166 MB of memory at start-up on a Zen 4, beside the model it then loads. Here the
same tree is built from the config for the architectures the GGUF reader takes (Qwen2, Qwen3, Llama). Every
module computes as transformers' does, op for op (the runner's torch steps use these where its C steps do not
run), and its parameters are the ones transformers' model would have: a tensor of the file that nothing takes, or
a parameter no tensor fills, is refused as before (`specdec.engine.gguf_model.load_gguf_model`).
"""

from __future__ import annotations

import torch
from torch import nn

# model_type -> (q, k, v bias; o bias; MLP bias; per-head q and k norms), as transformers builds each. None: the
# config's attention_bias (mlp_bias).
LAYOUTS = {"qwen2": (True, False, False, False), "qwen3": (None, None, False, True), "llama": (None, None, None, False)}


def supports(config) -> bool:
    """Whether this tree stands for transformers' model of `config`."""
    return getattr(config, "model_type", None) in LAYOUTS and getattr(config, "hidden_act", "silu") == "silu"


class Linear(nn.Linear):
    """A linear layer whose weights come from the file: never initialised (on the meta device, an initialiser
    imports torch's compiler, 1.5 s of CPU)."""

    def reset_parameters(self) -> None:
        pass


class Embedding(nn.Embedding):
    """An embedding whose weights come from the file: never initialised."""

    def reset_parameters(self) -> None:
        pass


class RMSNorm(nn.Module):
    """w · x / rms(x), in float32 and back, as transformers' Llama-family norms."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def default_rope_parameters(config) -> tuple[torch.Tensor, float]:
    """The original rotary frequencies: 1 / θ^(2i / head_dim), and no scaling of cos and sin."""
    base = config.rope_parameters["rope_theta"]
    dim = head_dim(config)
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0


class RotaryEmbedding(nn.Module):
    """cos and sin [batch, positions, head_dim] for position ids [batch, positions]; frequencies by the config's
    rope type (transformers' own functions for the scaled ones)."""

    def __init__(self, config):
        super().__init__()
        rope_type = config.rope_parameters["rope_type"]
        if rope_type == "default":
            inv_freq, self.attention_scaling = default_rope_parameters(config)
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            inv_freq, self.attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](config)
        self.inv_freq = nn.Buffer(inv_freq, persistent=False)
        self.original_inv_freq = nn.Buffer(inv_freq.clone(), persistent=False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim: int = 1):
    """q and k [batch, heads, positions, head_dim] rotated by cos and sin [batch, positions, head_dim]."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _bias(fixed: bool | None, config, name: str) -> bool:
    return bool(getattr(config, name, False)) if fixed is None else fixed


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        qkv_bias, o_bias, _, head_norms = LAYOUTS[config.model_type]
        hidden, heads, kv_heads, dim = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                                        head_dim(config))
        self.scaling = dim ** -0.5  # what the runner reads, as of transformers' attention
        qkv_bias, o_bias = _bias(qkv_bias, config, "attention_bias"), _bias(o_bias, config, "attention_bias")
        self.q_proj = Linear(hidden, heads * dim, bias=qkv_bias)
        self.k_proj = Linear(hidden, kv_heads * dim, bias=qkv_bias)
        self.v_proj = Linear(hidden, kv_heads * dim, bias=qkv_bias)
        self.o_proj = Linear(heads * dim, hidden, bias=o_bias)
        if head_norms:
            self.q_norm = RMSNorm(dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(dim, config.rms_norm_eps)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        bias = _bias(LAYOUTS[config.model_type][2], config, "mlp_bias")
        self.gate_proj = Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=bias)
        self.act_fn = nn.SiLU()


class DecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self_attn, self.mlp = Attention(config), MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Decoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        with torch.device("cpu"):  # its frequencies computed, not on the meta device (which imports torch's compiler)
            self.rotary_emb = RotaryEmbedding(config)


class CausalLM(nn.Module):
    """The decoder and its output layer (`lm_head`), under transformers' names; built on the meta device, its
    weights then attached from the file."""

    generation_config = None  # the EOS ids are the config's

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = Decoder(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head
