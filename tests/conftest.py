"""Shared fixtures: tiny-model embedded stacks (real processes on loopback), one per compute path."""

from __future__ import annotations

import pytest

from specdec.launch.stack import EmbeddedStack, StackOptions

TINY_TARGET = "tiny:seed=0"
TINY_DRAFT = "tiny:seed=0,perturb=0.05"  # agrees with the target on about half the tokens
# GGUF sources (weights quantized as a Q4_K_M file's are; 256 wide, so Q4_K and Q6_K blocks): on CPU
# their default path is "gguf"; `dtype: float32` runs the same dequantized weights on fp32.
GGUF_TARGET = "tiny:seed=0,hidden=256,gguf=1"
GGUF_DRAFT = "tiny:seed=0,hidden=256,gguf=1,perturb=0.05"
PATH_OPTIONS = {"fp32": {}, "bf16": {"dtype": "bfloat16"}, "int8": {"quantize": "int8"}, "gguf": {}}
# Test stacks draft with the model and never overlap unless a request says otherwise: their tests are
# about the draft model's rounds, which lookups of earlier tests' outputs (the server's default, hybrid)
# would replace. The defaults have tests of their own (test_ngram, test_overlap).
MODEL_DRAFTING = dict(proposer="model", overlap="off")


def tiny_models(path: str) -> tuple[str, str]:
    """(draft, target) specs for a compute path's tests."""
    return (GGUF_DRAFT, GGUF_TARGET) if path == "gguf" else (TINY_DRAFT, TINY_TARGET)


def tiny_stack(path: str = "fp32") -> EmbeddedStack:
    draft, target = tiny_models(path)
    opts = StackOptions(**MODEL_DRAFTING, draft_model=draft, target_model=target, device="cpu", gamma_max=6,
                        max_new_tokens_limit=1024, log_level="warning", **PATH_OPTIONS[path])
    return EmbeddedStack(opts)


@pytest.fixture(scope="session")
def stack():
    with tiny_stack() as running:
        yield running


@pytest.fixture(scope="session")
def int8_stack():
    with tiny_stack("int8") as running:
        yield running


@pytest.fixture(scope="session")
def gguf_stack():
    with tiny_stack("gguf") as running:
        yield running


def pytest_configure(config):
    """Measured cost profiles go to a folder of this run's own (the services inherit it), never to
    the user's weights cache: every run starts by measuring, as a fresh machine does."""
    import os
    import tempfile

    os.environ["SPECDEC_PROFILE_CACHE"] = tempfile.mkdtemp(prefix="specdec-profiles-")
