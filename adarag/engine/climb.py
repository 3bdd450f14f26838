"""Routing inside a fused prefill: uncertainty routing before selection, the ladder after it.

Uncertainty routing raises a whole request's ratio when the query's next-token entropy over the
reused KV is above ``selection.uncertain_entropy``. The routing ladder
(:mod:`adarag.engine.routing`) climbs after the recomputation, topping up the recomputed set
rung by rung while the fitted model says the answer is unlikely to equal full recomputation's.
"""

from __future__ import annotations

import numpy as np
import torch

from adarag.config import RecomputeConfig
from adarag.engine.batch import ForwardBatch
from adarag.engine.kv_cache import KVCache
from adarag.engine.layer_stack import LayerStack
from adarag.engine.routing import RungTrace, routing_features, score_mass, uncertainty_trace
from adarag.engine.selection import RecomputePlan
from adarag.engine.stream import Stream
from adarag.kernels import lens_signals_from_logits


def route_on_entropy(
    plan: RecomputePlan, selection: RecomputeConfig, stream: Stream
) -> RecomputePlan:
    """``plan``, raised to ``selection.uncertain_ratio`` when the reused KV's entropy is high.

    Reads the query pass's logits in ``stream.reused_logits``; records what it did in
    ``stream.uncertainty``.
    """
    threshold, logits = selection.uncertain_entropy, stream.reused_logits
    if threshold is None or logits is None:
        return plan
    _, entropy = lens_signals_from_logits(logits[None])  # nats
    base = max(plan.ratios)
    routed = float(entropy) > threshold
    if routed:
        plan = plan.raised(selection.uncertain_ratio)
    raised = max(plan.ratios) if routed else None
    stream.uncertainty = uncertainty_trace(float(entropy), base, raised)
    return plan


def climb(
    stack: LayerStack,
    batch: ForwardBatch,
    plan: RecomputePlan,
    kv: KVCache,
    stream: Stream,
    layer_hidden: torch.Tensor,
    recomputed: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, tuple[RungTrace, ...]]:
    """Climb the batch's ladder while a rung is unlikely to agree with full recomputation.

    Returns the last token's hidden states per layer, the recomputed positions and the
    rungs stood on. A climb runs the newly chosen tokens and the query suffix through every
    layer; a rung of ratio 1.0 runs every reused token (equal to a full prefill).
    """
    ladder = batch.ladder
    assert ladder is not None and stream.scores is not None
    assert stream.reused_logits is not None, "the query pass ran to the logits"
    learned = batch.selection.selection_policy == "learned" and batch.token_scorer is not None
    mass = score_mass(stream.scores, learned)
    trace: list[RungTrace] = []
    ratio = max(plan.ratios)
    for rung_idx in range(len(ladder.rungs) + 1):
        logits = stack.model.logits(layer_hidden[-1:])[0]
        chosen = torch.isin(plan.candidates, recomputed.cpu())
        features = routing_features(logits, stream.reused_logits, mass, chosen, batch.num_tokens)
        if rung_idx == len(ladder.rungs):
            trace.append(RungTrace(ratio, features, None, False))
            break
        probability = float(ladder.models[rung_idx].probabilities(np.array([features]))[0])
        climbs = probability < ladder.thresholds[rung_idx]
        trace.append(RungTrace(ratio, features, probability, climbs))
        if not climbs:
            break
        ratio = ladder.rungs[rung_idx]
        raised = plan.raised(ratio)
        if ratio >= 1.0:  # every reused token again: the rung equals a full prefill
            positions = raised.processed
        else:
            wanted = raised.choose(stream.scores, batch.selection)
            new = wanted[~torch.isin(wanted, recomputed.cpu())]
            positions = torch.cat((new, plan.query)).sort().values
        layer_hidden = stack.forward_positions(batch, kv, positions)
        recomputed = torch.unique(torch.cat((recomputed.cpu(), positions)))
    return layer_hidden, recomputed, tuple(trace)
