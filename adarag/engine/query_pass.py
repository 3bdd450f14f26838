"""The query pass: the query suffix run over the reused KV before anything is recomputed.

What the fused prefill reads from it: the attention the query pays each position (the
``query_attention`` / ``query_deviation`` rules and the query-share chunk allocation), that
attention in every layer (the learned rule's features) and the query's next-token logits over
the reused KV (uncertainty routing and the routing ladder).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adarag.config import RecomputeConfig
from adarag.engine.batch import ForwardBatch
from adarag.engine.kv_cache import KVCache
from adarag.engine.layer_stack import LayerStack
from adarag.engine.selection import RecomputePlan, key_attention_mass
from adarag.errors import InputError


@dataclass(frozen=True)
class QueryReading:
    """What the query pass read (each None when not asked for).

    Attributes:
        mass: [num_tokens] the query's attention per position, summed over the scored layers.
        layer_mass: [2, num_layers, num_tokens] the attention of all query tokens and of its
            last token, in every layer.
        logits: [vocab] the query's last token's logits over the reused KV.
    """

    mass: torch.Tensor | None = None
    layer_mass: torch.Tensor | None = None
    logits: torch.Tensor | None = None


def query_pass(
    stack: LayerStack,
    batch: ForwardBatch,
    plan: RecomputePlan,
    kv: KVCache,
    mass: bool,
    logits: bool,
    per_layer: bool = False,
) -> QueryReading:
    """The query suffix over the cached KV: its attention per position and its logits.

    All float32 on the CPU. The query runs through the layers up to the last scored one, or
    through every layer for the logits or the per-layer attention; its K/V rows are written at
    its own positions, which the recomputation overwrites before anything reads them.
    """
    num_layers = stack.spec.num_layers
    first, last = query_layers(batch.selection, num_layers) if mass else (0, 0)
    top = num_layers if logits or per_layer else last
    positions = plan.query.to(stack.device)
    stream = stack.new_stream(batch.token_ids[plan.query], positions, batch.packet)
    cos_sin = stack.cos_sin(positions)
    rows = torch.zeros(2, top, kv.length, dtype=torch.float32, device=stack.device)
    for layer_idx in range(top):
        q, k, v = stack.project(layer_idx, stream.hidden, cos_sin)
        stack.write(kv, layer_idx, k, v, positions)
        if per_layer or first <= layer_idx < last:
            keys = kv.k[layer_idx, : kv.length]
            rows[0, layer_idx] = key_attention_mass(q, keys, positions, stack.scale)
        if per_layer:
            keys = kv.k[layer_idx, : kv.length]
            rows[1, layer_idx] = key_attention_mass(q[-1:], keys, positions[-1:], stack.scale)
        if layer_idx + 1 < top or logits:
            attn = stack.attend(layer_idx, q, positions, kv)
            stream.hidden = stack.model.decoder_layers[layer_idx].finish(stream.hidden, attn)
    return QueryReading(
        rows[0, first:last].sum(dim=0).cpu() if mass else None,
        rows.cpu() if per_layer else None,
        stack.model.logits(stream.hidden[-1:])[0] if logits else None,
    )


def query_layers(selection: RecomputeConfig, num_layers: int) -> tuple[int, int]:
    """``[first, last)`` layers whose query attention scores (all layers by default).

    Raises:
        InputError: ``selection.query_layers`` is not a layer range of the model.
    """
    layers = selection.query_layers
    if selection.query_last_layers is not None:
        layers = (max(num_layers - selection.query_last_layers, 0), num_layers)
    first, last = (0, num_layers) if layers is None else layers
    if not 0 <= first < last <= num_layers:
        raise InputError(
            f"experimental.recompute.query_layers {layers} is not a layer range of a "
            f"{num_layers}-layer model; pass [first, last) with 0 <= first < last <= "
            f"{num_layers}, or None for all layers"
        )
    return first, last
