"""Fidelity rows as the tables and the other benchmarks read them: by model, data set, question."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from adarag.config import DEFAULT_MODEL
from adarag.engine.provision import DEFAULT_PACKAGED_MODEL, PACKAGED_MODELS
from adarag.evaluation.fidelity import FidelityRow, read_rows


def model_name(model: str) -> str:
    """The checkpoint's directory name, without loading it (the report needs no model)."""
    name = DEFAULT_PACKAGED_MODEL if model == DEFAULT_MODEL else model
    packaged = PACKAGED_MODELS.get(name)
    return packaged.directory if packaged is not None else Path(name).name


def rows_under(folder: Path) -> list[FidelityRow]:
    """Every row of every data set under ``folder``."""
    return [row for path in sorted(folder.glob("*.rows.jsonl")) for row in read_rows(path)]


def common_questions(rows: list[FidelityRow], rules: list[str]) -> list[FidelityRow]:
    """The rows of the questions every rule in ``rules`` was measured on (paired tables)."""
    keys = [{(r.dataset, r.qid) for r in rows if r.rule == rule} for rule in rules]
    shared = set.intersection(*keys) if keys else set()
    return [r for r in rows if (r.dataset, r.qid) in shared]


def by_dataset(rows: list[FidelityRow]) -> Iterator[tuple[str, list[FidelityRow]]]:
    """Each data set's rows, in order of appearance, then all of them as ``pooled``."""
    for dataset in dict.fromkeys(row.dataset for row in rows):
        yield dataset, [r for r in rows if r.dataset == dataset]
    yield "pooled", rows
