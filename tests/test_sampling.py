"""Sampling filters and parameter validation."""

import pytest
import torch

from specdec.core.errors import InvalidArgument
from specdec.core.params import SamplingParams
from specdec.core.sampling import inverse_cdf, position_generator, probs_from_logits, sample


def test_top_k_keeps_exactly_k():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (probs[0] > 0).tolist() == [False, True, False, True, False]
    assert probs.sum().item() == pytest.approx(1.0)


def test_top_p_keeps_smallest_set_reaching_p():
    probs_in = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    probs = probs_from_logits(probs_in.log(), SamplingParams(temperature=1.0, top_p=0.8))
    assert (probs[0] > 0).tolist() == [True, True, False, False]
    assert probs[0, 0].item() == pytest.approx(0.5 / 0.8)


def test_top_p_always_keeps_the_top_token():
    probs = probs_from_logits(torch.tensor([[0.0, 10.0, 0.0]]), SamplingParams(temperature=1.0, top_p=1e-6))
    assert probs[0].tolist() == [0.0, 1.0, 0.0]


def test_temperature_sharpens():
    logits = torch.tensor([[1.0, 2.0]])
    hot = probs_from_logits(logits, SamplingParams(temperature=2.0))
    cold = probs_from_logits(logits, SamplingParams(temperature=0.5))
    assert cold[0, 1] > hot[0, 1]


@pytest.mark.parametrize("params", [SamplingParams(temperature=-0.1), SamplingParams(top_k=-1),
                                    SamplingParams(top_p=0.0), SamplingParams(top_p=1.5),
                                    SamplingParams(temperature=float("nan"))])
def test_invalid_params_are_refused(params):
    with pytest.raises(InvalidArgument):
        params.validate()


def test_position_generator_is_keyed_by_position():
    a = torch.rand(3, generator=position_generator(7, 10, "draft"))
    b = torch.rand(3, generator=position_generator(7, 10, "draft"))
    c = torch.rand(3, generator=position_generator(7, 11, "draft"))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_sample_draws_each_token_at_its_probability_and_never_a_zero_one():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    gen = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.tensor([sample(probs, gen) for _ in range(6000)]), minlength=6).double()
    assert counts[probs == 0].sum() == 0
    assert (counts / 6000 - probs.double()).abs().max() < 0.025


def test_inverse_cdf_ends_of_the_unit_interval():
    weights = torch.tensor([0.0, 2.0, 1.0, 0.0])
    assert inverse_cdf(weights, 0.0) == 1 and inverse_cdf(weights, 0.7) == 2
    assert inverse_cdf(weights, 1.0 - 2**-53) == 2 and inverse_cdf(weights, 1.0) == 2  # never the zero weight after
