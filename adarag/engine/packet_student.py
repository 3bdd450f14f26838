"""The packet's student: a tail of tokens over a fixed context, with autograd.

``adarag calibrate --packet`` (:mod:`adarag.evaluation.profiling.packet_fit`) fits the packet
table by running the bridge, the question and the answer with :func:`tail_logits` over the
context KV a fused prefill left, differentiable with respect to the table only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from adarag.engine.kv_cache import KVCache
from adarag.engine.layer_stack import LayerStack
from adarag.engine.packet import embed_tokens
from adarag.engine.rope import apply_rope


def tail_logits(
    stack: LayerStack,
    context: KVCache,
    context_len: int,
    token_ids: torch.Tensor,
    packet: torch.Tensor | None = None,
) -> torch.Tensor:
    """Float32 logits [n, vocab] of ``token_ids [n]`` at positions ``context_len..`` over a context.

    Every token attends to the context's first ``context_len`` rows and causally to the tail;
    nothing is written into ``context``. Runs with autograd (call it outside inference mode):
    the gradient reaches ``packet`` (and nothing of the model's), so the packet's fit is a
    forward and backward over the tail alone, however long the context.
    """
    device = stack.device
    num_tokens = int(token_ids.numel())
    positions = torch.arange(context_len, context_len + num_tokens, device=device)
    hidden = embed_tokens(stack.model, token_ids.to(device), packet).to(stack.dtype)
    cos, sin = stack.cos_sin(positions)
    # the tail sees the whole context and the tail tokens at or before its own position
    visible = torch.ones(num_tokens, context_len + num_tokens, dtype=torch.bool, device=device)
    visible[:, context_len:] = torch.ones(num_tokens, num_tokens, device=device).tril().bool()
    for layer_idx, layer in enumerate(stack.model.decoder_layers):
        q, k, v = layer.project_qkv(hidden)
        # apply_rope rotates in place, which autograd refuses on the projection's split views
        q, k = apply_rope(q.clone(), cos, sin), apply_rope(k.clone(), cos, sin)
        keys = torch.cat([context.k[layer_idx, :context_len].to(k.dtype), k])
        values = torch.cat([context.v[layer_idx, :context_len].to(v.dtype), v])
        groups = q.shape[1] // keys.shape[1]
        attn = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            keys.repeat_interleave(groups, dim=1).transpose(0, 1),
            values.repeat_interleave(groups, dim=1).transpose(0, 1),
            attn_mask=visible,
            scale=stack.scale,
        ).transpose(0, 1)
        hidden = layer.finish(hidden, attn)
    return stack.model.logits(hidden)


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
