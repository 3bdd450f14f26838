"""Writing fused KV rows into vLLM's paged KV cache, through each attention backend's own op.

vLLM's paged layout is backend-specific (the CPU backend packs keys per ISA, for one), so the
rows go through ``impl.do_kv_cache_update`` -- the op vLLM itself uses to store new tokens --
rather than through an assumed tensor layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from vllm.model_executor.layers.attention.attention import Attention
from vllm.model_executor.models.utils import extract_layer_index

from adarag.engine.vllm.handoff import FusedContext


def attention_layers(layers: Mapping[str, Any]) -> dict[int, Attention]:
    """Decoder layer index -> vLLM attention layer.

    Args:
        layers: vLLM's forward-context layers (``forward_context.no_compile_layers``).
    """
    return {
        extract_layer_index(name): layer
        for name, layer in layers.items()
        if isinstance(layer, Attention)
    }


def write_rows(
    layers: Mapping[int, Attention],
    context: FusedContext,
    start: int,
    end: int,
    slot_mapping: torch.Tensor,
) -> None:
    """Store rows ``start..end-1`` of ``context`` in every layer's paged cache.

    Args:
        layers: Decoder layer index -> vLLM attention layer (see :func:`attention_layers`).
        context: The fused KV, ``k, v [num_layers, num_tokens, num_kv_heads, head_dim]``.
        start: First row (prompt position) to write.
        end: One past the last row.
        slot_mapping: [end - start] int64 paged-cache slots of those rows.
    """
    assert end <= context.num_tokens, f"rows up to {end} of a {context.num_tokens}-token context"
    assert len(layers) == context.k.shape[0], (
        f"vLLM has {len(layers)} attention layers, the fused KV {context.k.shape[0]}"
    )
    for layer_idx, layer in layers.items():
        cache = layer.kv_cache
        keys = context.k[layer_idx, start:end].to(cache.dtype).contiguous()
        values = context.v[layer_idx, start:end].to(cache.dtype).contiguous()
        impl: Any = layer.impl  # every non-MLA backend implements do_kv_cache_update
        impl.do_kv_cache_update(layer, keys, values, cache, slot_mapping)
