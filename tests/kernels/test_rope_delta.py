"""rope_delta: the Triton kernel against its twin, and the rotation properties of both."""

from __future__ import annotations

import pytest
import torch

from adarag.kernels import rope_delta
from adarag.kernels.rope_delta import rope_delta_ref, rope_delta_triton
from tests.kernels.conftest import DTYPES, assert_close

# (leading dims, num_tokens, num_kv_heads, head_dim); with block_tokens=16 the tokens fall on a
# block boundary, one short of it and one past it.
SHAPES = [
    ((), 1, 1, 16),
    ((2,), 15, 1, 32),
    ((2,), 16, 1, 32),
    ((2,), 17, 1, 32),
    ((3,), 33, 3, 64),
    ((2, 2), 5, 2, 80),  # head_dim 80: half 40 is padded to 64 columns
]


def _inv_freq(head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)


def _inputs(shape, dtype, device, max_delta=4096):
    leading, num_tokens, num_kv_heads, head_dim = shape
    k = torch.randn(*leading, num_tokens, num_kv_heads, head_dim).to(dtype).to(device)
    delta = torch.randint(-max_delta, max_delta, (num_tokens,)).to(device)
    return k, delta, _inv_freq(head_dim).to(device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_kernel_matches_twin(shape, dtype, device):
    k, delta, inv_freq = _inputs(shape, dtype, device)
    out = rope_delta_triton(k, delta, inv_freq, block_tokens=16)
    assert out.shape == k.shape and out.dtype == dtype and out.is_contiguous()
    assert_close(out, rope_delta_ref(k, delta, inv_freq), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dispatcher_runs_kernel_with_default_blocks(dtype, device):
    k, delta, inv_freq = _inputs(((2,), 70, 3, 64), dtype, device)
    assert_close(
        rope_delta(k, delta, inv_freq, backend="triton"), rope_delta_ref(k, delta, inv_freq), dtype
    )


def test_kernel_reads_strided_keys(device):
    # keys of a [layers, capacity, heads, dim] cache sliced to a token range
    cache = torch.randn(2, 40, 3, 32, device=device)
    k = cache[:, 5:28]
    delta = torch.randint(-100, 100, (23,), device=device)
    inv_freq = _inv_freq(32).to(device)
    assert_close(
        rope_delta_triton(k, delta, inv_freq), rope_delta_ref(k, delta, inv_freq), torch.float32
    )


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rotating_by_zero_is_identity(backend, dtype, device):
    k, _, inv_freq = _inputs(((2,), 9, 3, 64), dtype, device)
    zero = torch.zeros(9, dtype=torch.int64, device=device)
    assert torch.equal(rope_delta(k, zero, inv_freq, backend=backend), k)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_rotations_compose(backend, device):
    # rotating by p1, then by p2 - p1, equals rotating by p2
    k, _, inv_freq = _inputs(((2,), 13, 2, 64), torch.float32, device)
    p1 = torch.randint(-2000, 2000, (13,), device=device)
    p2 = torch.randint(-2000, 2000, (13,), device=device)
    two_steps = rope_delta(
        rope_delta(k, p1, inv_freq, backend=backend), p2 - p1, inv_freq, backend=backend
    )
    # angles up to ~4000 rad carry float32 rounding of ~2.4e-4 rad
    expected = rope_delta(k, p2, inv_freq, backend=backend)
    torch.testing.assert_close(two_steps, expected, atol=1e-3, rtol=1e-3)


def test_rotation_preserves_pair_norms():
    k, delta, inv_freq = _inputs(((), 7, 2, 16), torch.float32, "cpu")
    out = rope_delta_ref(k, delta, inv_freq)
    pair_norm = lambda x: x[..., :8].pow(2) + x[..., 8:].pow(2)  # noqa: E731
    torch.testing.assert_close(pair_norm(out), pair_norm(k), atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_llama_8b_shapes_match_twin_on_gpu(dtype):
    k, delta, inv_freq = _inputs(((32,), 2000, 8, 128), dtype, "cuda", max_delta=32768)
    assert_close(
        rope_delta(k, delta, inv_freq, backend="triton"), rope_delta_ref(k, delta, inv_freq), dtype
    )
