"""Write recomputed K/V rows into a fused cache at their absolute positions.

``k_cache[positions[i]] = k[i]`` and ``v_cache[positions[i]] = v[i]`` for every ``i``, in place.

Inputs: ``k_cache, v_cache [num_slots, num_kv_heads, head_dim]`` (rows contiguous);
``k, v [num_tokens, num_kv_heads, head_dim]`` of the cache's dtype (last dim contiguous);
``positions [num_tokens]`` int64, unique. The Triton kernel copies a block of (token, head) rows
per program, keys and values in the same program; rows whose position falls outside the cache are
dropped (the twin raises). Source: the slot-mapped store of nano-vllm's ``store_kvcache``.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import torch

from adarag.kernels._dispatch import Backend, jit_kernels, use_triton

if TYPE_CHECKING:
    import triton.language as tl


def kv_scatter_ref(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
) -> None:
    """Pure-torch twin: index-copy rows of ``k``/``v`` into the caches."""
    k_cache.index_copy_(0, positions, k.to(k_cache.dtype))
    v_cache.index_copy_(0, positions, v.to(v_cache.dtype))


def _copy_rows(  # type: ignore[no-untyped-def]
    src_ptr,
    dst_ptr,
    token_idx,
    head_idx,
    slot_idx,
    row_mask,
    stride_src_token,
    stride_src_head,
    stride_dst_slot,
    stride_dst_head,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
):
    """Copy rows ``src[token_idx, head_idx]`` to ``dst[slot_idx, head_idx]``."""
    dims = tl.arange(0, HEAD_DIM_PADDED)
    mask = row_mask[:, None] & (dims < HEAD_DIM)[None, :]
    # load [BLOCK_ROWS, HEAD_DIM_PADDED] source rows
    src_rows = src_ptr + token_idx * stride_src_token + head_idx * stride_src_head
    rows = tl.load(src_rows[:, None] + dims[None, :], mask=mask)
    # store them, cast to the cache dtype, at their slots
    dst_rows = dst_ptr + slot_idx * stride_dst_slot + head_idx * stride_dst_head
    tl.store(dst_rows[:, None] + dims[None, :], rows.to(dst_ptr.dtype.element_ty), mask=mask)


def _kv_scatter_kernel(  # type: ignore[no-untyped-def]
    k_cache_ptr,
    v_cache_ptr,
    k_ptr,
    v_ptr,
    positions_ptr,
    num_rows,
    num_kv_heads,
    num_slots,
    stride_k_cache_slot,
    stride_k_cache_head,
    stride_v_cache_slot,
    stride_v_cache_head,
    stride_k_token,
    stride_k_head,
    stride_v_token,
    stride_v_head,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
):
    """Scatter ``BLOCK_ROWS`` (token, head) rows of k and v; grid (row blocks,)."""
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    token_idx = rows // num_kv_heads
    head_idx = rows % num_kv_heads
    # target slot of every row; rows outside the cache are masked out
    is_row = rows < num_rows
    slot_idx = tl.load(positions_ptr + token_idx, mask=is_row, other=0)
    row_mask = is_row & (slot_idx >= 0) & (slot_idx < num_slots)
    # copy keys, then values
    _copy_rows(
        k_ptr,
        k_cache_ptr,
        token_idx,
        head_idx,
        slot_idx,
        row_mask,
        stride_k_token,
        stride_k_head,
        stride_k_cache_slot,
        stride_k_cache_head,
        HEAD_DIM,
        HEAD_DIM_PADDED,
    )
    _copy_rows(
        v_ptr,
        v_cache_ptr,
        token_idx,
        head_idx,
        slot_idx,
        row_mask,
        stride_v_token,
        stride_v_head,
        stride_v_cache_slot,
        stride_v_cache_head,
        HEAD_DIM,
        HEAD_DIM_PADDED,
    )


@functools.cache
def _compiled_kernel() -> Any:
    _, kernel = jit_kernels(_copy_rows, _kv_scatter_kernel)
    return kernel


def kv_scatter_triton(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    *,
    block_rows: int | None = None,
) -> None:
    """Triton implementation of :func:`kv_scatter_ref` (same arguments, in place).

    Args:
        k_cache: [num_slots, num_kv_heads, head_dim], last dim contiguous.
        v_cache: [num_slots, num_kv_heads, head_dim], last dim contiguous.
        k: [num_tokens, num_kv_heads, head_dim], last dim contiguous.
        v: [num_tokens, num_kv_heads, head_dim], last dim contiguous.
        positions: [num_tokens] int64 unique target rows.
        block_rows: (token, head) rows per program; a power of two. Default: 2048 elements
            per program, which compiles for sm_90 without register spills on 4 warps.
    """
    num_slots, num_kv_heads, head_dim = k_cache.shape
    num_tokens = positions.shape[0]
    assert positions.shape == (num_tokens,), f"positions must be 1-D, got {positions.shape}"
    assert not positions.is_floating_point(), "positions must be an integer tensor"
    assert v_cache.shape == k_cache.shape, f"v_cache {v_cache.shape} != k_cache {k_cache.shape}"
    expected = (num_tokens, num_kv_heads, head_dim)
    assert k.shape == expected and v.shape == expected, (
        f"k {tuple(k.shape)} and v {tuple(v.shape)} must be {expected}"
    )
    for name, tensor in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        assert tensor.stride(-1) == 1, f"{name}'s last dimension must be contiguous"
        assert tensor.device == positions.device, f"{name} is on {tensor.device}"
    if num_tokens == 0:
        return
    head_dim_padded = 1 << max(head_dim - 1, 0).bit_length()
    if block_rows is None:
        block_rows = max(1, 2048 // head_dim_padded)
    assert block_rows & (block_rows - 1) == 0, f"block_rows must be a power of two: {block_rows}"
    num_rows = num_tokens * num_kv_heads
    grid = (math.ceil(num_rows / block_rows),)
    _compiled_kernel()[grid](
        k_cache,
        v_cache,
        k,
        v,
        positions.contiguous(),
        num_rows,
        num_kv_heads,
        num_slots,
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        HEAD_DIM=head_dim,
        HEAD_DIM_PADDED=head_dim_padded,
        BLOCK_ROWS=block_rows,
        num_warps=4,
    )


def kv_scatter(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    *,
    backend: Backend = "auto",
) -> None:
    """Scatter recomputed K/V rows into the fused cache in place.

    Args:
        k_cache: [num_slots, num_kv_heads, head_dim] keys of one layer, written in place.
        v_cache: [num_slots, num_kv_heads, head_dim] values of one layer, written in place.
        k: [num_tokens, num_kv_heads, head_dim] new keys.
        v: [num_tokens, num_kv_heads, head_dim] new values.
        positions: [num_tokens] int64 unique target rows.
        backend: Kernel backend ("auto", "triton" or "torch").
    """
    if use_triton(backend, k_cache, v_cache, k, v):
        kv_scatter_triton(k_cache, v_cache, k, v, positions)
        return
    kv_scatter_ref(k_cache, v_cache, k, v, positions)
