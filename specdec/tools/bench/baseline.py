"""The Hugging Face baselines' models, on the same linear kernels as our runner: a slow baseline is no win."""

from __future__ import annotations

import torch
from torch import nn

from specdec import weights
from specdec.engine.compute import WEIGHT_DTYPE
from specdec.engine.cpu import blockquant
from specdec.engine.cpu.q8dot import PACKED_PATHS, block_kernel, use_one_row_pairs_of
from specdec.engine.kernels import make_kernel
from specdec.engine.models import eos_token_ids, load_hf_model


def hf_baseline(spec: str, device, path: str, kernel: str):
    """A Hugging Face model for a baseline, with the linear kernels our runner uses on `path`, and our EOS ids
    (`eos_token_ids`: a GGUF's config names fewer), so that it stops where our decoding does."""
    resolved = weights.resolve(spec)
    model = load_hf_model(resolved, device, WEIGHT_DTYPE[path], packed=path in PACKED_PATHS)
    ends = eos_token_ids(model, resolved)
    if ends:
        model.generation_config.eos_token_id = list(ends)
    return swap_linears(model, path, kernel)


def greedy_generate(model: nn.Module, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    """Greedy `model.generate(ids, **kwargs)` without autograd (which is per thread: a baseline runs on a thread of
    its own, `specdec.engine.measure.off_the_initial_thread`, as the services' passes do)."""
    with torch.inference_mode():
        return model.generate(ids, do_sample=False, **kwargs)


def swap_linears(model: nn.Module, path: str, kernel: str = "onednn") -> nn.Module:
    """Replace every `nn.Linear` of a Hugging Face model by the kernel `path` uses, in place.

    This gives the baselines (HF `generate`, assisted generation) the same linear kernels as our
    runner, so that a comparison measures the serving system, not the matmul library; on gguf-q8 the process
    takes the one-row setting `kernel` names too (a service's, timed at its load).
    """
    linears = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if isinstance(child, nn.Linear)]
    for parent, name, child in linears:
        if path in PACKED_PATHS:  # a GGUF model loaded packed (`load_hf_model(..., packed=True)`)
            setattr(parent, name, block_kernel(path, [child.block_weight], child.bias))
        else:
            setattr(parent, name, make_kernel(path, child.weight, child.bias, kernel))
    if path == "gguf-q8":
        use_one_row_pairs_of(kernel)
    if path in PACKED_PATHS:
        model.model.embed_tokens = blockquant.BlockEmbedding(model.model.embed_tokens.block_weight)
    if path == "bf16":
        model.to(torch.bfloat16)
    return model
