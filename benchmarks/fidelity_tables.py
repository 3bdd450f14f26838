"""Fidelity tables of benchmarks/RESULTS.md: the lever ablation, the oracles, the report split.

Reads ``results/fidelity[/calibration]/<model>/*.rows.jsonl`` (written by ``fidelity.py``) and
prints markdown: no model runs.

    python benchmarks/fidelity_tables.py
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from common import RESULTS

from adarag.evaluation.fidelity import FidelityRow, paired_rules, read_rows, summarize

MODELS = ("Qwen2.5-Coder-0.5B-Instruct", "SmolLM2-135M-Instruct")
RATIOS = (0.1, 0.2, 0.3)
PAIRS = (  # (lever, the rule it is measured against), on the questions both ran
    ("qdev+fused5", "qdev"),
    ("qdev+fused5in1", "qdev"),
    ("query_deviation+fused5", "query_deviation"),
)


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


def ablation(model: str, rows: list[FidelityRow]) -> str:
    """Exact agreement [95% interval] per rule and ratio, pooled over the common questions."""
    rules = list(dict.fromkeys(row.rule for row in rows))
    rows = common_questions(rows, rules)
    summaries = {(s.rule, s.ratio): s for s in summarize(rows)}
    lines = [
        f"| {model} | n | " + " | ".join(f"exact agree @{r}" for r in RATIOS) + " | KL @0.2 |",
        "|---|---|" + "---|" * (len(RATIOS) + 1),
    ]
    for rule in rules:
        cells = [
            str(summaries[(rule, r)].exact_interval) if (rule, r) in summaries else "-"
            for r in RATIOS
        ]
        at = summaries.get((rule, 0.2))
        count = at.num_questions if at else 0
        kl = f"{at.first_token_kl:.3f}" if at else "-"
        lines.append(f"| {rule} | {count} | " + " | ".join(cells) + f" | {kl} |")
    return "\n".join(lines)


def report(model: str, rows: list[FidelityRow]) -> str:
    """Per data set at 0.2: exact and first-token agreement, gold F1 against full."""
    lines = [
        f"| {model} | rule | n | exact agree | first-token agree | gold F1 (full) "
        "| gold F1 - full | paired vs kv_deviation |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for dataset, subset in by_dataset(rows):
        for s in summarize(subset):
            if s.ratio != 0.2:
                continue
            paired = paired_rules(subset, s.rule, "kv_deviation", 0.2, "exact_agreement")
            versus = "-" if s.rule == "kv_deviation" or paired is None else str(paired)
            lines.append(
                f"| {dataset} | {s.rule} | {s.num_questions} | {s.exact_interval} "
                f"| {s.first_token_interval} | {s.gold_f1:.1f} ({s.reference_gold_f1:.1f}) "
                f"| {s.gold_f1_vs_full} | {versus} |"
            )
    return "\n".join(lines)


def paired(model: str, rows: list[FidelityRow]) -> str:
    """Each lever of :data:`PAIRS` against its rule, per data set and pooled, per ratio."""
    lines = [
        f"| {model} | lever vs rule | ratio | n | exact agree: lever / rule | paired "
        "| first-token agree: lever / rule | gold F1: lever / rule (full) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for lever, rule in PAIRS:
        both = [r for r in common_questions(rows, [lever, rule]) if r.rule in (lever, rule)]
        for dataset, subset in by_dataset(both):
            summaries = {(s.rule, s.ratio): s for s in summarize(subset)}
            for ratio in RATIOS:
                new, old = summaries.get((lever, ratio)), summaries.get((rule, ratio))
                if new is None or old is None:
                    continue
                versus = paired_rules(subset, lever, rule, ratio, "exact_agreement")
                lines.append(
                    f"| {dataset} | {lever} vs {rule} | {ratio} | {new.num_questions} "
                    f"| {new.exact_interval} / {old.exact_agreement:.0f} | {versus} "
                    f"| {new.first_token_agreement:.0f} / {old.first_token_agreement:.0f} "
                    f"| {new.gold_f1:.1f} / {old.gold_f1:.1f} ({new.reference_gold_f1:.1f}) |"
                )
    return "\n".join(lines) if len(lines) > 2 else ""


def main() -> None:
    for model in MODELS:
        calibration = rows_under(RESULTS / "fidelity" / "calibration" / model)
        if calibration:
            print(f"### Calibration, {model}\n\n{ablation(model, calibration)}\n")
        held_out = rows_under(RESULTS / "fidelity" / model)
        if held_out:
            print(f"### Report split, {model}\n\n{report(model, held_out)}\n")
        for split, rows in (("calibration", calibration), ("report split", held_out)):
            if table := paired(model, rows):
                print(f"### Levers against their rule, {split}, {model}\n\n{table}\n")


if __name__ == "__main__":
    main()
