"""Backend choice for the kernel dispatchers: Triton on CUDA tensors, torch twins elsewhere."""

from __future__ import annotations

import importlib.util
import os
from typing import Literal

import torch

from adarag.errors import KernelUnavailableError

Backend = Literal["auto", "triton", "torch"]


def is_triton_installed() -> bool:
    """True when the ``triton`` package can be imported."""
    return importlib.util.find_spec("triton") is not None


def is_triton_interpreted() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def use_triton(backend: Backend, *tensors: torch.Tensor) -> bool:
    """Decide whether a dispatcher runs its Triton kernel.

    Args:
        backend: ``"auto"`` uses Triton when it is installed and the tensors are on CUDA;
            ``"triton"`` insists; ``"torch"`` always takes the twin.
        *tensors: The op's tensor arguments (their device decides ``"auto"``).

    Raises:
        KernelUnavailableError: ``backend="triton"`` but Triton is missing, or the tensors are on
            the CPU without ``TRITON_INTERPRET=1``.
    """
    on_cuda = all(t.is_cuda for t in tensors)
    if backend == "torch":
        return False
    if backend == "auto":
        return on_cuda and is_triton_installed()
    if not is_triton_installed():
        raise KernelUnavailableError(
            "kernel backend 'triton' was requested but Triton is not installed; install "
            "`adarag[triton]` or set kernels.backend to 'auto' or 'torch'"
        )
    if not on_cuda and not is_triton_interpreted():
        raise KernelUnavailableError(
            "kernel backend 'triton' needs CUDA tensors (or TRITON_INTERPRET=1 to interpret on "
            "the CPU); set kernels.backend to 'auto' or 'torch' on this machine"
        )
    return True
