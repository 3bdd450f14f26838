"""Fidelity tables of benchmarks/RESULTS.md: the lever ablation, the oracles, the report split.

Reads ``results/fidelity[/calibration]/<model>/*.rows.jsonl`` (written by ``fidelity.py``) and
prints markdown: no model runs.

    python benchmarks/fidelity_tables.py
"""

from __future__ import annotations

from pathlib import Path

from common import RESULTS

from adarag.evaluation.fidelity import FidelityRow, paired_rules, read_rows, summarize

MODELS = ("Qwen2.5-Coder-0.5B-Instruct", "SmolLM2-135M-Instruct")
RATIOS = (0.1, 0.2, 0.3)


def rows_under(folder: Path) -> list[FidelityRow]:
    """Every row of every data set under ``folder``."""
    return [row for path in sorted(folder.glob("*.rows.jsonl")) for row in read_rows(path)]


def common_questions(rows: list[FidelityRow], rules: list[str]) -> list[FidelityRow]:
    """The rows of the questions every rule in ``rules`` was measured on (paired tables)."""
    keys = [{(r.dataset, r.qid) for r in rows if r.rule == rule} for rule in rules]
    shared = set.intersection(*keys) if keys else set()
    return [r for r in rows if (r.dataset, r.qid) in shared]


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
    datasets = list(dict.fromkeys(row.dataset for row in rows))
    for dataset in [*datasets, "pooled"]:
        subset = rows if dataset == "pooled" else [r for r in rows if r.dataset == dataset]
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


def main() -> None:
    for model in MODELS:
        calibration = rows_under(RESULTS / "fidelity" / "calibration" / model)
        if calibration:
            print(f"### Calibration, {model}\n\n{ablation(model, calibration)}\n")
        held_out = rows_under(RESULTS / "fidelity" / model)
        if held_out:
            print(f"### Report split, {model}\n\n{report(model, held_out)}\n")


if __name__ == "__main__":
    main()
