"""``learned_selector.py features``: each feature family as a scorer, and the held-out fits."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import numpy as np
from common import write_results

from adarag.evaluation.intervals import bootstrap_interval, paired_difference
from adarag.evaluation.machine import describe_machine, machine
from adarag.evaluation.profiling.fitting import source_of
from adarag.evaluation.profiling.selector_fit import (
    feature_scores,
    fit_selector,
    num_layers_of,
    scorer_scores,
    selection_quality,
    selector_features,
)
from adarag.evaluation.profiling.selector_labels import SelectorRecord, load_records

RATIOS = (0.1, 0.2, 0.3)


def families(num_layers: int) -> dict[str, str]:
    """Feature families, each as one derived feature that scores on its own."""
    half, three_quarters = num_layers // 2, (3 * num_layers) // 4
    return {
        "V deviation at the check layer": "log_v_dev",
        "K deviation at the check layer": "log_k_dev",
        "cached V norm (InfoFlow's weight)": "log_v_norm",
        "query attention, all layers": "log_q_mass",
        f"query attention, shallow (layers 0-{half - 1})": f"log_q_mass:0-{half}",
        f"query attention, deep (layers {half}-{num_layers - 1})": (
            f"log_q_mass:{half}-{num_layers}"
        ),
        "last query token's attention, all layers": "log_last_mass",
        f"last query token's attention, deep (layers {three_quarters}-{num_layers - 1})": (
            f"log_last_mass:{three_quarters}-{num_layers}"
        ),
        "position in the chunk": "rel_offset",
        "chunk order (retrieval rank)": "chunk_order",
        "query_deviation (the default rule)": "log_query_deviation",
    }


def quality_cells(
    records: Sequence[SelectorRecord], scores: Callable[[SelectorRecord], np.ndarray]
) -> dict[float, tuple[list[float], list[float], list[float]]]:
    """Per ratio, per question: recall, gain share and AUROC of ``scores``."""
    out = {}
    for ratio in RATIOS:
        judged = [selection_quality(r, scores(r), ratio) for r in records]
        out[ratio] = (
            [100 * q.recall for q in judged],
            [100 * q.gain_share for q in judged if np.isfinite(q.gain_share)],
            [q.auroc for q in judged if np.isfinite(q.auroc)],
        )
    return out


def family_table(records: Sequence[SelectorRecord]) -> list[str]:
    """Every family as a scorer, with a random control."""
    rng = np.random.default_rng(0)
    scorers: dict[str, Callable[[SelectorRecord], np.ndarray]] = {
        name: (lambda r, feature=feature: feature_scores(feature, r))
        for name, feature in families(num_layers_of(records[0])).items()
    }
    scorers["random (control)"] = lambda r: rng.random(len(r.gain))
    lines = [
        "| feature family | recall of the oracle's set @0.1 | @0.2 | @0.3 | oracle gain "
        "carried @0.2 | AUROC @0.2 |",
        "|---|---|---|---|---|---|",
    ]
    for name, scorer in scorers.items():
        cells = quality_cells(records, scorer)
        recall = [str(bootstrap_interval(cells[ratio][0])) for ratio in RATIOS]
        gain = bootstrap_interval(cells[0.2][1])
        area = np.mean(cells[0.2][2])
        lines.append(f"| {name} | " + " | ".join(recall) + f" | {gain} | {area:.3f} |")
    return lines


def held_out_table(records: Sequence[SelectorRecord], group_of: Callable[[str], str]) -> list[str]:
    """The selector fitted without each group, against query_deviation on the group (paired)."""
    features = selector_features(num_layers_of(records[0]))
    groups = list(dict.fromkeys(group_of(r.dataset) for r in records))
    lines = [
        "| held out | n | recall @0.2: learned | query_deviation | paired | gain carried: learned "
        "| query_deviation |",
        "|---|---|---|---|---|---|---|",
    ]
    pooled_learned: list[float] = []
    pooled_base: list[float] = []
    for group in [*groups, "pooled"]:
        if group == "pooled":
            learned, base = pooled_learned, pooled_base
            gains = ("", "")
            count = len(learned)
        else:
            train = [r for r in records if group_of(r.dataset) != group]
            test = [r for r in records if group_of(r.dataset) == group]
            model = fit_selector(train, features, 0.2)
            judged = [selection_quality(r, scorer_scores(model, r), 0.2) for r in test]
            plain = [
                selection_quality(r, feature_scores("log_query_deviation", r), 0.2) for r in test
            ]
            learned = [100 * q.recall for q in judged]
            base = [100 * q.recall for q in plain]
            pooled_learned += learned
            pooled_base += base
            gains = (
                f"{100 * np.nanmean([q.gain_share for q in judged]):.1f}",
                f"{100 * np.nanmean([q.gain_share for q in plain]):.1f}",
            )
            count = len(test)
        lines.append(
            f"| {group} | {count} | {bootstrap_interval(learned)} | "
            f"{bootstrap_interval(base)} | {paired_difference(learned, base)} | {gains[0]} | "
            f"{gains[1]} |"
        )
    return lines


def features(args: argparse.Namespace) -> None:
    """The feature families' table and the held-out fits, from the label records."""
    records = load_records(args.records)
    if not records:
        raise SystemExit(f"no label records under {args.records}")
    model = args.records.name
    counts = {
        d: sum(r.dataset == d for r in records) for d in dict.fromkeys(r.dataset for r in records)
    }
    lines = [
        f"# The learned selector against the output-aware oracle: {model}",
        "",
        describe_machine(machine()),
        "",
        f"{len(records)} calibration questions ("
        + ", ".join(f"{d} {n}" for d, n in counts.items())
        + "), every reused token of each labelled by the output-aware oracle "
        "(`adarag calibrate --selector`). Means over questions with 95% bootstrap intervals; "
        "'recall' is the share of the oracle's chosen set a scorer picks at the same budget, "
        "'oracle gain carried' the share of the oracle set's first-order loss reduction its set "
        "holds. Command: `python benchmarks/learned_selector.py features --records DIR`.",
        "",
        "## Each feature family as a scorer",
        "",
        *family_table(records),
        "",
        "## The fitted selector, leave-one-data-set-out (ratio 0.2)",
        "",
        *held_out_table(records, lambda dataset: dataset),
        "",
        "## The same, one source held out (the 2WikiMQA sets together)",
        "",
        *held_out_table(records, source_of),
        "",
    ]
    summary = {"model": model, "questions": counts}
    write_results(
        f"{model}_features", summary, "\n".join(lines).rstrip("\n"), directory=args.output
    )
    print(f"wrote {args.output / model}_features.md")
