"""Lossless through the services: speculative samples follow the target's own distribution."""

from __future__ import annotations

import math

import grpc
import pytest
import torch

from orchestrator.client import make_request
from protos import specdec_pb2_grpc as pb_grpc
from service_runtime.server import CHANNEL_OPTIONS
from specdec.models import load_model
from specdec.runner import Step
from specdec.sampling import SamplingParams, probs_from_logits

from conftest import PATH_OPTIONS, TINY_TARGET


@pytest.mark.parametrize("path", ["fp32", "int8"])
def test_first_token_histogram_matches_target(request, path):
    """The target distribution p comes from the target as served on that path (same kernels)."""
    stack = request.getfixturevalue({"fp32": "stack", "int8": "int8_stack"}[path])
    prompt = [40, 41, 42, 43]
    params = SamplingParams(temperature=1.0, top_k=8)
    target = load_model(TINY_TARGET, "cpu", **PATH_OPTIONS[path]).runner
    logits = target.forward([Step(target.new_cache(), prompt)])[0]  # [1, V]
    p = probs_from_logits(logits, params)[0]  # [V]
    samples = 1200
    counts = torch.zeros_like(p)
    accepted = 0
    with grpc.insecure_channel(stack.endpoint, options=CHANNEL_OPTIONS) as channel:
        stub = pb_grpc.SpecDecStub(channel)
        for seed in range(samples):
            request = make_request(prompt_token_ids=prompt, max_new_tokens=2, temperature=1.0, top_k=8, seed=seed,
                                   gamma=1)
            first = next(iter(stub.Generate(request, timeout=30)))
            counts[first.token_ids[0]] += 1
            accepted += first.round.accepted
    hist = counts / samples
    tv = 0.5 * (hist - p).abs().sum().item()
    bound = 0.5 * math.sqrt(8 / samples) + math.sqrt(math.log(1e4) / (2 * samples))
    assert tv < bound, f"TV {tv:.3f} >= {bound:.3f}"
    assert counts[p == 0].sum() == 0, "a token outside the target's top-k was emitted"
    assert 0 < accepted < samples, "the draft should be accepted sometimes, not always"
