"""``adarag calibrate --selector``: label, fit the selector, climb the chains, fit the ladder.

1. **Labels** (:mod:`.selector_labels`): every calibration question's candidates, their run-time
   features and the output-aware oracle's set; one file per question, so runs resume and shard.
2. **Selector** (:mod:`.selector_fit`): fitted on every question; judged on held-out folds (one
   data set held out at a time when there are several, else four folds of questions) against
   ``query_deviation`` by how much of the oracle's set and first-order gain it finds.
3. **Chains** (:mod:`.ladder_fit`): each question climbed from the base ratio through the
   chain's rungs with the selector of the folds it is not in (cross-fitting), each rung's answer
   compared with full recomputation's.
4. **Ladder**: for each candidate shape, one agreement model per decision and the cheapest
   thresholds per target agreement on cross-fitted probabilities; the shape with the lowest cost
   at the reference target is kept.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adarag.evaluation.profiling.fitting import fold_names
from adarag.evaluation.profiling.ladder_fit import (
    CHAIN_RUNGS,
    TARGETS,
    Chain,
    LadderShape,
    fit_ladder,
    load_chains,
    record_chain,
    save_chains,
)
from adarag.evaluation.profiling.selector_fit import (
    feature_scores,
    fit_selector,
    num_layers_of,
    scorer_scores,
    selection_quality,
    selector_features,
)
from adarag.evaluation.profiling.selector_labels import (
    SelectorRecord,
    load_records,
    packet_folder,
    record_labels,
)
from adarag.evaluation.workload import BenchQuestion
from adarag.fitted import FittedModel
from adarag.pipeline import AdaRAG
from adarag.profiles.learned import LadderCalibration
from adarag.schema import GenerationParams

logger = logging.getLogger(__name__)

SHAPES = ((1.0,), (0.4, 1.0))
"""Candidate ladders above the base ratio (rungs of the chains)."""
REFERENCE_TARGET = 0.85
"""The target agreement whose cost chooses the ladder's shape."""
MIN_QUESTIONS = 30
"""Fewer calibration questions than this give a warning: the ladder's thresholds are noisy."""


@dataclass(frozen=True)
class FoldQuality:
    """The selector fitted without one fold, judged on it (means over its questions).

    Attributes:
        fold: The held-out data set (or fold number).
        num_questions: Its questions.
        recall: Share of the oracle's set the fitted selector chooses at the same budget.
        baseline_recall: The same for ``query_deviation``.
        gain_share: Share of the oracle set's first-order gain the selector's set carries.
        baseline_gain_share: The same for ``query_deviation``.
    """

    fold: str
    num_questions: int
    recall: float
    baseline_recall: float
    gain_share: float
    baseline_gain_share: float


@dataclass(frozen=True)
class SelectorCalibration:
    """What ``adarag calibrate --selector`` fitted and how it did on held-out folds."""

    selector: FittedModel
    folds: tuple[FoldQuality, ...]
    ladder: LadderCalibration | None
    shape_costs: tuple[tuple[str, float, float], ...]
    num_questions: int
    ratio: float


def fold_selectors(
    records: Sequence[SelectorRecord], folds: Sequence[str], ratio: float, kind: str
) -> dict[str, FittedModel]:
    """Per fold, the selector fitted on the other folds."""
    features = selector_features(num_layers_of(records[0]))
    return {
        fold: fit_selector(
            [r for r, f in zip(records, folds, strict=True) if f != fold], features, ratio, kind
        )
        for fold in dict.fromkeys(folds)
    }


def fold_quality(
    records: Sequence[SelectorRecord],
    folds: Sequence[str],
    selectors: dict[str, FittedModel],
    ratio: float,
) -> tuple[FoldQuality, ...]:
    """Each fold's selector judged on its own fold, against ``query_deviation``."""
    out = []
    for fold, model in selectors.items():
        held = [r for r, f in zip(records, folds, strict=True) if f == fold]
        learned = [selection_quality(r, scorer_scores(model, r), ratio) for r in held]
        base = [selection_quality(r, feature_scores("log_query_deviation", r), ratio) for r in held]
        out.append(
            FoldQuality(
                fold,
                len(held),
                statistics.fmean(q.recall for q in learned),
                statistics.fmean(q.recall for q in base),
                float(np.nanmean([q.gain_share for q in learned])),
                float(np.nanmean([q.gain_share for q in base])),
            )
        )
    return tuple(out)


def calibrate_selector(
    rag: AdaRAG,
    questions: Sequence[tuple[str, BenchQuestion]],
    records_dir: Path,
    params: GenerationParams,
    *,
    shard: tuple[int, int] = (0, 1),
    ratio: float = 0.2,
    kind: str = "logistic",
    targets: Sequence[float] = TARGETS,
    ladder: bool = True,
) -> SelectorCalibration | None:
    """Label, fit and climb; None when this shard's part is recorded but others are missing.

    Args:
        rag: The pipeline whose model is calibrated (its independent tier's ratio is the
            ladder's base).
        questions: Calibration questions with their data sets.
        records_dir: Where labels and chains are kept (reused by later runs; with a packet,
            in its folder there, :func:`~.selector_labels.packet_folder`).
        params: Decoding options of every answer compared.
        shard: ``(i, n)``: this run labels and climbs every n-th question from the i-th.
        ratio: The ratio whose oracle set the selector learns.
        kind: ``"logistic"`` or ``"mlp"``.
        targets: Target agreements the ladder's thresholds are fitted for.
        ladder: Also climb the chains and fit the routing ladder.
    """
    started = time.perf_counter()
    records_dir = packet_folder(records_dir, rag)
    record_labels(rag, questions, records_dir, params, shard)
    wanted = {(dataset, item.qid) for dataset, item in questions}
    records = [
        r
        for r in load_records(records_dir, {d for d, _ in questions})
        if (r.dataset, r.qid) in wanted
    ]
    if len(records) < len(wanted):
        logger.info("%d of %d questions labelled; fit once all are", len(records), len(wanted))
        return None
    logger.info("labels ready in %.0f s", time.perf_counter() - started)
    folds = fold_names([record.dataset for record in records])
    selectors = fold_selectors(records, folds, ratio, kind)
    quality = fold_quality(records, folds, selectors, ratio)
    selector = fit_selector(records, selector_features(num_layers_of(records[0])), ratio, kind)
    fitted_ladder: LadderCalibration | None = None
    shape_costs: tuple[tuple[str, float, float], ...] = ()
    if ladder:
        keys = [(r.dataset, r.qid) for r in records]
        chains = climb_chains(
            rag,
            questions,
            dict(zip(keys, (selectors[fold] for fold in folds), strict=True)),
            {key: record.reference for key, record in zip(keys, records, strict=True)},
            _chains_path(rag, records_dir, "chains"),
            params,
            shard,
        )
        if chains is None:
            return None
        fitted_ladder, shape_costs = choose_ladder(chains, folds, rag, targets)
    return SelectorCalibration(selector, quality, fitted_ladder, shape_costs, len(records), ratio)


def calibrate_ladder(
    rag: AdaRAG,
    questions: Sequence[tuple[str, BenchQuestion]],
    selector: FittedModel,
    records_dir: Path,
    params: GenerationParams,
    *,
    shard: tuple[int, int] = (0, 1),
    targets: Sequence[float] = TARGETS,
) -> tuple[LadderCalibration, tuple[tuple[str, float, float], ...]] | None:
    """Climb the questions with an already fitted ``selector`` and fit the ladder alone.

    No oracle labels (the costly part of :func:`calibrate_selector`): each question's reference
    answer comes from a full prefill. The questions must be ones ``selector`` was not fitted on,
    or its rungs agree more often than at run time and the thresholds climb too seldom. None
    while other shards' questions are missing.
    """
    keys = [(dataset, item.qid) for dataset, item in questions]
    path = _chains_path(rag, packet_folder(records_dir, rag), "profile-chains")
    chains = climb_chains(
        rag, questions, dict.fromkeys(keys, selector), dict.fromkeys(keys), path, params, shard
    )
    if chains is None:
        return None
    return choose_ladder(chains, fold_names([chain.dataset for chain in chains]), rag, targets)


def _chains_path(rag: AdaRAG, records_dir: Path, stem: str) -> Path:
    return records_dir / f"{stem}-base{rag.config.cache.independent.recompute_ratio:g}.jsonl"


def climb_chains(
    rag: AdaRAG,
    questions: Sequence[tuple[str, BenchQuestion]],
    scorers: dict[tuple[str, str], FittedModel],
    references: dict[tuple[str, str], str | None],
    path: Path,
    params: GenerationParams,
    shard: tuple[int, int],
) -> list[Chain] | None:
    """The chain of every question in ``scorers``, in its order; None while shards are missing.

    Args:
        rag: The pipeline climbed (its independent tier's ratio is the chains' base).
        questions: The questions with their data sets (only those in ``scorers`` are climbed).
        scorers: Per (data set, question id), the selector its rungs recompute with.
        references: Full recomputation's answer, where known (else a full prefill decodes it).
        path: The chains' file (appended to question by question, so runs resume).
        params: Decoding options of every rung's answer.
        shard: ``(i, n)``: this run climbs every n-th question from the i-th.
    """
    base = rag.config.cache.independent.recompute_ratio
    done = {(chain.dataset, chain.qid) for chain in load_chains(path)}
    index, count = shard
    for number, (dataset, item) in enumerate(questions):
        key = (dataset, item.qid)
        if number % count != index or key in done or key not in scorers:
            continue
        rungs = tuple(r for r in CHAIN_RUNGS if r > base)
        chain = record_chain(rag, dataset, item, references[key], params, base, rungs, scorers[key])
        save_chains(path, [chain])
        logger.info("climbed %s %s (%d/%d)", dataset, item.qid, number + 1, len(questions))
    unique = {(c.dataset, c.qid): c for c in load_chains(path) if (c.dataset, c.qid) in scorers}
    if len(unique) < len(scorers):
        return None
    return [unique[key] for key in scorers]


def choose_ladder(
    chains: Sequence[Chain], folds: Sequence[str], rag: AdaRAG, targets: Sequence[float]
) -> tuple[LadderCalibration, tuple[tuple[str, float, float], ...]]:
    """The shape cheapest at :data:`REFERENCE_TARGET` (held-out agreement, cost per shape)."""
    base = rag.config.cache.independent.recompute_ratio
    fold_ids = {name: idx for idx, name in enumerate(dict.fromkeys(folds))}
    fold_of = [fold_ids[f] for f in folds]
    available = {rung.ratio for rung in chains[0].rungs}
    best: LadderCalibration | None = None
    costs = []
    for rungs in SHAPES:
        if not set(rungs) <= available or min(rungs) <= base:
            continue
        fitted = fit_ladder(chains, LadderShape(base, rungs), fold_of, targets)
        agreement, cost = fitted.held_out[_reference_index(fitted.targets)]
        costs.append((str(LadderShape(base, rungs)), agreement, cost))
        if best is None or cost < best.held_out[_reference_index(best.targets)][1]:
            best = fitted
    assert best is not None, "no ladder shape fits the chains' rungs"
    return best, tuple(costs)


def _reference_index(targets: Sequence[float]) -> int:
    return min(range(len(targets)), key=lambda idx: abs(targets[idx] - REFERENCE_TARGET))
