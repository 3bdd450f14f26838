"""``adarag calibrate --depth --gain-records DIR``: the ``gain`` stop rule's τ and order.

The records are the calibration questions' gain records, one JSON line per question as
``python benchmarks/depth.py gain --split calibration`` writes them, one file per data set. Every
(order, τ) of :data:`~adarag.evaluation.gain_depth.THRESHOLDS` in both orders is replayed over
them, and the one whose F1 is furthest above fixed top-k at the same mean prompt tokens is kept
in the model's profile (``ModelProfile.gain``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adarag.augment.gain import DEFAULT_TOP_K, GainOrder
from adarag.cli.calibrate_learned import profile_path, run_depth, write_profile
from adarag.config import AdaRagConfig
from adarag.errors import InputError
from adarag.evaluation.depth import fixed_at_tokens
from adarag.evaluation.gain_depth import (
    THRESHOLDS,
    GainQuestion,
    SetOutcome,
    choose,
    fixed,
    gain_family,
    prefill_price,
)
from adarag.pipeline import AdaRAG
from adarag.profiles.gain import GainCalibration

MIN_QUESTIONS = 30
"""Fewer calibration questions than this give a warning: the chosen τ is then noisy."""

MIN_TIMED_PREFILLS = 3
"""Timed prefills the quadratic TTFT fit needs (:func:`prefill_price`)."""


def add_gain_arguments(parser: argparse.ArgumentParser) -> None:
    """The option only ``--depth --gain-records`` reads."""
    group = parser.add_argument_group("--depth --gain-records")
    group.add_argument(
        "--gain-records",
        type=Path,
        help="--depth: fit the gain stop rule's τ and order (augment.stop_rule='gain') on the "
        "*.jsonl gain records of calibration questions in this directory (`python "
        "benchmarks/depth.py gain --split calibration` writes them); without --records only "
        "the gain rule is fitted",
    )


@dataclass(frozen=True)
class GainFit:
    """The chosen rule on the calibration questions, as stored and as it answered.

    Attributes:
        calibration: What the profile keeps.
        mean_f1: Its mean gold F1, in points.
        mean_tokens: Its mean prompt tokens.
        mean_chunks: Its mean kept chunks.
    """

    calibration: GainCalibration
    mean_f1: float
    mean_tokens: float
    mean_chunks: float


def load_gain_questions(directory: Path) -> tuple[list[GainQuestion], tuple[str, ...]]:
    """Every recorded question of the ``*.jsonl`` files in ``directory``, and their data sets.

    Raises:
        InputError: The directory holds no record, or a line is not a gain record.
    """
    files = sorted(directory.glob("*.jsonl")) if directory.is_dir() else []
    questions: list[GainQuestion] = []
    datasets = []
    for path in files:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        for number, line in enumerate(lines, 1):
            try:
                questions.append(GainQuestion.from_record(json.loads(line)))
            except (ValueError, KeyError, TypeError) as err:
                raise InputError(
                    f"{path}:{number} is not a gain record ({err!r}); pass the directory "
                    "`python benchmarks/depth.py gain --split calibration` wrote"
                ) from err
        if lines:
            datasets.append(path.stem)
    if not questions:
        raise InputError(
            f"{directory}: no gain records (*.jsonl, one question a line); record the "
            "calibration questions with `python benchmarks/depth.py gain --split calibration` "
            "and pass the directory it wrote"
        )
    return questions, tuple(datasets)


def fit_gain(questions: Sequence[GainQuestion], datasets: Sequence[str]) -> GainFit:
    """The (order, τ) with the largest F1 over fixed top-k at the same mean prompt tokens."""
    prefill = _price(questions)
    orders: tuple[GainOrder, ...] = ("gain", "retrieval")
    choices = [(order, threshold) for order in orders for threshold in THRESHOLDS]
    family = [rule for order in orders for rule in gain_family(order)]
    assert len(family) == len(choices), "one rule per (order, τ)"
    chosen = choose(family, questions, prefill)
    order, threshold = choices[family.index(chosen)]
    outcome = SetOutcome.of(chosen, questions, prefill)
    max_k = min(q.max_k for q in questions)
    fixed_outcomes = [SetOutcome.of(fixed(k), questions, prefill) for k in range(1, max_k + 1)]
    at_tokens = fixed_at_tokens(fixed_outcomes, outcome.mean_tokens)
    over_fixed = outcome.mean_f1 - float(np.mean(at_tokens))
    calibration = GainCalibration(
        threshold,
        order,
        len(questions),
        tuple(datasets),
        round(over_fixed, 3),
        DEFAULT_TOP_K,  # the records' gains are information_gain's default top-K
    )
    return GainFit(
        calibration, outcome.mean_f1, outcome.mean_tokens, float(np.mean(outcome.chunks))
    )


def _price(questions: Sequence[GainQuestion]) -> Callable[[int], float]:
    """The records' TTFT fit; without enough timed prefills, none (the choice reads no time)."""
    if sum(len(q.static) for q in questions) < MIN_TIMED_PREFILLS:
        return lambda tokens: 0.0
    return prefill_price(questions)


def run_gain(args: argparse.Namespace, config: AdaRagConfig) -> int:
    """Fit the gain rule on ``--gain-records`` and write it into the profile.

    With ``--records`` the depth probe is fitted too (:func:`run_depth`) and both are written.
    """
    questions, datasets = load_gain_questions(args.gain_records)  # before the model loads
    if len(questions) < MIN_QUESTIONS:
        print(
            f"warning: {len(questions)} calibration questions; the gain rule wants at least "
            f"{MIN_QUESTIONS} (its τ is noisy below that)"
        )
    fitted = fit_gain(questions, datasets)
    if args.records is not None:
        status = run_depth(args, config, gain=fitted.calibration)
    else:
        rag = AdaRAG(config)
        write_profile(
            rag.profile.with_learned(gain=fitted.calibration), profile_path(args, rag), rag
        )
        status = 0
    print_gain_report(fitted, args.gain_records)
    return status


def print_gain_report(fitted: GainFit, records: Path) -> None:
    """A readable summary of the chosen rule."""
    calibration = fitted.calibration
    print(
        f"gain rule: keep the chunks whose gain reaches τ={calibration.threshold:g}, listed in "
        f"{calibration.order} order; on {calibration.num_questions} calibration questions "
        f"({', '.join(calibration.datasets)}; records: {records}): gold F1 "
        f"{fitted.mean_f1:.1f} at {fitted.mean_tokens:.0f} prompt tokens "
        f"({fitted.mean_chunks:.2f} chunks), {calibration.f1_over_fixed:+.1f} against fixed "
        "top-k at the same tokens"
    )
    print("turn it on with augment.stop_rule = 'gain'")
