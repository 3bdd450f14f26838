"""Backend choice: when the dispatchers run Triton, when they refuse, and that Triton stays lazy."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from adarag.errors import KernelUnavailableError
from adarag.kernels import _dispatch, rope_delta
from adarag.kernels._dispatch import use_triton


def _cpu_inputs():
    k = torch.randn(3, 2, 16)
    delta = torch.tensor([1, 2, 3])
    inv_freq = torch.rand(8)
    return k, delta, inv_freq


def test_explicit_triton_on_cpu_without_interpreter_raises(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(_dispatch, "is_triton_installed", lambda: True)
    with pytest.raises(KernelUnavailableError, match="TRITON_INTERPRET"):
        rope_delta(*_cpu_inputs(), backend="triton")


def test_explicit_triton_without_triton_raises(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(_dispatch, "is_triton_installed", lambda: False)
    with pytest.raises(KernelUnavailableError, match="not installed"):
        rope_delta(*_cpu_inputs(), backend="triton")


def test_explicit_triton_on_cpu_with_interpreter_runs_the_kernel(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(_dispatch, "is_triton_installed", lambda: True)
    assert use_triton("triton", torch.zeros(1))


@pytest.mark.parametrize("interpreted", [False, True])
def test_auto_and_torch_take_the_twin_on_cpu(interpreted, monkeypatch):
    if interpreted:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(_dispatch, "is_triton_installed", lambda: True)
    assert not use_triton("auto", torch.zeros(1))
    assert not use_triton("torch", torch.zeros(1))


def test_auto_on_cuda_takes_triton_when_installed(monkeypatch):
    cuda_tensor = SimpleNamespace(is_cuda=True)  # use_triton reads only the device
    monkeypatch.setattr(_dispatch, "is_triton_installed", lambda: False)
    assert not use_triton("auto", cuda_tensor)
    monkeypatch.setattr(_dispatch, "is_triton_installed", lambda: True)
    assert use_triton("auto", cuda_tensor)
    assert not use_triton("auto", cuda_tensor, torch.zeros(1))  # mixed devices: the twin


def test_twins_never_import_triton():
    code = (
        "import sys, torch\n"
        "from adarag.kernels import kv_scatter, logit_lens, rope_delta, selective_attention\n"
        "k = torch.randn(4, 2, 16)\n"
        "rope_delta(k, torch.arange(4), torch.rand(8), backend='auto')\n"
        "kv_scatter(k.clone(), k.clone(), k[:1], k[:1], torch.tensor([2]), backend='torch')\n"
        "selective_attention(torch.randn(2, 4, 16), k, k, torch.tensor([1, 3]), 0.25)\n"
        "logit_lens(torch.randn(3, 16), torch.ones(16), 1e-5, torch.randn(20, 16))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
