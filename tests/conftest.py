"""Shared fixtures: a tiny-model embedded stack (real processes on loopback)."""

from __future__ import annotations

import pytest

from orchestrator.stack import EmbeddedStack, StackOptions

TINY_TARGET = "tiny:seed=0"
TINY_DRAFT = "tiny:seed=0,perturb=0.05"  # agrees with the target on about half the tokens


@pytest.fixture(scope="session")
def stack():
    opts = StackOptions(draft_model=TINY_DRAFT, target_model=TINY_TARGET, device="cpu", gamma_max=6,
                        max_new_tokens_limit=1024, log_level="warning")
    with EmbeddedStack(opts) as running:
        yield running
