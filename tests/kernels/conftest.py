"""Kernel parity settings: the per-dtype tolerance table, the device, and the `gpu` marker.

Run on a CPU with ``TRITON_INTERPRET=1`` (the Makefile's test command sets it before Triton is
imported); on a GPU machine the same files run without it, so the compiled kernels are checked.
"""

from __future__ import annotations

import os

import pytest
import torch

from adarag.kernels._dispatch import is_triton_installed, is_triton_interpreted

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# One row per input dtype; outputs computed in float32 from rounded inputs use the float32 row.
TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 1.6e-2, "rtol": 1.6e-2},
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """Compare on the CPU in float32 with the tolerance of ``dtype``."""
    torch.testing.assert_close(
        actual.float().cpu(), expected.float().cpu(), **TOLERANCES[dtype], equal_nan=False
    )


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI runs every kernel test)")
    pytest.skip(reason)


@pytest.fixture()
def device() -> torch.device:
    """Where Triton kernels run here: CUDA when present, else the CPU through the interpreter."""
    if not is_triton_installed():
        _skip_or_fail("Triton is not installed; install `adarag[triton]`")
    if torch.cuda.is_available() and not is_triton_interpreted():
        return torch.device("cuda")
    if not is_triton_interpreted():
        _skip_or_fail("no CUDA device; run with TRITON_INTERPRET=1 to interpret the kernels")
    return torch.device("cpu")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """`gpu` tests run the compiled kernels: they need CUDA and no interpreter."""
    if item.get_closest_marker("gpu") is None:
        return
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if is_triton_interpreted():
        pytest.skip("runs the compiled kernels; unset TRITON_INTERPRET")
