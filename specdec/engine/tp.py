"""Tensor parallelism for the target: shard a loaded decoder in place (gpt-fast style).

Per decoder layer, on each of N ranks:
- q/k/v projections and the MLP's gate/up keep 1/N of their output features (whole heads,
  whole MLP columns): column parallel, no communication;
- the attention output and MLP down projections keep the matching 1/N of their input features;
  the runner all-reduces their outputs: row parallel, one all-reduce per block (two per layer).
- the LM head keeps 1/N of the vocabulary and the runner all-gathers the logits (when the
  vocabulary divides evenly), so every rank ends with the same full logits; only rank 0 samples.
Embeddings and norms stay replicated. Works on any Llama/Qwen2-style model, including the tiny ones
built in code, because it acts on the loaded modules rather than on a checkpoint. `shard_model`
returns the `Collectives` that `specdec.engine.runner.ModelRunner` calls at those points.
"""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist
from torch import nn

from specdec.engine.runner import Collectives


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


def _split_inputs(linear: nn.Linear, rank: int, world: int) -> None:
    """Row parallel: keep this rank's slice of the input features; partial outputs are all-reduced."""
    n = linear.in_features // world
    linear.weight = nn.Parameter(linear.weight.data[:, rank * n:(rank + 1) * n].clone(), requires_grad=False)
    if linear.bias is not None and rank != 0:  # the bias is added once, by rank 0, before the sum
        linear.bias = None
    linear.in_features = n


class TensorParallelCollectives(Collectives):
    """Sums row-parallel partial outputs and gathers vocabulary-parallel logits over `group`; its ranks agree on
    every growth of a KV cache (`KVCache._check_memory`)."""

    def __init__(self, group, world: int, vocab_split: bool):
        self.group, self.world, self.vocab_split = group, world, vocab_split
        self._ranks_here: int | None = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x, group=self.group)
        return x

    def agree(self, holds: bool) -> bool:
        flag = torch.tensor([int(holds)], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())

    def ranks_here(self) -> int:
        if self._ranks_here is None:  # asked first by every rank at once, as `agree` is
            hosts = [None] * self.world
            dist.all_gather_object(hosts, socket.gethostname(), group=self.group)
            self._ranks_here = hosts.count(socket.gethostname())
        return self._ranks_here

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.vocab_split:
            return logits
        parts = [torch.empty_like(logits) for _ in range(self.world)]
        dist.all_gather(parts, logits.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


def shard_model(model: nn.Module, rank: int, world: int, group=None) -> TensorParallelCollectives:
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
                _split_inputs(linear, rank, world)
        head = model.get_output_embeddings()
        vocab_split = head.out_features % world == 0
        if vocab_split:
            _split_outputs(head, rank, world)
    return TensorParallelCollectives(group, world, vocab_split)
