"""Write recomputed K/V rows into a fused cache at their absolute positions.

``k_cache[positions[i]] = k[i]`` and ``v_cache[positions[i]] = v[i]`` for every ``i``, in place.

Inputs: ``k_cache, v_cache [num_slots, num_kv_heads, head_dim]`` (rows contiguous);
``k, v [num_tokens, num_kv_heads, head_dim]`` of the cache's dtype; ``positions [num_tokens]``
int64, unique. Source: the slot-mapped store of nano-vllm's ``store_kvcache``.
"""

from __future__ import annotations

import torch

from adarag.kernels._dispatch import Backend, use_triton


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
        from adarag.kernels.kv_scatter_triton import kv_scatter_triton

        kv_scatter_triton(k_cache, v_cache, k, v, positions)
        return
    kv_scatter_ref(k_cache, v_cache, k, v, positions)
