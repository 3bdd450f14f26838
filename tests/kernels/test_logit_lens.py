"""logit_lens: the Triton kernel against its twin, and the signals' properties."""

from __future__ import annotations

import math

import pytest
import torch

from adarag.kernels import logit_lens
from adarag.kernels.logit_lens import logit_lens_ref, logit_lens_triton
from tests.kernels.conftest import DTYPES, assert_close

# (num_layers, hidden_size, vocab); with block_v=16 and block_k=16 the vocabulary and hidden size
# fall on a block boundary, one short of it and one past it.
SHAPES = [(1, 16, 16), (2, 15, 31), (4, 16, 32), (4, 17, 33), (5, 40, 100)]


def _inputs(shape, dtype, device):
    num_layers, hidden_size, vocab = shape
    hidden = (3 * torch.randn(num_layers, hidden_size)).to(dtype).to(device)
    norm_weight = (1 + 0.1 * torch.randn(hidden_size)).to(dtype).to(device)
    lm_head_weight = torch.randn(vocab, hidden_size).to(dtype).to(device)
    return hidden, norm_weight, 1e-5, lm_head_weight


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_kernel_matches_twin(shape, dtype, device):
    inputs = _inputs(shape, dtype, device)
    kl, entropy = logit_lens_triton(*inputs, block_v=16, block_k=16)
    expected_kl, expected_entropy = logit_lens_ref(*inputs)
    assert kl.shape == (shape[0] - 1,) and entropy.shape == ()
    assert kl.dtype == entropy.dtype == torch.float32
    # both compute in float32 from the same rounded inputs: the float32 tolerance applies
    assert_close(kl, expected_kl, torch.float32)
    assert_close(entropy, expected_entropy, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dispatcher_runs_kernel_with_default_blocks(dtype, device):
    inputs = _inputs((4, 64, 300), dtype, device)
    kl, entropy = logit_lens(*inputs, backend="triton")
    expected_kl, expected_entropy = logit_lens_ref(*inputs)
    assert_close(kl, expected_kl, torch.float32)
    assert_close(entropy, expected_entropy, torch.float32)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_signals_are_bounded(backend, device):
    hidden, norm_weight, eps, lm_head_weight = _inputs((4, 32, 50), torch.float32, device)
    hidden[1] = hidden[-1]  # a layer that already agrees with the last one
    kl, entropy = logit_lens(hidden, norm_weight, eps, lm_head_weight, backend=backend)
    assert torch.all(kl >= -1e-5)
    assert abs(float(kl[1])) < 1e-5
    assert 0.0 <= float(entropy) <= math.log(50) + 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_llama_8b_shapes_match_twin_on_gpu(dtype):
    hidden, norm_weight, eps, lm_head_weight = _inputs((4, 4096, 128256), dtype, "cuda")
    lm_head_weight /= 30  # logits of a realistic spread
    kl, entropy = logit_lens(hidden, norm_weight, eps, lm_head_weight, backend="triton")
    expected_kl, expected_entropy = logit_lens_ref(hidden, norm_weight, eps, lm_head_weight)
    torch.testing.assert_close(kl, expected_kl, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(entropy, expected_entropy, atol=1e-3, rtol=1e-4)
