"""The synthetic pair (`specdec.engine.synthetic`): random weights in a chosen shape, the draft's greedy
agreement with the target set by eps, and served through the real services like any model."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_speculated, tiny_options

from specdec.cli.client import generate, make_request
from specdec.engine.models import load_model
from specdec.engine.runner import Step
from specdec.engine.synthetic import config_of, parse
from specdec.launch.stack import EmbeddedStack


def agreement(eps: str) -> float:
    """Teacher-forced greedy agreement over 300 random positions."""
    draft = load_model(f"synthetic:draft,shape=small,eps={eps}", "cpu").runner
    target = load_model(f"synthetic:target,shape=small,eps={eps}", "cpu").runner
    tokens = torch.randint(0, 512, (300,), generator=torch.Generator().manual_seed(0)).tolist()
    picks = [r.forward([Step(r.new_cache(), tokens, logits=300)])[0].argmax(-1) for r in (draft, target)]
    return float((picks[0] == picks[1]).float().mean())


def test_agreement_is_set_by_eps():
    close, mid, far = agreement("0.0005"), agreement("0.05"), agreement("0.3")
    assert close > 0.97 and far < mid < close, (close, mid, far)
    assert far > 0.2, "the shared core keeps a far pair related"


def test_shapes_and_determinism():
    draft = load_model("synthetic:draft,shape=small", "cpu")
    target = load_model("synthetic:target,shape=small", "cpu")
    assert (draft.vocab_size, target.vocab_size) == (512, 512) and draft.eos_token_ids == ()
    big = config_of("qwen2.5-coder", "target")
    assert (big.hidden_size, big.num_hidden_layers, big.vocab_size) == (1536, 28, 151936)
    again = load_model("synthetic:target,shape=small", "cpu")
    tokens = [5, 9, 200]
    logits = [m.runner.forward([Step(m.runner.new_cache(), tokens)])[0] for m in (target, again)]
    assert torch.equal(*logits), "the same spec must give the same weights"


@pytest.mark.parametrize("spec,message", [("synthetic:both", "draft or synthetic:target"),
                                          ("synthetic:draft,size=9", "unknown synthetic-model option"),
                                          ("synthetic:draft,shape=huge", "unknown synthetic shape")])
def test_bad_specs_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        parse(spec)


def test_it_serves_through_the_services():
    opts = tiny_options("synthetic:draft,shape=small,eps=0.1", "synthetic:target,shape=small,eps=0.1")
    with EmbeddedStack(opts) as running:
        baseline = generate(running.endpoint, make_request(prompt="def f(x):", max_new_tokens=32, gamma=0))
        result = generate(running.endpoint, make_request(prompt="def f(x):", max_new_tokens=32, gamma=3))
    assert result.token_ids == baseline.token_ids and len(baseline.token_ids) == 32
    assert_speculated(result)
