"""Which questions ``adarag calibrate`` fits on: the bundled ones, benchmark sets, or own files."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

from adarag.data import calibration_questions
from adarag.errors import InputError
from adarag.evaluation.workload import FIDELITY_CHUNKS, BenchQuestion, load_questions
from adarag.retrievers import MemoryRetriever
from adarag.retrievers.chunking import passage_text
from adarag.schema import Chunk

QUESTION_FIELDS = frozenset({"question", "answers", "passages"})


def read_question_files(
    files: list[Path], offset: int, count: int, num_chunks: int
) -> list[tuple[str, BenchQuestion]]:
    """Each file's questions ``offset..offset+count``, with the top-k of their own passages.

    The chunks are the ``num_chunks`` passages BM25 ranks first for the question; a question
    with fewer passages is skipped. The data set of a question is its file's stem, its id the
    row's ``id`` (else ``<stem>-<row number>``).

    Raises:
        InputError: A file is missing, is not JSONL, or a row lacks a field.
    """
    questions = []
    for path in files:
        for number, line in _lines(path, offset, count):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"{path}:{number + 1}: not a JSON row ({err.msg})") from err
            missing = QUESTION_FIELDS - set(row if isinstance(row, dict) else ())
            if missing:
                raise InputError(
                    f"{path}:{number + 1}: a row lacks {sorted(missing)}; calibration needs rows "
                    "of {question, answers, passages} (musique_dev.jsonl and hotpotqa_dev.jsonl "
                    "have them; 2wikimqa_dev.jsonl has no passages)"
                )
            try:
                passages = [Chunk(passage_text(p["text"], p.get("title"))) for p in row["passages"]]
            except (KeyError, TypeError, AttributeError) as err:
                raise InputError(
                    f"{path}:{number + 1}: its passages must be objects with a text (and a title)"
                ) from err
            top = MemoryRetriever(passages).retrieve(row["question"], num_chunks)
            if len(top) < num_chunks:
                continue
            qid = str(row.get("id") or f"{path.stem}-{number}")
            item = BenchQuestion(
                qid, row["question"], tuple(row["answers"]), tuple(c.text for c in top)
            )
            questions.append((path.stem, item))
    return questions


def _lines(path: Path, offset: int, count: int) -> Iterator[tuple[int, str]]:
    """Lines ``offset..offset+count`` of ``path`` with their numbers, read no further.

    Raises:
        InputError: The file cannot be read.
    """
    try:
        with path.open() as handle:
            yield from enumerate(islice(handle, offset, offset + count), start=offset)
    except OSError as err:
        raise InputError(f"{path}: cannot read it ({err.strerror}); pass a JSONL file") from err


def questions_for(args: argparse.Namespace) -> list[tuple[str, BenchQuestion]]:
    """The questions of ``--selector``, ``--depth`` and ``--packet``, one set after another.

    ``--data`` files, else ``--dataset`` sets from ``--data-dir``, else the bundled ones.

    Raises:
        InputError: Both ``--data`` and ``--dataset``, or a file missing or malformed.
    """
    if args.data and args.dataset:
        raise InputError("pass either --data (your own files) or --dataset (benchmark sets)")
    if args.data:
        return _interleaved(
            read_question_files(args.data, args.offset, args.questions or 30, args.chunks)
        )
    if not args.dataset:
        return _interleaved(_bundled(args.questions))
    found = []
    for dataset in args.dataset:
        try:
            items = load_questions(
                dataset, args.data_dir, args.questions or 30, FIDELITY_CHUNKS[dataset], args.offset
            )
        except FileNotFoundError as err:
            raise InputError(
                f"{err.filename}: no such data file; pass --data-dir with the QA data sets' dev "
                "files (musique_dev.jsonl, hotpotqa_dev.jsonl, 2wikimqa_dev.jsonl and "
                "2wikimqa_corpus.jsonl)"
            ) from err
        found += [(dataset, item) for item in items]
    return _interleaved(found)


def _bundled(limit: int | None) -> list[tuple[str, BenchQuestion]]:
    """The bundled calibration questions, at most ``limit`` per data set."""
    counts: dict[str, int] = {}
    out = []
    for row in calibration_questions():
        dataset = str(row["dataset"])
        counts[dataset] = counts.get(dataset, 0) + 1
        if limit is not None and counts[dataset] > limit:
            continue
        item = BenchQuestion(
            str(row["qid"]),
            str(row["question"]),
            tuple(row["answers"]),  # type: ignore[arg-type]
            tuple(row["chunks"]),  # type: ignore[arg-type]
        )
        out.append((dataset, item))
    return out


def _interleaved(
    questions: list[tuple[str, BenchQuestion]],
) -> list[tuple[str, BenchQuestion]]:
    """One question of each data set in turn, so that a partial run covers them all."""
    by_set: dict[str, list[tuple[str, BenchQuestion]]] = {}
    for pair in questions:
        by_set.setdefault(pair[0], []).append(pair)
    groups = list(by_set.values())
    longest = max((len(group) for group in groups), default=0)
    return [group[idx] for idx in range(longest) for group in groups if idx < len(group)]
