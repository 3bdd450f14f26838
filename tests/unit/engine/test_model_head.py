"""The CPU LM-head projection equals ``F.linear`` for any number of rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from adarag.engine.model import project_to_vocab


@pytest.mark.parametrize("num_rows", [1, 2, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_projection_matches_linear(num_rows, dtype):
    generator = torch.Generator().manual_seed(num_rows)
    weight = torch.randn(1000, 64, generator=generator).to(dtype)
    normed = torch.randn(num_rows, 64, generator=generator).to(dtype)
    logits = project_to_vocab(normed, weight)
    assert logits.shape == (num_rows, 1000) and logits.dtype == dtype
    tolerance = {"atol": 1e-4, "rtol": 1e-5} if dtype == torch.float32 else {}
    torch.testing.assert_close(logits, F.linear(normed, weight), **tolerance)
