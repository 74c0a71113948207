"""Tensor parallelism for the target: shard a loaded decoder in place (gpt-fast style).

Per decoder layer, on each of N ranks:
- q/k/v projections and the MLP's gate/up keep 1/N of their output features (whole heads,
  whole MLP columns): column parallel, no communication;
- the attention output and MLP down projections keep the matching 1/N of their input features
  and all-reduce their output: row parallel, one all-reduce per block (two per layer).
- the LM head keeps 1/N of the vocabulary and all-gathers the logits (when the vocabulary divides
  evenly), so every rank ends with the same full logits; only rank 0 samples from them.
Embeddings and norms stay replicated. Works on any Llama/Qwen2-style model, including the tiny ones
built in code, because it acts on the loaded modules rather than on a checkpoint.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def check_shardable(config, world: int) -> None:
    """Raise ValueError unless heads, KV heads and the MLP width divide evenly over `world` ranks."""
    sizes = {"num_attention_heads": config.num_attention_heads,
             "num_key_value_heads": config.num_key_value_heads,
             "intermediate_size": config.intermediate_size}
    uneven = {name: n for name, n in sizes.items() if n % world}
    if uneven:
        raise ValueError(f"cannot split the model over {world} tensor-parallel ranks: {uneven} "
                         f"not divisible by {world}")


def _split_outputs(linear: nn.Linear, rank: int, world: int) -> None:
    """Column parallel: keep this rank's slice of the output features (and bias)."""
    n = linear.out_features // world
    linear.weight = nn.Parameter(linear.weight.data[rank * n:(rank + 1) * n].clone(), requires_grad=False)
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.data[rank * n:(rank + 1) * n].clone(), requires_grad=False)
    linear.out_features = n


def _split_inputs(linear: nn.Linear, rank: int, world: int, group) -> None:
    """Row parallel: keep this rank's slice of the input features; all-reduce the partial outputs."""
    n = linear.in_features // world
    linear.weight = nn.Parameter(linear.weight.data[:, rank * n:(rank + 1) * n].clone(), requires_grad=False)
    if linear.bias is not None and rank != 0:  # the bias is added once, by rank 0, before the sum
        linear.bias = None
    linear.in_features = n

    def all_reduce(_module, _inputs, output: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(output, group=group)
        return output

    linear.register_forward_hook(all_reduce)


def _split_vocabulary(head: nn.Linear, rank: int, world: int, group) -> None:
    """Vocabulary parallel: keep 1/N of the output rows; all-gather the logits back to [.., V]."""
    _split_outputs(head, rank, world)

    def all_gather(_module, _inputs, output: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(output) for _ in range(world)]
        dist.all_gather(parts, output.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    head.register_forward_hook(all_gather)


def shard_model(model: nn.Module, rank: int, world: int, group=None) -> None:
    """Shard every decoder layer and the LM head of `model` for `rank` of `world`; frees the rest.

    A tied LM head gets its own slice; the embedding it shared stays whole.
    """
    check_shardable(model.config, world)
    with torch.no_grad():
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            for linear in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
                _split_outputs(linear, rank, world)
            for linear in (attn.o_proj, mlp.down_proj):
                _split_inputs(linear, rank, world, group)
        head = model.get_output_embeddings()
        if head.out_features % world == 0:
            _split_vocabulary(head, rank, world, group)


def parameter_bytes(model: nn.Module) -> int:
    """Bytes held by the parameters of `model` (a tied embedding counted once)."""
    seen = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    return sum(seen.values())
