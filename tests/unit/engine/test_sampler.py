"""Next-token sampling at the edges of the allowed options."""

from __future__ import annotations

import pytest
import torch

from adarag.engine.sampler import make_rng, sample_token
from adarag.schema import GenerationParams


@pytest.mark.parametrize(
    "options",
    [
        {"temperature": 5e-324},
        {"temperature": 1e-300},
        {"temperature": 1e-40},
        {"temperature": 10.0, "top_p": 5e-324},
        {"temperature": 0.7, "top_p": 1e-300},
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_a_tiny_temperature_or_top_p_picks_the_most_likely_token(options, dtype):
    logits = (torch.randn(300) * 30).to(dtype)
    kept = logits.clone()
    params = GenerationParams(seed=7, **options)
    for _ in range(5):
        assert sample_token(logits, params, make_rng(params)) == int(torch.argmax(logits))
    assert torch.equal(logits, kept)  # the caller's logits are left as they were


def test_a_seeded_sample_at_the_largest_seed_is_reproducible_and_spread():
    logits = torch.zeros(8)
    params = GenerationParams(temperature=1.0, seed=2**64 - 1)

    def draws() -> list[int]:
        rng = make_rng(params)
        return [sample_token(logits, params, rng) for _ in range(64)]

    first = draws()
    assert draws() == first and len(set(first)) > 4


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1])
def test_a_seed_outside_64_bits_is_refused(seed):
    with pytest.raises(ValueError, match="seed"):
        GenerationParams(temperature=1.0, seed=seed)
