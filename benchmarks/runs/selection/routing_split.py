"""Uncertainty routing's splits: their questions, fidelity rows and entropies; the routed rows."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path

from common import RESULTS, rows_dir

from adarag.evaluation.fidelity import FidelityRow, contains_gold, read_rows, summarize
from adarag.evaluation.metrics import best_exact_match
from adarag.evaluation.workload import FIDELITY_CHUNKS, load_questions

SPLITS = {  # split -> (folder of its fidelity rows, offset, rule of its query_deviation rows)
    "calibration": ("calibration", 0, "qdev"),
    "report": ("", 40, "query_deviation"),
}
QUESTIONS = {"calibration": 8, "report": 40}
SMOLLM2_REPORT_QUESTIONS = 60
GRID = 0.05


def folder(split: str, model: str) -> Path:
    """Where a split's fidelity rows (and entropies) of ``model`` are."""
    return rows_dir(RESULTS / "fidelity") / SPLITS[split][0] / model


def read_entropies(split: str, model: str) -> dict[tuple[str, str], float]:
    """(dataset, qid) -> entropy over the reused KV, for every question measured."""
    found = {}
    for path in sorted(folder(split, model).glob("*.entropy.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                found[(record["dataset"], record["qid"])] = record["entropy"]
    return found


def split_questions(args: argparse.Namespace, split: str, model: str, dataset: str) -> list:
    """The split's questions of ``dataset`` (the fidelity runs' counts and offsets)."""
    count = QUESTIONS[split]
    if split == "report" and "SmolLM2" in model:
        count = SMOLLM2_REPORT_QUESTIONS
    chunks = FIDELITY_CHUNKS[dataset]
    return load_questions(dataset, args.data_dir, count, chunks, SPLITS[split][1])


@dataclass(frozen=True)
class Split:
    """One split's fidelity rows, entropies over the reused KV and gold answers.

    Attributes:
        rows: Every fidelity row of the split (every rule and ratio).
        entropies: (dataset, qid) -> next-token entropy over the reused KV, in nats.
        answers: (dataset, qid) -> the gold answers.
        rule: The name of the split's ``query_deviation`` rows.
    """

    rows: list[FidelityRow]
    entropies: dict[tuple[str, str], float]
    answers: dict[tuple[str, str], list[str]]
    rule: str

    def alone(self, ratio: float) -> list[FidelityRow]:
        """The rule's rows at ``ratio`` on the questions whose entropy was measured."""
        return [
            r
            for r in self.rows
            if r.rule == self.rule and r.ratio == ratio and (r.dataset, r.qid) in self.entropies
        ]

    def routed(self, ratio: float, threshold: float) -> list[FidelityRow]:
        """The routed policy's rows: the rule at ``ratio``, or full recomputation when uncertain."""
        name = routed_name(self.rule, threshold)
        policy = []
        for row in self.alone(ratio):
            key = (row.dataset, row.qid)
            if self.entropies[key] <= threshold:
                policy.append(replace(row, rule=name))
                continue
            golds = self.answers[key]
            policy.append(
                replace(
                    row,
                    rule=name,
                    answer=row.reference,
                    exact_agreement=1.0,
                    f1_agreement=1.0,
                    first_token_agreement=1.0,
                    first_token_kl=0.0,
                    gold_em=best_exact_match(row.reference, golds),
                    gold_f1=row.reference_gold_f1,
                    gold_contains=contains_gold(row.reference, golds),
                    ttft_s=row.full_ttft_s,
                    num_recomputed_tokens=row.num_prompt_tokens,
                )
            )
        return policy

    def threshold(self, ratio: float, target: float) -> float | None:
        """The largest threshold on the grid whose routed rows keep ``target`` % exact agreement."""
        best = None
        for step in range(1, int(max(self.entropies.values(), default=0.0) / GRID) + 2):
            threshold = round(step * GRID, 4)
            found = summarize(self.routed(ratio, threshold), intervals=False)
            if found and found[0].exact_agreement >= target:
                best = threshold
        return best


def routed_name(rule: str, threshold: float) -> str:
    """The name of the routed policy's rows (and of the routed rule decoded for real)."""
    return f"{rule}+routed{threshold:g}"


def load_split(args: argparse.Namespace, split: str, model: str) -> Split:
    rows = [
        row
        for path in sorted(folder(split, model).glob("*.rows.jsonl"))
        for row in read_rows(path)
        if row.dataset in args.dataset
    ]
    answers = {
        (dataset, item.qid): list(item.answers)
        for dataset in args.dataset
        for item in split_questions(args, split, model, dataset)
    }
    return Split(rows, read_entropies(split, model), answers, SPLITS[split][2])
