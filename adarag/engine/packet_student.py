"""The packet's student: a tail of tokens over a fixed context, with autograd.

``adarag calibrate --packet`` (:mod:`adarag.evaluation.profiling.packet_fit`) fits the packet
table by running the bridge, the question and the answer with :func:`tail_logits` over the
context KV a fused prefill left, differentiable with respect to the table only; a trailer's rows
(:func:`tail_rows`, computed after their chunk alone) go into that context as :class:`FreshRows`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812

from adarag.engine.kv_cache import KVCache
from adarag.engine.layer_stack import LayerStack
from adarag.engine.packet import embed_tokens
from adarag.engine.rope import apply_rope
from adarag.kernels import rope_delta


@dataclass(frozen=True)
class FreshRows:
    """Context rows a student computes with autograd (a trailer's): they replace the cache's.

    Attributes:
        positions: [m] their rows in the context.
        k: [num_layers, m, num_kv_heads, head_dim] keys, rotated for ``positions``.
        v: [num_layers, m, num_kv_heads, head_dim] values.
    """

    positions: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor

    @classmethod
    def joined(cls, parts: Sequence[FreshRows]) -> FreshRows:
        """Several sets of rows as one, in the order given."""
        return cls(
            torch.cat([part.positions for part in parts]),
            torch.cat([part.k for part in parts], dim=1),
            torch.cat([part.v for part in parts], dim=1),
        )

    def moved(self, positions: torch.Tensor, inv_freq: torch.Tensor) -> FreshRows:
        """The same rows at other ``positions``, keys re-rotated (differentiably)."""
        delta = (positions - self.positions).to(self.k.device)
        rotated = [rope_delta(layer, delta, inv_freq, backend="torch") for layer in self.k]
        return FreshRows(positions, torch.stack(rotated), self.v)


def tail_logits(
    stack: LayerStack,
    context: KVCache,
    context_len: int,
    token_ids: torch.Tensor,
    packet: torch.Tensor | None = None,
    fresh: FreshRows | None = None,
) -> torch.Tensor:
    """Float32 logits [n, vocab] of ``token_ids [n]`` at positions ``context_len..`` over a context.

    Every token attends to the context's first ``context_len`` rows (``fresh`` in place of its
    rows) and causally to the tail; nothing is written into ``context``. Runs with autograd (call
    it outside inference mode): the gradient reaches ``packet`` and ``fresh`` (and nothing of the
    model's), so a packet's fit is a forward and backward over a few tokens, however long the
    context.
    """
    hidden, _ = tail_forward(stack, context, context_len, token_ids, packet, fresh)
    return stack.model.logits(hidden)


def tail_rows(
    stack: LayerStack,
    context: KVCache,
    context_len: int,
    token_ids: torch.Tensor,
    packet: torch.Tensor | None = None,
) -> FreshRows:
    """The K/V ``token_ids`` leave at positions ``context_len..`` over a context (a trailer's)."""
    _, rows = tail_forward(stack, context, context_len, token_ids, packet, keep_rows=True)
    assert rows is not None
    return rows


def tail_forward(
    stack: LayerStack,
    context: KVCache,
    context_len: int,
    token_ids: torch.Tensor,
    packet: torch.Tensor | None = None,
    fresh: FreshRows | None = None,
    keep_rows: bool = False,
) -> tuple[torch.Tensor, FreshRows | None]:
    """The tail's last-layer hidden states, and its K/V in every layer when ``keep_rows``."""
    device = stack.device
    num_tokens = int(token_ids.numel())
    positions = torch.arange(context_len, context_len + num_tokens, device=device)
    hidden = embed_tokens(stack.model, token_ids.to(device), packet).to(stack.dtype)
    cos, sin = stack.cos_sin(positions)
    # the tail sees the whole context and the tail tokens at or before its own position
    visible = torch.ones(num_tokens, context_len + num_tokens, dtype=torch.bool, device=device)
    visible[:, context_len:] = torch.ones(num_tokens, num_tokens, device=device).tril().bool()
    kept_k, kept_v = [], []
    for layer_idx, layer in enumerate(stack.model.decoder_layers):
        q, k, v = layer.project_qkv(hidden)
        # apply_rope rotates in place, which autograd refuses on the projection's split views
        q, k = apply_rope(q.clone(), cos, sin), apply_rope(k.clone(), cos, sin)
        if keep_rows:
            kept_k.append(k)
            kept_v.append(v)
        cached_k = context.k[layer_idx, :context_len].to(k.dtype)
        cached_v = context.v[layer_idx, :context_len].to(v.dtype)
        if fresh is not None:
            rows = (fresh.positions.to(device),)
            cached_k = cached_k.index_put(rows, fresh.k[layer_idx].to(k.dtype))
            cached_v = cached_v.index_put(rows, fresh.v[layer_idx].to(v.dtype))
        keys, values = torch.cat([cached_k, k]), torch.cat([cached_v, v])
        groups = q.shape[1] // keys.shape[1]
        attn = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            keys.repeat_interleave(groups, dim=1).transpose(0, 1),
            values.repeat_interleave(groups, dim=1).transpose(0, 1),
            attn_mask=visible,
            scale=stack.scale,
        ).transpose(0, 1)
        hidden = layer.finish(hidden, attn)
    if not keep_rows:
        return hidden, None
    return hidden, FreshRows(positions, torch.stack(kept_k), torch.stack(kept_v))


def context_copy(kv: KVCache, rows: int) -> KVCache:
    """The first ``rows`` of a prefill's cache as ordinary tensors (autograd may read them).

    A prefill's cache is made in inference mode, whose tensors a backward pass cannot save.
    """
    spec_shape = kv.k.shape
    copy = KVCache(spec_shape[0], rows, spec_shape[2], spec_shape[3], kv.k.dtype, kv.k.device)
    with torch.no_grad():
        copy.k.copy_(kv.k[:, :rows])
        copy.v.copy_(kv.v[:, :rows])
    copy.length = rows
    return copy
