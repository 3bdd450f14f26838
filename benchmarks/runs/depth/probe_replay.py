"""The packaged depth probe replayed on the recorded questions: its stop rule and AUROC row."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import adarag.profiles
from adarag.augment.probe import SIGNALS
from adarag.evaluation.depth import Rule, auroc, stops_at
from adarag.evaluation.profiling.depth_probe import (
    DepthRecord,
    first_confident,
    load_depth_records,
    step_probabilities,
)
from adarag.profiles import ModelProfile
from adarag.profiles.learned import DepthProbe

PACKAGED_PROFILES = Path(adarag.profiles.__file__).parent


@functools.cache
def packaged_probe(model: str) -> DepthProbe | None:
    """The depth probe of the model's packaged profile, if any."""
    path = PACKAGED_PROFILES / f"{model}.json"
    if not path.exists():
        return None
    return ModelProfile.from_json(path.read_text(), str(path)).depth_probe


def probed(
    model: str, dataset: str, qids: Sequence[str], records: Path
) -> tuple[DepthProbe, list[DepthRecord]] | None:
    """The model's packaged depth probe and its records of ``qids``, if it has both."""
    probe = packaged_probe(model)
    found = {r.qid: r for r in load_depth_records(records / model, [dataset])} if probe else {}
    if probe is None or not set(qids) <= set(found):
        return None
    return probe, [found[qid] for qid in qids]


def probe_rule(probe: DepthProbe, records: Sequence[DepthRecord]) -> Rule:
    """The ``probe`` stop rule replayed on ``records``."""
    stops = {
        r.qid: first_confident(step_probabilities(probe.model, r), probe.threshold, probe.min_steps)
        for r in records
    }
    name = f"depth probe P ≥ {probe.threshold:.2f} from {probe.min_steps} (`calibrate --depth`)"
    return stops_at(stops, probe.min_steps, name)


def feature_row(dataset: str, probe: DepthProbe, records: Sequence[DepthRecord]) -> str:
    """AUROC of the probe and of each of its signals for its label, over every step."""
    labels = np.concatenate([r.labels() for r in records])
    scores = [np.concatenate([step_probabilities(probe.model, r) for r in records])]
    scores += [np.concatenate([r.signals[:, i] for r in records]) for i in range(len(SIGNALS))]
    values = [auroc(list(map(float, x)), list(labels > 0.5)) for x in scores]
    cells = " | ".join("-" if value is None else f"{value:.2f}" for value in values)
    return f"| {dataset} | {len(labels)} | {100 * labels.mean():.0f}% | {cells} |"
