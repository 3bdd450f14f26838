"""kv_scatter: the Triton kernel against its twin."""

from __future__ import annotations

import pytest
import torch

from adarag.kernels import kv_scatter
from adarag.kernels.kv_scatter import kv_scatter_ref, kv_scatter_triton
from tests.kernels.conftest import DTYPES, assert_close

# (num_slots, num_tokens, num_kv_heads, head_dim); with block_rows=16 the (token, head) rows fall
# on a block boundary, one short of it and one past it.
SHAPES = [
    (1, 1, 1, 16),
    (40, 15, 1, 32),
    (40, 16, 1, 32),
    (40, 17, 1, 32),
    (50, 11, 3, 64),
    (30, 7, 2, 80),  # head_dim 80 is padded to 128 columns
]


def _scatter_both(shape, cache_dtype, source_dtype, device, scatter):
    num_slots, num_tokens, num_kv_heads, head_dim = shape
    k_cache = torch.randn(num_slots, num_kv_heads, head_dim).to(cache_dtype).to(device)
    v_cache = torch.randn(num_slots, num_kv_heads, head_dim).to(cache_dtype).to(device)
    # k and v are views into one fused projection, as the engine's project_qkv returns them
    kv = torch.randn(num_tokens, 2 * num_kv_heads + 1, head_dim).to(source_dtype).to(device)
    k, v = kv[:, :num_kv_heads], kv[:, num_kv_heads : 2 * num_kv_heads]
    positions = torch.randperm(num_slots)[:num_tokens].to(device)
    expected = (k_cache.clone(), v_cache.clone())
    kv_scatter_ref(*expected, k, v, positions)
    scatter(k_cache, v_cache, k, v, positions)
    return (k_cache, v_cache), expected


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_kernel_matches_twin_exactly(shape, dtype, device):
    def scatter(*args):
        kv_scatter_triton(*args, block_rows=16)

    actual, expected = _scatter_both(shape, dtype, dtype, device, scatter)
    assert torch.equal(actual[0], expected[0]) and torch.equal(actual[1], expected[1])


@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.bfloat16], ids=str)
def test_kernel_casts_rows_to_the_cache_dtype(cache_dtype, device):
    # Triton's interpreter truncates float32 -> bfloat16 where the GPU rounds: compare at tolerance
    def scatter(*args):
        kv_scatter(*args, backend="triton")

    actual, expected = _scatter_both((50, 20, 2, 64), cache_dtype, torch.float32, device, scatter)
    assert_close(actual[0], expected[0], cache_dtype)
    assert_close(actual[1], expected[1], cache_dtype)


def test_no_rows_is_a_no_op(device):
    k_cache = torch.randn(8, 2, 16, device=device)
    before = k_cache.clone()
    empty = torch.empty(0, 2, 16, device=device)
    kv_scatter_triton(
        k_cache, k_cache, empty, empty, torch.empty(0, dtype=torch.int64, device=device)
    )
    assert torch.equal(k_cache, before)


def test_rows_outside_the_cache_are_dropped(device):
    k_cache, v_cache = torch.zeros(2, 4, 1, 16, device=device)
    rows = torch.ones(3, 1, 16, device=device)
    positions = torch.tensor([1, 4, 100], device=device)
    kv_scatter_triton(k_cache, v_cache, rows, rows, positions, block_rows=1)
    written = k_cache.sum(dim=(1, 2)) != 0
    assert written.tolist() == [False, True, False, False]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_llama_8b_shapes_match_twin_on_gpu(dtype):
    def scatter(*args):
        kv_scatter(*args, backend="triton")

    actual, expected = _scatter_both((8192, 1229, 8, 128), dtype, dtype, "cuda", scatter)
    assert torch.equal(actual[0], expected[0]) and torch.equal(actual[1], expected[1])
