"""Shared fixtures: tiny-model embedded stacks (real processes on loopback), one per compute path."""

from __future__ import annotations

import pytest

from launch.stack import EmbeddedStack, StackOptions

TINY_TARGET = "tiny:seed=0"
TINY_DRAFT = "tiny:seed=0,perturb=0.05"  # agrees with the target on about half the tokens
PATH_OPTIONS = {"fp32": {}, "bf16": {"dtype": "bfloat16"}, "int8": {"quantize": "int8"}}


def tiny_stack(path: str = "fp32") -> EmbeddedStack:
    opts = StackOptions(draft_model=TINY_DRAFT, target_model=TINY_TARGET, device="cpu", gamma_max=6,
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


def pytest_configure(config):
    """Measured cost profiles go to a folder of this run's own (the services inherit it), never to
    the user's weights cache: every run starts by measuring, as a fresh machine does."""
    import os
    import tempfile

    os.environ["SPECDEC_PROFILE_CACHE"] = tempfile.mkdtemp(prefix="specdec-profiles-")
