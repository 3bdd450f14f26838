"""Re-rotate cached RoPE keys from their stored positions to new positions.

RoPE rotates each pair ``(x_i, x_{i+d/2})`` of a key by the angle ``p * inv_freq_i``. Rotations
compose, so a key cached at position ``p`` moves to position ``q`` by one more rotation of
``(q - p) * inv_freq_i``::

    out = k * cos(delta * f) + rotate_half(k) * sin(delta * f),   f = cat(inv_freq, inv_freq)

Inputs: ``k [..., num_tokens, num_kv_heads, head_dim]`` (any float dtype, last dim contiguous),
``delta_positions [num_tokens]`` int64 (target minus stored position), ``inv_freq [head_dim // 2]``
float32. Output: same shape and dtype as ``k``; angles and products are computed in float32.
Source: RoFormer (Su et al., 2021) eq. 34; delta re-rotation as in LMCache's ``fused_encode`` and
the AdaCache design note, section "Selective recomputation", step 1.
"""

from __future__ import annotations

import torch

from adarag.kernels._dispatch import Backend, use_triton


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
        from adarag.kernels.rope_delta_triton import rope_delta_triton

        return rope_delta_triton(k, delta_positions, inv_freq)
    return rope_delta_ref(k, delta_positions, inv_freq)
