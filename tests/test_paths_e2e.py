"""Every compute path through the real services: greedy speculative output equals target-only output
on that path, and each service reports its path and cost profile."""

from __future__ import annotations

import grpc
import pytest
from conftest import assert_speculated, stack_on, tiny_stack

from protos import specdec_pb2 as pb
from protos import specdec_pb2_grpc as pb_grpc
from specdec.cli.client import generate, make_request
from specdec.engine.cpu.features import cpu_features
from specdec.engine.cpu.native import q8_variants_for
from specdec.engine.model_engine import BATCH_PROFILE
from specdec.planning.cost import batch_sizes

PROMPTS = ["def fibonacci(n):", "The quick brown fox", "x = [1, 2, 3]\nfor"]


@pytest.fixture(scope="module")
def bf16_stack():
    with tiny_stack("bf16") as running:
        yield running


@pytest.fixture(params=["fp32", "bf16", "int8", "gguf", "gguf-q8"])
def path_stack(request):
    return request.param, stack_on(request, request.param)


def test_greedy_speculative_equals_target_only_on_every_path(path_stack):
    _, running = path_stack
    for prompt in PROMPTS:
        baseline = generate(running.endpoint, make_request(prompt=prompt, max_new_tokens=40, gamma=0)).token_ids
        for gamma in (1, 3, 6, None):
            result = generate(running.endpoint, make_request(prompt=prompt, max_new_tokens=40, gamma=gamma))
            assert result.token_ids == baseline, f"γ={gamma} diverged from target-only on {prompt!r}"
            if gamma is not None:  # the adaptive policy may rightly choose target-only here
                assert_speculated(result, f"at γ={gamma} on {prompt!r}")


def test_services_report_path_hardware_and_cost_profile(path_stack):
    path, running = path_stack
    for address, stub in ((running.draft_address, pb_grpc.DraftServiceStub),
                          (running.target_address, pb_grpc.TargetServiceStub)):
        with grpc.insecure_channel(address) as channel:
            info = stub(channel).Info(pb.ModelInfoRequest(), timeout=10)
        assert info.compute_path == path and info.hardware.startswith("cpu: ")
        verify = running.opts.orchestrator.gamma_max + 1  # every verify size 1..γ_max+1, then shared passes
        assert list(info.forward_tokens) == batch_sizes(verify, BATCH_PROFILE * verify)
        assert list(info.forward_tokens[:verify]) == list(range(1, verify + 1))
        assert len(info.forward_ns) == len(info.forward_tokens) and all(ns > 0 for ns in info.forward_ns)
        assert info.row_invariant or path == "bf16", "fp32 (oneDNN) and int8 compute each row on its own"
        # gguf-q8: one of this level's builds (where it has two, each process takes the one it times faster), with
        # one-row pairs where the process timed them faster
        assert info.kernel in {"fp32": ["onednn"], "gguf": ["gguf-Q4_K+Q6_K"],
                               "gguf-q8": [f"gguf-q8-{v}-{pairs}Q4_K+Q6_K" for v in q8_variants_for(cpu_features())
                                           for pairs in ("", "pairs-")],
                               "int8": ["onednn-int8-vnni" if cpu_features().vnni else "onednn-int8-w7a8"],
                               "bf16": ["dense" if cpu_features().native_bf16 else "dense-emulated"]}[path], info.kernel
