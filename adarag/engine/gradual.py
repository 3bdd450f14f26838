"""CacheBlend's gradual filtering (section 4.3): fewer recomputed tokens in the higher layers.

Layer ``l`` keeps its share of the candidates
(:func:`~adarag.engine.selection.layer_budget_factor`): those whose fresh V deviates most from
the cached V there. The tokens a selection always keeps (each chunk's first tokens) stay.
"""

from __future__ import annotations

import torch

from adarag.config import RecomputeConfig
from adarag.engine.kv_cache import KVCache
from adarag.engine.layer_stack import CosSin, LayerStack
from adarag.engine.selection import RecomputePlan, layer_budget_factor, value_deviation
from adarag.engine.stream import Stream


class GradualSchedule:
    """Narrows a fused prefill's stream layer by layer.

    Args:
        stack: The model's layers.
        plan: The prefill's positions.
        selection: The request's selection knobs (the schedule's spread, the chunk starts).
    """

    def __init__(self, stack: LayerStack, plan: RecomputePlan, selection: RecomputeConfig) -> None:
        self._stack = stack
        self._plan = plan
        self._selection = selection

    def narrow(self, layer_idx: int, stream: Stream, kv: KVCache, cos_sin: CosSin) -> CosSin:
        """Keep the layer's share of candidates in ``stream``; returns the kept rows' cos/sin."""
        stack, plan, selection = self._stack, self._plan, self._selection
        factor = layer_budget_factor(layer_idx, stack.spec.num_layers, selection)
        target = sum(plan.scaled_budgets(factor))
        candidates = plan.candidates.to(stack.device)
        is_candidate = torch.isin(stream.positions, candidates)
        if int(is_candidate.sum()) <= target:
            return cos_sin
        rows = is_candidate.nonzero().squeeze(1)
        _, _, v = stack.model.decoder_layers[layer_idx].project_qkv(stream.hidden[rows])
        positions = stream.positions[rows]
        scores = value_deviation(v, kv.v[layer_idx, positions]).cpu()
        offsets = plan.candidate_offset[torch.searchsorted(plan.candidates, positions.cpu())]
        scores[offsets < selection.chunk_start_tokens] = float("inf")
        order = torch.sort(-scores, stable=True).indices
        drop = rows[order[target:].to(stack.device)]
        keep = torch.ones_like(is_candidate)
        keep[drop] = False
        stream.hidden, stream.positions = stream.hidden[keep], stream.positions[keep]
        return cos_sin[0][keep], cos_sin[1][keep]
