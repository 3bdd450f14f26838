"""Re-rotate cached RoPE keys from their stored positions to new positions.

RoPE rotates each pair ``(x_i, x_{i+d/2})`` of a key by the angle ``p * inv_freq_i``. Rotations
compose, so a key cached at position ``p`` moves to position ``q`` by one more rotation of
``(q - p) * inv_freq_i``::

    out = k * cos(delta * f) + rotate_half(k) * sin(delta * f),   f = cat(inv_freq, inv_freq)

Inputs: ``k [..., num_tokens, num_kv_heads, head_dim]`` (any float dtype, last dim contiguous),
``delta_positions [num_tokens]`` int64 (target minus stored position), ``inv_freq [head_dim // 2]``
float32. Output: same shape and dtype as ``k``, contiguous; angles and products are computed in
float32. The Triton kernel treats ``k`` as ``[batch, num_tokens, num_kv_heads, head_dim]`` rows
(the leading dimensions flattened into ``batch``, usually the layers): one program computes the
angles of a block of tokens once and rotates every head of those tokens in one batch entry.
Source: RoFormer (Su et al., 2021) eq. 34; delta re-rotation as in LMCache's ``fused_encode`` and
the AdaCache design note, section "Selective recomputation", step 1.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import torch

from adarag.kernels._dispatch import Backend, jit_kernels, use_triton

if TYPE_CHECKING:
    import triton.language as tl


def rope_delta_ref(
    k: torch.Tensor, delta_positions: torch.Tensor, inv_freq: torch.Tensor
) -> torch.Tensor:
    """Pure-torch twin: rotate ``k`` by ``delta_positions`` (see module docstring)."""
    freqs = delta_positions.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    k32 = k.to(torch.float32)
    half = k.shape[-1] // 2
    rotated_half = torch.cat((-k32[..., half:], k32[..., :half]), dim=-1)
    return (k32 * cos + rotated_half * sin).to(k.dtype)


def _rotate_head(  # type: ignore[no-untyped-def]
    k_ptr,
    out_ptr,
    token_idx,
    cos,
    sin,
    mask,
    stride_k_token,
    stride_out_token,
    HALF_DIM: tl.constexpr,
    HALF_DIM_PADDED: tl.constexpr,
):
    """Rotate one head of a block of tokens by precomputed ``cos``/``sin``."""
    cols = tl.arange(0, HALF_DIM_PADDED)
    # load both halves, upcast to float32: [BLOCK_TOKENS, HALF_DIM_PADDED]
    k_rows = k_ptr + token_idx * stride_k_token
    x1 = tl.load(k_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(k_rows[:, None] + HALF_DIM + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    # rotate: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
    out1 = x1 * cos - x2 * sin
    out2 = x2 * cos + x1 * sin
    # store in the output dtype
    out_rows = out_ptr + token_idx * stride_out_token
    out_dtype = out_ptr.dtype.element_ty
    tl.store(out_rows[:, None] + cols[None, :], out1.to(out_dtype), mask=mask)
    tl.store(out_rows[:, None] + HALF_DIM + cols[None, :], out2.to(out_dtype), mask=mask)


def _rope_delta_kernel(  # type: ignore[no-untyped-def]
    k_ptr,
    out_ptr,
    delta_ptr,
    inv_freq_ptr,
    num_tokens,
    num_kv_heads,
    stride_k_batch,
    stride_k_token,
    stride_k_head,
    stride_out_batch,
    stride_out_token,
    stride_out_head,
    HALF_DIM: tl.constexpr,
    HALF_DIM_PADDED: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr,
):
    """Rotate every head of BLOCK_TOKENS tokens of one batch entry; grid (token blocks, batch)."""
    batch_idx = tl.program_id(1).to(tl.int64)
    token_idx = tl.program_id(0) * BLOCK_TOKENS + tl.arange(0, BLOCK_TOKENS)
    cols = tl.arange(0, HALF_DIM_PADDED)
    is_token = token_idx < num_tokens
    mask = is_token[:, None] & (cols < HALF_DIM)[None, :]
    # angles in float32 from the integer deltas, once for all heads: [BLOCK_TOKENS, HALF_DIM_PADDED]
    delta = tl.load(delta_ptr + token_idx, mask=is_token, other=0).to(tl.float32)
    inv_freq = tl.load(inv_freq_ptr + cols, mask=cols < HALF_DIM, other=0.0)
    angles = delta[:, None] * inv_freq[None, :]
    cos, sin = tl.cos(angles), tl.sin(angles)
    # rotate head by head
    k_batch_ptr = k_ptr + batch_idx * stride_k_batch
    out_batch_ptr = out_ptr + batch_idx * stride_out_batch
    for head_idx in range(num_kv_heads):
        _rotate_head(
            k_batch_ptr + head_idx * stride_k_head,
            out_batch_ptr + head_idx * stride_out_head,
            token_idx,
            cos,
            sin,
            mask,
            stride_k_token,
            stride_out_token,
            HALF_DIM,
            HALF_DIM_PADDED,
        )


@functools.cache
def _compiled_kernel() -> Any:
    _, kernel = jit_kernels(_rotate_head, _rope_delta_kernel)
    return kernel


def rope_delta_triton(
    k: torch.Tensor,
    delta_positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    block_tokens: int | None = None,
) -> torch.Tensor:
    """Triton implementation of :func:`rope_delta_ref` (same arguments and result).

    Args:
        k: [..., num_tokens, num_kv_heads, head_dim], last dim contiguous.
        delta_positions: [num_tokens] int64.
        inv_freq: [head_dim // 2] float32.
        block_tokens: Tokens per program; a power of two. Default: 2048 elements of each half
            per head, which compiles for sm_90 without register spills on 4 warps.
    """
    assert k.dim() >= 3, f"k must be [..., num_tokens, num_kv_heads, head_dim], got {k.shape}"
    num_tokens, num_kv_heads, head_dim = k.shape[-3:]
    assert head_dim % 2 == 0, f"head_dim must be even, got {head_dim}"
    assert delta_positions.shape == (num_tokens,), (
        f"delta_positions must be [{num_tokens}], got {tuple(delta_positions.shape)}"
    )
    assert not delta_positions.is_floating_point(), "delta_positions must be an integer tensor"
    assert inv_freq.shape == (head_dim // 2,), (
        f"inv_freq must be [{head_dim // 2}], got {tuple(inv_freq.shape)}"
    )
    assert inv_freq.dtype == torch.float32, f"inv_freq must be float32, got {inv_freq.dtype}"
    assert k.stride(-1) == 1, "k's last dimension must be contiguous"
    assert k.device == delta_positions.device == inv_freq.device, "tensors on different devices"
    half_dim = head_dim // 2
    half_dim_padded = 1 << max(half_dim - 1, 0).bit_length()
    if block_tokens is None:
        block_tokens = max(1, 2048 // half_dim_padded)
    assert block_tokens & (block_tokens - 1) == 0, (
        f"block_tokens must be a power of two: {block_tokens}"
    )
    keys = k.reshape(-1, num_tokens, num_kv_heads, head_dim)
    out = torch.empty(keys.shape, dtype=k.dtype, device=k.device)
    if out.numel() == 0:
        return out.view(k.shape)
    grid = (math.ceil(num_tokens / block_tokens), keys.shape[0])
    _compiled_kernel()[grid](
        keys,
        out,
        delta_positions.contiguous(),
        inv_freq.contiguous(),
        num_tokens,
        num_kv_heads,
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        HALF_DIM=half_dim,
        HALF_DIM_PADDED=half_dim_padded,
        BLOCK_TOKENS=block_tokens,
        num_warps=4,
    )
    return out.view(k.shape)


def rope_delta(
    k: torch.Tensor,
    delta_positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Rotate cached keys by per-token position deltas.

    Args:
        k: [..., num_tokens, num_kv_heads, head_dim] keys after RoPE at their stored positions.
        delta_positions: [num_tokens] int64, target position minus stored position.
        inv_freq: [head_dim // 2] float32 RoPE inverse frequencies.
        backend: Kernel backend ("auto", "triton" or "torch").

    Returns:
        Keys as if RoPE had been applied at the target positions; shape and dtype of ``k``.
    """
    if use_triton(backend, k, delta_positions, inv_freq):
        return rope_delta_triton(k, delta_positions, inv_freq)
    return rope_delta_ref(k, delta_positions, inv_freq)
