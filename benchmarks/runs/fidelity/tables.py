"""``fidelity.py tables``: the tables of the fidelity results, from the rows (no model runs)."""

from __future__ import annotations

import argparse

from adarag.evaluation.fidelity import FidelityRow, paired_rules, summarize
from runs.fidelity.rows import by_dataset, common_questions, rows_under

MODELS = ("Qwen2.5-Coder-0.5B-Instruct", "SmolLM2-135M-Instruct")
TABLE_RATIOS = (0.1, 0.2, 0.3)
PAIRS = (  # (lever, the rule it is measured against), on the questions both ran
    ("qdev+fused5", "qdev"),
    ("qdev+fused5in1", "qdev"),
    ("query_deviation+fused5", "query_deviation"),
)


def ablation(model: str, rows: list[FidelityRow]) -> str:
    """Exact agreement [95% interval] per rule and ratio, pooled over the common questions."""
    rules = list(dict.fromkeys(row.rule for row in rows))
    rows = common_questions(rows, rules)
    summaries = {(s.rule, s.ratio): s for s in summarize(rows)}
    lines = [
        f"| {model} | n | "
        + " | ".join(f"exact agree @{r}" for r in TABLE_RATIOS)
        + " | KL @0.2 |",
        "|---|---|" + "---|" * (len(TABLE_RATIOS) + 1),
    ]
    for rule in rules:
        cells = [
            str(summaries[(rule, r)].exact_interval) if (rule, r) in summaries else "-"
            for r in TABLE_RATIOS
        ]
        at = summaries.get((rule, 0.2))
        count = at.num_questions if at else 0
        kl = f"{at.first_token_kl:.3f}" if at else "-"
        lines.append(f"| {rule} | {count} | " + " | ".join(cells) + f" | {kl} |")
    return "\n".join(lines)


def report_table(model: str, rows: list[FidelityRow]) -> str:
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


def paired_table(model: str, rows: list[FidelityRow]) -> str:
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
            for ratio in TABLE_RATIOS:
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


def tables(args: argparse.Namespace) -> None:
    """The ``tables`` subcommand: print the tables of the rows under ``--rows``."""
    for model in MODELS:
        calibration = rows_under(args.rows / "calibration" / model)
        if calibration:
            print(f"### Calibration, {model}\n\n{ablation(model, calibration)}\n")
        held_out = rows_under(args.rows / model)
        if held_out:
            print(f"### Report split, {model}\n\n{report_table(model, held_out)}\n")
        for split, rows in (("calibration", calibration), ("report split", held_out)):
            if table := paired_table(model, rows):
                print(f"### Levers against their rule, {split}, {model}\n\n{table}\n")
