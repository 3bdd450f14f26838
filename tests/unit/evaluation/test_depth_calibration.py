"""The depth probe's fit: labels, replays against fixed top-k, and where it stops."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from adarag.augment.probe import SIGNALS
from adarag.evaluation.profiling.depth_calibration import calibrate_probe, outcome
from adarag.evaluation.profiling.depth_probe import (
    DepthRecord,
    first_confident,
    fit_probe,
    is_informative,
    load_depth_records,
    save_depth_record,
)


def _record(idx: int, dataset: str, best: int, depth: int = 6) -> DepthRecord:
    """A question answered right from ``best`` chunks on; the residual stream says so."""
    f1 = np.array([1.0 if k + 1 >= best else 0.0 for k in range(depth)])
    if idx % 3 == 0:  # some answers get worse again deeper down
        f1[-1] = 0.0
    hidden = torch.tensor([[float(f), float(k)] for k, f in enumerate(f1)], dtype=torch.float16)
    signals = np.zeros((depth, len(SIGNALS)))
    return DepthRecord(
        dataset,
        f"{dataset}-{idx}",
        (1,),
        hidden,
        signals,
        f1,
        tuple(f"answer {k}" for k in range(depth)),
        tuple(100 * (k + 1) for k in range(depth)),
    )


def _records() -> list[DepthRecord]:
    rng = np.random.default_rng(0)
    return [_record(i, ("a", "b")[i % 2], int(rng.integers(1, 5))) for i in range(40)]


def test_labels_mark_the_steps_no_later_step_beats():
    record = _record(0, "a", best=2)  # F1 0, 1, 1, 1, 1, 0
    assert record.labels().tolist() == [0, 1, 1, 1, 1, 1]
    assert record.rows(("hidden_0", "hidden_1")).shape == (6, 2)


def test_first_confident_respects_the_floor_and_falls_back_to_the_last_step():
    probabilities = np.array([0.9, 0.2, 0.8, 0.1])
    assert first_confident(probabilities, 0.85) == 1
    assert first_confident(probabilities, 0.5, floor=2) == 3
    assert first_confident(probabilities, 0.95) == 4


def test_a_probe_that_can_see_the_answer_beats_fixed_top_k():
    records = _records()
    result = calibrate_probe(records, family="hidden", penalties=(1e-3, 1.0))
    assert dict(result.family_auroc)["hidden"] > 0.9
    assert result.chosen.gain > 0 and result.oracle.gain >= result.chosen.gain - 1e-9
    assert {fold for fold, _, _ in result.per_fold} == {"a", "b"}
    assert result.probe.layers == (1,) and 0 < result.probe.threshold < 1
    assert result.penalty in (1e-3, 1.0)
    # answering at each question's oracle depth beats the fixed depth with its tokens
    fixed_three = outcome(records, [3] * len(records))
    assert abs(fixed_three.gain) < 1e-9


def test_questions_answered_alike_at_every_depth_do_not_shape_the_probe():
    records = _records()
    flat = [
        replace(r, qid=f"flat-{i}", f1=np.zeros_like(r.f1), hidden=-r.hidden)
        for i, r in enumerate(records)
    ]
    features = ("hidden_0", "hidden_1")
    alone = fit_probe(records, features)
    assert not is_informative(flat[0]) and is_informative(records[1])
    assert fit_probe(records + flat, features) == alone
    assert fit_probe(flat, features) != alone  # nothing informative: it learns from them all


def test_records_round_trip(tmp_path):
    record = _record(1, "a", best=3)
    save_depth_record(tmp_path, record)
    (loaded,) = load_depth_records(tmp_path)
    assert loaded.qid == record.qid and torch.equal(loaded.hidden, record.hidden)
    np.testing.assert_array_equal(loaded.f1, record.f1)
    assert load_depth_records(tmp_path, ["b"]) == []
