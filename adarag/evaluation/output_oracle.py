"""Output-aware oracle: the reused positions whose K/V matter most to the full prefill's answer.

The K/V-deviation ``oracle`` ranks positions by how far their cached K/V lie from a full
prefill's, which is not what the answer depends on. This oracle asks the answer instead. Every
context position's K/V (in every layer) is mixed between the cached and the full prefill's::

    K_j(m) = K_j^cached + m_j (K_j^full - K_j^cached)        (V alike)

and the query suffix plus the full prefill's answer run over that context (teacher forcing); the
loss is the negative log-likelihood of that answer. ``-dL/dm_j`` at the current ``m`` is the
first-order reduction of the loss from making position ``j`` exact. Positions are taken greedily,
an equal part of the budget per round, each round re-deriving the gradient with the chosen ones
exact. The result is a score per position for ``selection_policy="output_oracle"``, which then
recomputes those positions for real: what the oracle reports is what recomputing them gives.

It needs the full prefill (a benchmark control, as the K/V-deviation oracle) and runs the model
in plain differentiable torch over the query and answer tokens only.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F  # noqa: N812

from adarag.engine.core import Engine
from adarag.engine.kv_cache import KVCache
from adarag.engine.packet import embed_tokens
from adarag.engine.rope import rope_cos_sin
from adarag.engine.selection import num_to_recompute
from adarag.schema import PromptLayout

ROUNDS = 4
"""Greedy rounds; each takes an equal part of the budget."""


def output_oracle_scores(
    engine: Engine,
    layout: PromptLayout,
    reused: KVCache,
    full: KVCache,
    answer_ids: Sequence[int],
    ratio: float,
    rounds: int = ROUNDS,
) -> torch.Tensor:
    """Scores [num_tokens] for ``output_oracle`` at ``ratio`` (higher is recomputed first).

    Args:
        engine: The model.
        layout: The prompt: system prefix, chunks, query suffix.
        reused: A fused prefill's KV with the chunks reused as they were cached (ratio 0).
        full: The full prefill's KV of the same prompt.
        answer_ids: The full prefill's greedy answer (at least its first token).
        ratio: Share of each chunk's tokens the budget allows (the total over chunks).
        rounds: Greedy rounds.
    """
    with torch.inference_mode(False), torch.enable_grad():
        loss_of = AnswerLoss(engine, layout, reused, full, answer_ids)
        return oracle_ranking(loss_of, layout, ratio, rounds)


def oracle_ranking(
    loss_of: AnswerLoss,
    layout: PromptLayout,
    ratio: float,
    rounds: int = ROUNDS,
    first_gain: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`output_oracle_scores` over a prepared loss (shared by several ratios).

    Args:
        loss_of: The answer's loss over the mixed context.
        layout: The prompt.
        ratio: Share of each chunk's tokens the budget allows.
        rounds: Greedy rounds.
        first_gain: ``loss_of.gain`` with no position exact, when already computed (the first
            round's, the same at every ratio).
    """
    cu = layout.cu_segments
    context = cu[-2]  # positions before the query suffix
    candidates = torch.arange(cu[1], context)
    budget = sum(num_to_recompute(len(ids), ratio) for ids in layout.chunk_ids)
    mix = torch.zeros(context)
    scores = torch.full((layout.num_tokens,), -math.inf)
    chosen = torch.zeros(context, dtype=torch.bool)
    step = max(1, math.ceil(budget / rounds))
    gain = torch.zeros(context)
    with torch.inference_mode(False), torch.enable_grad():
        for round_idx in range(rounds):
            if round_idx == 0 and first_gain is not None:
                gain = first_gain
            else:
                gain = loss_of.gain(mix)
            taken = int(chosen.sum())
            if taken >= budget:
                break
            open_gain = torch.where(chosen[candidates], -math.inf, gain[candidates])
            count = min(step, budget - taken)
            best = candidates[torch.sort(-open_gain, stable=True).indices[:count]]
            scores[best] = 1e6 * (rounds - round_idx) + gain[best]
            chosen[best] = True
            mix[best] = 1.0
    rest = candidates[~chosen[candidates]]
    scores[rest] = gain[rest]
    return scores


class AnswerLoss:
    """NLL of the full prefill's answer over context K/V mixed by ``m``, and its gradient.

    A layout whose query holds packet tokens (a bridge) embeds them with ``packet``, its table.
    """

    def __init__(
        self,
        engine: Engine,
        layout: PromptLayout,
        reused: KVCache,
        full: KVCache,
        answer_ids: Sequence[int],
        packet: torch.Tensor | None = None,
    ) -> None:
        self.model = engine.runner.model
        self.packet = packet
        self.spec = engine.spec
        context = layout.cu_segments[-2]
        rows = slice(0, context)
        self.cached_k = reused.k[:, rows].float().clone()
        self.cached_v = reused.v[:, rows].float().clone()
        self.delta_k = full.k[:, rows].float().clone() - self.cached_k
        self.delta_v = full.v[:, rows].float().clone() - self.cached_v
        self.context = context
        self.query_ids = list(layout.query_ids)
        self.num_query = len(self.query_ids)
        self.inv_freq = engine.runner.inv_freq.cpu()
        self._set_answer(answer_ids)

    def with_answer(self, answer_ids: Sequence[int]) -> AnswerLoss:
        """The same mixed context (its tensors shared, not copied) under another answer."""
        other = copy.copy(self)
        other._set_answer(answer_ids)
        return other

    def _set_answer(self, answer_ids: Sequence[int]) -> None:
        answer = list(answer_ids)
        self.token_ids = torch.tensor(self.query_ids + answer[:-1], dtype=torch.int64)
        self.targets = torch.tensor(answer, dtype=torch.int64)
        positions = torch.arange(self.context, self.context + self.token_ids.numel())
        self.cos, self.sin = rope_cos_sin(positions, self.inv_freq, torch.float32)

    def gain(self, mix: torch.Tensor) -> torch.Tensor:
        """[context] ``-dL/dm`` at ``mix``: the loss reduction of making each position exact."""
        m = mix.clone().requires_grad_(True)
        loss = self._loss(m)
        (grad,) = torch.autograd.grad(loss, m)
        return -grad.detach()

    def _loss(self, m: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.logits(m), self.targets)

    def logits(self, m: torch.Tensor, attention: list[torch.Tensor] | None = None) -> torch.Tensor:
        """[num_answer, vocab] logits predicting each answer token over the context mixed by m.

        Args:
            m: [context] one mix per position.
            attention: When given, each layer's attention over the context is appended to it:
                [num_query + num_answer - 1, context], averaged over heads.
        """
        spec = self.spec
        hidden = embed_tokens(self.model, self.token_ids, self.packet).float()
        num_new = self.token_ids.numel()
        visible = torch.ones(num_new, self.context + num_new, dtype=torch.bool)
        visible[:, self.context :] = torch.tril(torch.ones(num_new, num_new, dtype=torch.bool))
        group = spec.num_heads // spec.num_kv_heads
        for layer_idx, layer in enumerate(self.model.decoder_layers):
            attn = layer.self_attn  # type: ignore[attr-defined]
            x = layer.input_layernorm(hidden)  # type: ignore[attr-defined]
            qkv = F.linear(x, attn.qkv_proj.weight, attn.qkv_proj.bias)
            q, k, v = qkv.split(attn.split_sizes, dim=-1)
            q = q.reshape(num_new, spec.num_heads, spec.head_dim)
            k = k.reshape(num_new, spec.num_kv_heads, spec.head_dim)
            v = v.reshape(num_new, spec.num_kv_heads, spec.head_dim)
            if attn.q_norm is not None and attn.k_norm is not None:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = _rotate(q, self.cos, self.sin), _rotate(k, self.cos, self.sin)
            weight = m[:, None, None]
            keys = torch.cat((self.cached_k[layer_idx] + weight * self.delta_k[layer_idx], k))
            values = torch.cat((self.cached_v[layer_idx] + weight * self.delta_v[layer_idx], v))
            keys = keys.repeat_interleave(group, dim=1)
            values = values.repeat_interleave(group, dim=1)
            logits = torch.einsum("qhd,khd->hqk", q, keys) * spec.head_dim**-0.5
            probs = logits.masked_fill(~visible[None], -math.inf).softmax(dim=-1)
            if attention is not None:
                attention.append(probs[:, :, : self.context].mean(dim=0).detach())
            out = torch.einsum("hqk,khd->qhd", probs, values).flatten(1)
            hidden = hidden + F.linear(out, attn.o_proj.weight)
            mlp = layer.mlp  # type: ignore[attr-defined]
            gate, up = F.linear(
                layer.post_attention_layernorm(hidden),  # type: ignore[attr-defined]
                mlp.gate_up_proj.weight,
            ).chunk(2, dim=-1)
            hidden = hidden + F.linear(F.silu(gate) * up, mlp.down_proj.weight)
        return self.model.logits(hidden[self.num_query - 1 :])


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE out of place (autograd-safe): ``x * cos + rotate_half(x) * sin``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]
