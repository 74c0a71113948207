"""The packaged Qwen2.5-Coder 0.5B/1.5B pair end to end (slow: run with `pytest -m slow`)."""

from __future__ import annotations

import pytest

from cli.client import generate, make_request
from launch.stack import EmbeddedStack, StackOptions

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real_stack():
    with EmbeddedStack(StackOptions()) as running:
        yield running


@pytest.mark.parametrize("prompt", ["def is_prime(n):\n", "The three laws of thermodynamics are"])
def test_real_pair_greedy_equals_target_only(real_stack, prompt):
    baseline = generate(real_stack.endpoint, make_request(prompt=prompt, max_new_tokens=32, gamma=0))
    for gamma in (1, 3, 5, None):
        result = generate(real_stack.endpoint, make_request(prompt=prompt, max_new_tokens=32, gamma=gamma))
        assert result.token_ids == baseline.token_ids, f"γ={gamma} diverged from target-only"
        assert result.stats["accepted_tokens"] > 0
