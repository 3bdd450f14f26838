"""Fitting the routing ladder: each rung's answer and signals on calibration questions.

A *chain* is one calibration question climbed rung by rung (:func:`record_chain`): at every
ratio of the chain the fused prefill's answer is decoded and compared with full recomputation's
(from the question's selector record), and the ladder's signals
(:data:`~adarag.engine.routing.ROUTING_FEATURES`) are kept, with the tokens the rung costs.

A ladder (a base ratio and the rungs above it) is then *replayed* over the chains
(:func:`replay`): each decision reads the rung's signals, and a request climbs while the agreement
model's probability is below the decision's threshold. :func:`fit_ladder` fits one logistic
model per decision and, for each target agreement, the thresholds that reach it at the least
cost on the calibration questions, with the probabilities of each question predicted by models
fitted without its fold (cross-fitting), so the chosen thresholds are not flattered.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from adarag.config import RecomputeConfig
from adarag.engine.prefill_request import LearnedControls, PrefillRequest
from adarag.engine.routing import ROUTING_FEATURES, RoutingLadder
from adarag.evaluation.metrics import exact_match
from adarag.evaluation.profiling.fitting import fit_logistic
from adarag.evaluation.reuse import independent_chunks, reuse_sources
from adarag.evaluation.workload import BenchQuestion
from adarag.fitted import FittedModel
from adarag.pipeline import AdaRAG
from adarag.pipeline.answer_stream import answer_text
from adarag.profiles.learned import LadderCalibration
from adarag.schema import GenerationParams

logger = logging.getLogger(__name__)

CHAIN_RUNGS = (0.4, 1.0)
"""The ratios a chain climbs to above its base ratio (the ladder's shapes choose among them)."""
TARGETS = (0.75, 0.8, 0.85, 0.9, 0.95)
"""Target agreements whose thresholds a fitted ladder carries."""


@dataclass(frozen=True)
class Rung:
    """One ratio of a chain.

    Attributes:
        ratio: The rung's ratio.
        agrees: The answer there equals full recomputation's (normalised).
        features: The ladder's signals there (:data:`ROUTING_FEATURES`).
        answer: The decoded answer.
        num_recomputed: Reused tokens recomputed through every layer, all rungs so far.
    """

    ratio: float
    agrees: bool
    features: tuple[float, ...]
    answer: str
    num_recomputed: int


@dataclass(frozen=True)
class Chain:
    """One calibration question climbed rung by rung."""

    dataset: str
    qid: str
    num_tokens: int
    num_query_tokens: int
    num_reused_tokens: int
    rungs: tuple[Rung, ...]

    def at(self, ratio: float) -> Rung:
        """The rung of ``ratio``."""
        for rung in self.rungs:
            if math.isclose(rung.ratio, ratio):
                return rung
        raise KeyError(f"{self.dataset} {self.qid} has no rung at {ratio}")


def record_chain(
    rag: AdaRAG,
    dataset: str,
    item: BenchQuestion,
    reference: str | None,
    params: GenerationParams,
    base_ratio: float,
    rungs: Sequence[float] = CHAIN_RUNGS,
    scorer: FittedModel | None = None,
) -> Chain:
    """Climb ``item``'s fused prefill from ``base_ratio`` through ``rungs``, decoding each rung.

    The rung of ratio 1.0 equals a full prefill, so its answer is ``reference`` and it is not
    run; without a ``reference`` (no selector record holds it), a full prefill decodes it.
    """
    engine = rag.engine
    layout = rag.layout(item.question, item.chunks, params)
    if reference is None:
        full = engine.prefill(PrefillRequest(layout, max_new_tokens=params.max_new_tokens))
        reference = answer_text(
            engine.decode_tokens(layout, full, params), engine.tokenizer, params
        )
    system_kv, chunk_kvs = independent_chunks(engine, layout)
    sources = reuse_sources(system_kv, chunk_kvs, base_ratio)
    selection = RecomputeConfig(selection_policy="learned")
    below_full = [ratio for ratio in rungs if ratio < 1.0]
    out = []
    for depth in range(len(below_full) + 1):
        climbed = tuple(below_full[:depth])
        output = engine.prefill(
            PrefillRequest(
                layout,
                sources,
                max_new_tokens=params.max_new_tokens,
                selection=selection,
                controls=LearnedControls(
                    token_scorer=scorer,
                    ladder=RoutingLadder.fixed(climbed or (1.0,), climb=bool(climbed)),
                ),
            ),
        )
        trace = output.routing[-1]  # the rung the prefill ended on
        answer = answer_text(engine.decode_tokens(layout, output, params), engine.tokenizer, params)
        out.append(
            Rung(
                ratio=trace.ratio,
                agrees=bool(exact_match(answer, reference)),
                features=trace.features,
                answer=answer,
                num_recomputed=output.num_recomputed_tokens - len(layout.query_ids),
            )
        )
    reused = layout.cu_segments[-2] - layout.cu_segments[1]
    if 1.0 in rungs:
        out.append(Rung(1.0, True, out[-1].features, reference, reused))
    return Chain(dataset, item.qid, layout.num_tokens, len(layout.query_ids), reused, tuple(out))


def save_chains(path: Path, chains: Sequence[Chain]) -> None:
    """Append chains as JSON lines (one question at a time, so a run resumes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        for chain in chains:
            handle.write(json.dumps(asdict(chain)) + "\n")


def load_chains(path: Path) -> list[Chain]:
    """Chains :func:`save_chains` wrote (a partial last line is skipped)."""
    if not path.exists():
        return []
    chains = []
    for line in path.read_text().splitlines():
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            logger.warning("%s: a partial line is skipped (measured again)", path)
            continue
        rungs = tuple(
            Rung(r["ratio"], r["agrees"], tuple(r["features"]), r["answer"], r["num_recomputed"])
            for r in data["rungs"]
        )
        chains.append(
            Chain(
                data["dataset"],
                data["qid"],
                data["num_tokens"],
                data["num_query_tokens"],
                data["num_reused_tokens"],
                rungs,
            )
        )
    return chains


# --- replay and fit


@dataclass(frozen=True)
class LadderShape:
    """A base ratio and the rungs above it (each in the chains)."""

    base: float
    rungs: tuple[float, ...]

    @property
    def decisions(self) -> tuple[float, ...]:
        """The ratios a decision is made at: the base and every rung but the last."""
        return (self.base, *self.rungs[:-1])

    def __str__(self) -> str:
        return " -> ".join(f"{ratio:g}" for ratio in (self.base, *self.rungs))


@dataclass(frozen=True)
class Replay:
    """A ladder replayed over chains: where each question ended and what it cost."""

    agreement: float
    cost: float
    routed_share: float
    final_ratio: tuple[float, ...]


def path_cost(chain: Chain, path: Sequence[float]) -> float:
    """Tokens a request climbing ``path`` runs through every layer, over full prefill's.

    Each rung adds its reused tokens above the previous rung's and the query suffix; a rung of
    1.0 runs every reused token again. The query pass and the check layer's candidates are the
    same on every path and left out.
    """
    total = 0.0
    previous = 0.0
    for ratio in path:
        if ratio >= 1.0:
            total += chain.num_reused_tokens + chain.num_query_tokens
        else:
            total += (ratio - previous) * chain.num_reused_tokens + chain.num_query_tokens
        previous = ratio
    return total / (chain.num_reused_tokens + chain.num_query_tokens)


def replay(
    chains: Sequence[Chain],
    shape: LadderShape,
    probabilities: Sequence[Sequence[float]],
    thresholds: Sequence[float],
) -> Replay:
    """Each chain's climb under ``thresholds`` given each decision's probabilities.

    Args:
        chains: The questions.
        shape: The ladder.
        probabilities: Per chain, P(agreement) at each of ``shape.decisions``.
        thresholds: Per decision, climb below it.
    """
    agree, costs, routed, final = [], [], [], []
    ladder = (shape.base, *shape.rungs)
    for chain, chain_probabilities in zip(chains, probabilities, strict=True):
        stop = len(ladder) - 1
        for idx, (probability, threshold) in enumerate(
            zip(chain_probabilities, thresholds, strict=True)
        ):
            if probability >= threshold:
                stop = idx
                break
        path = ladder[: stop + 1]
        agree.append(chain.at(path[-1]).agrees)
        costs.append(path_cost(chain, path))
        routed.append(stop > 0)
        final.append(path[-1])
    return Replay(
        float(np.mean(agree)), float(np.mean(costs)), float(np.mean(routed)), tuple(final)
    )


def decision_rows(chains: Sequence[Chain], ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """[n, features] signals and [n] agreement of every chain at ``ratio``."""
    rungs = [chain.at(ratio) for chain in chains]
    x = np.array([rung.features for rung in rungs], dtype=np.float64)
    y = np.array([float(rung.agrees) for rung in rungs])
    return x, y


def fit_decisions(chains: Sequence[Chain], shape: LadderShape, l2: float) -> list[FittedModel]:
    """One agreement model per decision of ``shape``."""
    models = []
    for ratio in shape.decisions:
        x, y = decision_rows(chains, ratio)
        models.append(fit_logistic(x, y, ROUTING_FEATURES, l2=l2))
    return models


def cross_fitted_probabilities(
    chains: Sequence[Chain], shape: LadderShape, folds: Sequence[int], l2: float
) -> list[list[float]]:
    """Per chain, each decision's probability from models fitted without the chain's fold."""
    fold_of = np.asarray(folds)
    out: list[list[float]] = [[] for _ in chains]
    for fold in sorted(set(folds)):
        train = [chain for chain, f in zip(chains, fold_of, strict=True) if f != fold]
        models = fit_decisions(train, shape, l2)
        for idx, chain in enumerate(chains):
            if fold_of[idx] != fold:
                continue
            out[idx] = [
                float(model.probabilities(np.array([chain.at(ratio).features]))[0])
                for model, ratio in zip(models, shape.decisions, strict=True)
            ]
    return out


def best_thresholds(
    chains: Sequence[Chain],
    shape: LadderShape,
    probabilities: Sequence[Sequence[float]],
    target: float,
    grid: Sequence[float] = tuple(np.round(np.arange(0.0, 1.0001, 0.025), 3)),
) -> tuple[tuple[float, ...], Replay] | None:
    """The thresholds reaching ``target`` agreement at the least cost (None: none does).

    Every combination of ``grid`` values (one per decision) is replayed at once.
    """
    ladder = (shape.base, *shape.rungs)
    decisions = len(shape.decisions)
    p = np.asarray(probabilities, dtype=np.float64)  # [n, decisions]
    agrees = np.array([[chain.at(r).agrees for r in ladder] for chain in chains], dtype=float)
    costs = np.array(
        [[path_cost(chain, ladder[: i + 1]) for i in range(len(ladder))] for chain in chains]
    )
    combos = np.array(list(itertools.product(grid, repeat=decisions)))  # [m, decisions]
    best: tuple[tuple[float, ...], Replay] | None = None
    rows = np.arange(len(chains))
    for start in range(0, len(combos), 4096):  # bounded memory: [block, n, decisions]
        block = combos[start : start + 4096]
        kept = p[None, :, :] >= block[:, None, :]
        stop = np.where(kept.any(axis=2), kept.argmax(axis=2), decisions)  # [block, n]
        agreement = agrees[rows[None, :], stop].mean(axis=1)
        cost = costs[rows[None, :], stop].mean(axis=1)
        ok = agreement + 1e-9 >= target
        if not ok.any():
            continue
        idx = int(np.flatnonzero(ok)[np.argmin(cost[ok])])
        if best is None or cost[idx] < best[1].cost - 1e-12:
            thresholds = tuple(float(t) for t in block[idx])
            best = (thresholds, replay(chains, shape, probabilities, thresholds))
    return best


def fit_ladder(
    chains: Sequence[Chain],
    shape: LadderShape,
    folds: Sequence[int],
    targets: Sequence[float] = TARGETS,
    l2: float = 0.05,
) -> LadderCalibration:
    """The ladder's models (fitted on every chain) and per target its cheapest thresholds.

    Thresholds are chosen on cross-fitted probabilities; ``held_out`` reports each target's
    agreement and cost there. A target no thresholds reach climbs every request to the top.
    """
    probabilities = cross_fitted_probabilities(chains, shape, folds, l2)
    rows, held_out = [], []
    for target in targets:
        found = best_thresholds(chains, shape, probabilities, target)
        if found is None:
            everything = (1.01,) * len(shape.decisions)
            found = (everything, replay(chains, shape, probabilities, everything))
        thresholds, result = found
        rows.append(thresholds)
        held_out.append((result.agreement, result.cost))
    return LadderCalibration(
        base_ratio=shape.base,
        rungs=shape.rungs,
        models=tuple(fit_decisions(chains, shape, l2)),
        targets=tuple(targets),
        thresholds=tuple(rows),
        held_out=tuple(held_out),
    )
