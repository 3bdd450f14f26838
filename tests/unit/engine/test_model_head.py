"""The CPU LM-head projection and layer projections equal ``F.linear`` for any number of rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from adarag.engine.model import linear, project_to_vocab


@pytest.mark.parametrize("num_rows", [1, 2, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_projection_matches_linear(num_rows, dtype):
    rng = torch.Generator().manual_seed(num_rows)
    weight = torch.randn(1000, 64, generator=rng).to(dtype)
    normed = torch.randn(num_rows, 64, generator=rng).to(dtype)
    logits = project_to_vocab(normed, weight)
    assert logits.shape == (num_rows, 1000) and logits.dtype == dtype
    tolerance = {"atol": 1e-4, "rtol": 1e-5} if dtype == torch.float32 else {}
    torch.testing.assert_close(logits, F.linear(normed, weight), **tolerance)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("num_rows", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_projection_matches_linear(num_rows, bias, dtype):
    # one float32 row runs as a two-column GEMM; the result is a contiguous [1, out] row
    torch.manual_seed(num_rows)
    layer = nn.Linear(64, 96, bias=bias).to(dtype)
    x = torch.randn(num_rows, 64).to(dtype)
    out = linear(x, layer)
    assert out.shape == (num_rows, 96) and out.dtype == dtype and out.is_contiguous()
    tolerance = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {}
    torch.testing.assert_close(out, layer(x), **tolerance)
