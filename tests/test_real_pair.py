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


def test_real_target_gguf_path_tracks_fp32_on_the_same_weights():
    """The packaged target on its default gguf path against the fp32 path on the dequantized weights:
    logits within float32 summation noise, the same greedy choice at every position."""
    import torch

    import weights
    from specdec.models import load_model, load_tokenizer
    from specdec.runner import Step

    spec = weights.resolve("packaged:target")
    ids = load_tokenizer(spec).encode("def binary_search(items, target):\n    lo, hi = 0, len(items)\n")
    logits = []
    for dtype in ("auto", "float32"):
        loaded = load_model(spec, "cpu", dtype)
        assert loaded.choice.path == ("gguf" if dtype == "auto" else "fp32")
        logits.append(loaded.runner.forward([Step(loaded.runner.new_cache(), ids, logits=len(ids))])[0])
        del loaded
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-3, atol=1e-3)
    assert torch.equal(logits[0].argmax(-1), logits[1].argmax(-1))
