"""Attention of selected queries over a fused KV cache, with an absolute-position causal mask.

For query ``i`` at absolute position ``p_i`` and key ``j`` at absolute position ``j``::

    a_ij  = softmax_{j <= p_i}(scale * q_i . k_j)
    out_i = sum_j a_ij v_j                                   (selective_attention)
    mass_is = sum_{j in segment s} a_ij                      (segment_attention_mass)

Grouped-query attention: query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)``.
``segment_attention_mass`` gives, per query and head, the attention probability mass that falls in
each key segment ``[cu_segments[s], cu_segments[s + 1])`` -- what first-layer cross-chunk token
selection and the attention-sink profiler need, and what FlashAttention cannot give. The torch
twin computes it as attention over one-hot segment-indicator values, so it runs on the same fused
attention kernel as the output.

Inputs: ``q [num_q, num_heads, head_dim]``; ``k, v [num_kv, num_kv_heads, head_dim]`` (row ``j``
holds position ``j``); ``q_positions [num_q]`` int64, ascending and unique; ``cu_segments
[num_segments + 1]`` int64. Outputs: ``out [num_q, num_heads, head_dim]`` in q's dtype; ``mass
[num_q, num_heads, num_segments]`` float32. The mask is by absolute position, never bottom-right
aligned: a selected token never attends to a later position (CacheBlend's public code does, see
``notes/kv_reuse_prior_art.md`` section 1.5). Source: AdaCache section 3.1; CacheBlend section 4.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from adarag.kernels._dispatch import Backend, use_triton


def selective_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
    query_block: int = 128,
) -> torch.Tensor:
    """Pure-torch twin of :func:`selective_attention`."""
    return _blocked_attention(q, k, v, q_positions, scale, query_block)


def segment_attention_mass_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
    cu_segments: torch.Tensor,
    query_block: int = 128,
) -> torch.Tensor:
    """Pure-torch twin of :func:`segment_attention_mass`."""
    num_q, num_heads, head_dim = q.shape
    num_kv, num_kv_heads, _ = k.shape
    num_segments = cu_segments.numel() - 1
    # One-hot segment membership of every key, padded to head_dim columns per pass so that the
    # values have the keys' width (the fused CPU kernel needs it).
    owner = torch.bucketize(torch.arange(num_kv), cu_segments[1:].cpu(), right=True)
    num_passes = -(-num_segments // head_dim)
    indicator = torch.zeros(num_kv, num_passes * head_dim, dtype=q.dtype, device=q.device)
    indicator[torch.arange(num_kv), owner.to(q.device)] = 1.0
    mass = torch.empty(num_q, num_heads, num_passes * head_dim, dtype=torch.float32)
    for pass_idx in range(num_passes):
        columns = indicator[:, pass_idx * head_dim : (pass_idx + 1) * head_dim]
        values = columns[:, None, :].expand(num_kv, num_kv_heads, head_dim)
        block_mass = _blocked_attention(q, k, values, q_positions, scale, query_block)
        mass[..., pass_idx * head_dim : (pass_idx + 1) * head_dim] = block_mass.float().cpu()
    return mass[..., :num_segments]


def selective_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
    *,
    query_block: int = 128,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Attention of selected queries over the fused KV (see module docstring).

    Args:
        q: [num_q, num_heads, head_dim] queries after RoPE.
        k: [num_kv, num_kv_heads, head_dim] keys after RoPE; row j is position j.
        v: [num_kv, num_kv_heads, head_dim] values.
        q_positions: [num_q] int64 ascending absolute positions of the queries.
        scale: Softmax scale, usually head_dim ** -0.5.
        query_block: Queries per block of the torch twin.
        backend: Kernel backend ("auto", "triton" or "torch").

    Returns:
        out [num_q, num_heads, head_dim] in q's dtype.
    """
    if use_triton(backend, q, k, v):
        from adarag.kernels.selective_attention_triton import selective_attention_triton

        return selective_attention_triton(q, k, v, q_positions, scale)
    return selective_attention_ref(q, k, v, q_positions, scale, query_block)


def segment_attention_mass(
    q: torch.Tensor,
    k: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
    cu_segments: torch.Tensor,
    *,
    query_block: int = 128,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Attention probability mass of each query that falls in each key segment.

    Args:
        q: [num_q, num_heads, head_dim] queries after RoPE.
        k: [num_kv, num_kv_heads, head_dim] keys after RoPE; row j is position j.
        q_positions: [num_q] int64 ascending absolute positions of the queries.
        scale: Softmax scale.
        cu_segments: [num_segments + 1] int64 key-segment boundaries (first 0, last >= num_kv).
        query_block: Queries per block of the torch twin.
        backend: Kernel backend ("auto", "triton" or "torch").

    Returns:
        mass [num_q, num_heads, num_segments] float32 on the CPU; each row sums to 1.
    """
    if use_triton(backend, q, k):
        from adarag.kernels.selective_attention_triton import segment_attention_mass_triton

        return segment_attention_mass_triton(q, k, q_positions, scale, cu_segments)
    return segment_attention_mass_ref(q, k, q_positions, scale, cu_segments, query_block)


def _blocked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    scale: float,
    query_block: int,
) -> torch.Tensor:
    """Masked SDPA over query blocks; each block reads keys up to its last position only."""
    num_q, num_heads, _ = q.shape
    num_kv = k.shape[0]
    # SDPA's fused CPU kernels need a batch dimension; 3-D inputs take its slow math path.
    k_heads, v_heads = k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    if _is_full_causal(q_positions, num_kv):
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k_heads, v_heads, is_causal=True, scale=scale, enable_gqa=True
        )
        return out[0].transpose(0, 1)
    out = torch.empty(num_q, num_heads, v.shape[-1], dtype=q.dtype, device=q.device)
    for start in range(0, num_q, query_block):
        end = min(start + query_block, num_q)
        positions = q_positions[start:end]
        kv_len = int(positions[-1]) + 1  # keys past the block's last position are never visible
        visible = torch.arange(kv_len, device=q.device)[None, :] <= positions[:, None]
        block_out = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1)[None],
            k_heads[:, :, :kv_len],
            v_heads[:, :, :kv_len],
            attn_mask=None if end - start == 1 else visible,
            scale=scale,
            enable_gqa=True,
        )
        out[start:end] = block_out[0].transpose(0, 1)
    return out


def _is_full_causal(q_positions: torch.Tensor, num_kv: int) -> bool:
    # Ascending unique positions 0..num_kv-1 are exactly a full causal prefill.
    num_q = q_positions.numel()
    return num_q == num_kv and int(q_positions[0]) == 0 and int(q_positions[-1]) == num_kv - 1
