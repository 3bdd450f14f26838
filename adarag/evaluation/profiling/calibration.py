"""Collecting calibration records: every augmentation step of validation questions, scored."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from adarag.augment.agreement import StepEvidence
from adarag.augment.calibrate import QuestionRecord, StepRecord
from adarag.augment.confidence import LensConfidence, LensSignals
from adarag.augment.step_cost import StepCostModel
from adarag.engine.prefill_request import PrefillRequest
from adarag.errors import InputError
from adarag.evaluation.metrics import best_f1, exact_match, token_f1
from adarag.pipeline import AdaRAG
from adarag.pipeline.answer_stream import answer_text
from adarag.schema import GenerationParams, PromptLayout, StepTrace

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ValidationQuestion:
    """A question, its retrieved chunks (in order) and its gold answers."""

    question: str
    chunks: tuple[str, ...]
    answers: tuple[str, ...]


@dataclass(frozen=True)
class RecordedQuestion:
    """Calibration record of one question with the answers behind its qualities."""

    record: QuestionRecord
    step_answers: tuple[str, ...]
    reference_answer: str
    gold_f1: tuple[float, ...]
    margins: tuple[float | None, ...] = ()
    stable: tuple[bool, ...] = ()
    step_seconds: tuple[float, ...] = ()
    """Wall time of each step's prefill and lens check (for the cost model)."""


def load_records(path: Path) -> list[RecordedQuestion]:
    """The recorded questions ``adarag calibrate`` saved (``*.calibration-records.json``).

    Raises:
        InputError: The file is missing or is not such a record list.
    """
    try:
        rows = json.loads(path.read_text())
        return [
            RecordedQuestion(
                QuestionRecord(
                    tuple(
                        StepRecord(
                            LensSignals(tuple(step["signals"]["kl"]), step["signals"]["entropy"]),
                            step["num_processed_tokens"],
                            step["quality"],
                        )
                        for step in row["record"]["steps"]
                    ),
                    row["record"]["num_static_tokens"],
                ),
                tuple(row["step_answers"]),
                row["reference_answer"],
                tuple(row["gold_f1"]),
                tuple(row["margins"]),
                tuple(row["stable"]),
                tuple(row.get("step_seconds", ())),
            )
            for row in rows
        ]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(
            f"{path}: not calibration records ({type(err).__name__}: {err}); pass the "
            "*.calibration-records.json file an earlier `adarag calibrate` wrote"
        ) from err


def record_questions(
    rag: AdaRAG, questions: Iterable[ValidationQuestion], params: GenerationParams
) -> list[RecordedQuestion]:
    """Run every step of each question; quality = token F1 with the full-recomputation answer.

    The reference answer is decoded from all chunks with full recomputation (no cache), the
    quality the design asks to judge first; gold F1 per step is kept for reporting. Each
    question's chunks are warmed first (as ingest does), so every step sees the KV a production
    query would.
    """
    recorded = []
    engine = rag.engine
    for item in questions:
        rag.warm(item.chunks)
        layout = rag.layout(item.question, item.chunks, params)
        full = engine.prefill(PrefillRequest(layout, max_new_tokens=params.max_new_tokens))
        tokens = engine.decode_tokens(layout, full, params)
        reference = answer_text(tokens, engine.tokenizer, params)
        steps = answer_each_step(rag, layout, params)
        recorded.append(_record(steps, reference, item.answers, layout.num_tokens))
        logger.info("recorded %d steps of %r", len(steps), item.question[:50])
    return recorded


def answer_each_step(
    rag: AdaRAG, layout: PromptLayout, params: GenerationParams
) -> list[tuple[StepTrace, str]]:
    """Every augmentation step of ``layout`` (no early stop) and the answer decoded from each.

    Step ``k`` is what :meth:`AdaRAG.query` would decode from if it stopped there (same tiers,
    same reuse of steps ``1..k-1``).
    """
    return [(trace, answer) for trace, answer, _ in rag.augmentation.each_step(layout, params)]


def _record(
    steps: Sequence[tuple[StepTrace, str]],
    reference: str,
    gold: Sequence[str],
    num_static_tokens: int,
) -> RecordedQuestion:
    records = []
    for trace, answer in steps:
        assert trace.mean_kl is not None and trace.entropy is not None
        records.append(
            StepRecord(
                LensSignals((trace.mean_kl,), trace.entropy),
                trace.num_processed_tokens,
                token_f1(answer, reference),
            )
        )
    return RecordedQuestion(
        QuestionRecord(tuple(records), num_static_tokens),
        tuple(answer for _, answer in steps),
        reference,
        tuple(best_f1(answer, gold) for _, answer in steps),
        tuple(trace.margin for trace, _ in steps),
        tuple(bool(trace.is_stable) for trace, _ in steps),
        tuple(trace.prefill_s + trace.confidence_s for trace, _ in steps),
    )


def step_cost_model(recorded: Sequence[RecordedQuestion]) -> StepCostModel:
    """Fixed and per-token seconds of a step, fitted on the timed steps (tokens only without)."""
    timed = [
        (step.num_processed_tokens, seconds)
        for item in recorded
        for step, seconds in zip(item.record.steps, item.step_seconds, strict=False)
    ]
    if len(timed) < 2:
        return StepCostModel.tokens_only()
    tokens, seconds = zip(*timed, strict=True)
    return StepCostModel.fit(tokens, seconds)


def agreement_evidence(
    recorded: Sequence[RecordedQuestion], estimator: LensConfidence, costs: StepCostModel
) -> list[list[StepEvidence]]:
    """Each question's steps as agreement evidence: does the step answer as static top-k does?

    The static top-k answer is the last step's (all k chunks, the same reuse); a step's cost is
    its predicted time over that of one prefill of the whole static prompt.
    """
    questions = []
    for item in recorded:
        static = item.step_answers[-1]
        questions.append(
            [
                StepEvidence(
                    estimator(step.signals).value,
                    margin,
                    stable,
                    bool(exact_match(answer, static)),
                    costs.share(step.num_processed_tokens, item.record.num_static_tokens),
                )
                for step, answer, margin, stable in zip(
                    item.record.steps, item.step_answers, item.margins, item.stable, strict=True
                )
            ]
        )
    return questions
