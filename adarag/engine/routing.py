"""The routing ladder: a fused prefill recomputes more where it is likely to change the answer.

After a fused prefill at its base ratio, the ladder reads a few signals of the result
(:data:`ROUTING_FEATURES`) and a fitted model (``adarag calibrate --selector``) turns them into
the probability that the answer equals full recomputation's. Below the rung's threshold the
prefill climbs to the next rung: the tokens the rule ranks next, up to the rung's ratio, run
through every layer over the fused KV together with the query suffix, so a climb pays only the
difference. A rung of ratio 1.0 recomputes every reused token, the earlier rungs' included,
and so equals a full prefill.

The signals, all of the query suffix's last token:

- ``entropy`` and ``margin`` (top-1 minus top-2 probability) of the rung's next-token
  distribution;
- ``entropy_reused``: the entropy over the reused KV before any recomputation (the query pass
  the selection makes), and ``drift``, the KL divergence of the rung's distribution from that
  one, with ``top_changed`` when their argmax differs;
- ``missed_share``: the share of the rule's score mass left outside the recomputed set (the
  learned rule's probabilities; the other rules' non-negative scores);
- ``log_num_tokens``: the prompt's length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from adarag.fitted import FittedModel

ROUTING_FEATURES = (
    "entropy",
    "margin",
    "entropy_reused",
    "drift",
    "top_changed",
    "missed_share",
    "log_num_tokens",
)


@dataclass(frozen=True)
class RoutingLadder:
    """Where a fused prefill may climb, and when.

    Attributes:
        rungs: Ratios above the base one, ascending (e.g. ``(0.4, 1.0)``).
        models: One per decision: P(the answer at the current rung equals full's) at the base
            rung and at every rung but the last, over :data:`ROUTING_FEATURES`.
        thresholds: Climb from the current rung when its probability is below this.
    """

    rungs: tuple[float, ...]
    models: tuple[FittedModel, ...]
    thresholds: tuple[float, ...]

    def __post_init__(self) -> None:
        assert self.rungs, "a ladder needs a rung"
        assert list(self.rungs) == sorted(set(self.rungs)), "rungs must ascend"
        assert 0.0 < self.rungs[0] and self.rungs[-1] <= 1.0, "rung ratios in (0, 1]"
        assert len(self.models) == len(self.thresholds) == len(self.rungs), "one per decision"

    @classmethod
    def fixed(cls, rungs: tuple[float, ...], climb: bool) -> RoutingLadder:
        """A ladder that climbs every rung, or none (calibration reads each rung's signals)."""
        width = len(ROUTING_FEATURES)
        half = FittedModel(ROUTING_FEATURES, (0.0,) * width, (1.0,) * width, (0.0,) * width, 0.0)
        return cls(rungs, (half,) * len(rungs), (1.0 if climb else 0.0,) * len(rungs))


@dataclass(frozen=True)
class RungTrace:
    """One rung a fused prefill stood on.

    Attributes:
        ratio: The rung's ratio (the base ratio first).
        features: :data:`ROUTING_FEATURES` at the rung, in order.
        probability: The model's P(agreement with full) there; None on the top rung.
        climbed: Whether the prefill went on to the next rung.
    """

    ratio: float
    features: tuple[float, ...]
    probability: float | None
    climbed: bool


def uncertainty_trace(entropy: float, base: float, raised: float | None) -> tuple[RungTrace, ...]:
    """What uncertainty routing did, as rungs: the base one, then ``raised`` when it routed up.

    Only the entropy over the reused KV is measured (the other features are NaN) and no
    agreement probability is computed.
    """
    features = tuple(entropy if name == "entropy_reused" else math.nan for name in ROUTING_FEATURES)
    first = RungTrace(base, features, None, raised is not None)
    return (first,) if raised is None else (first, RungTrace(raised, features, None, False))


def routing_features(
    logits: torch.Tensor,
    reused_logits: torch.Tensor,
    score_mass: torch.Tensor,
    chosen: torch.Tensor,
    num_tokens: int,
) -> tuple[float, ...]:
    """:data:`ROUTING_FEATURES` of one rung.

    Args:
        logits: [vocab] the rung's next-token logits.
        reused_logits: [vocab] the query pass's logits over the reused KV.
        score_mass: [n_candidates] non-negative score mass of each candidate.
        chosen: [n_candidates] bool, the candidates recomputed so far.
        num_tokens: Prompt length.
    """
    log_p = torch.log_softmax(logits.float(), dim=-1)
    log_q = torch.log_softmax(reused_logits.float(), dim=-1)
    p = log_p.exp()
    top2 = p.topk(2).values
    total = float(score_mass.sum())
    missed = float(score_mass[~chosen].sum()) / total if total > 0 else 0.0
    return (
        float(-(p * log_p).sum()),
        float(top2[0] - top2[1]),
        float(-(log_q.exp() * log_q).sum()),
        float((p * (log_p - log_q)).sum()),
        float(int(logits.argmax()) != int(reused_logits.argmax())),
        missed,
        math.log(max(num_tokens, 1)),
    )


def score_mass(scores: torch.Tensor, learned: bool) -> torch.Tensor:
    """[n] non-negative mass of rule scores: probabilities of logits, else the clamped scores."""
    scores = scores.float().cpu()
    return torch.sigmoid(scores) if learned else scores.clamp(min=0.0)
