"""The learned selector: which features find the oracle's tokens, and what it buys held out.

``features`` reads the oracle labels ``adarag calibrate --selector`` recorded on the calibration
questions (``--records``, one file per question) and writes
``results/fidelity/learned/<model>_features.md``:

- each feature family as a scorer on its own: the share of the oracle's set it chooses at the
  oracle's budget (recall), the share of the oracle set's first-order gain its set carries, and
  its AUROC over the candidates, at ratios 0.1 / 0.2 / 0.3, with 95% intervals over questions;
- the fitted selector held out: fitted on four data sets and judged on the fifth
  (leave-one-data-set-out, also by source: the three 2WikiMQA sets share questions), against
  ``query_deviation`` on the same questions (paired).

``pareto`` reads the report split's fidelity rows (``fidelity.py run`` with the ``learned``,
window, ladder and oracle rules; ``--rows``, default the benchmarks' cache) and an
``engine.py ttft`` run of the same rules side by side, and writes
``results/fidelity/learned/<model>_pareto.md``: per rule and ratio, exact agreement with full
recomputation, gold F1 against full's (paired), first-token agreement, and the mean TTFT
speed-up over full prefill (a ladder's from the share of requests ending on each rung).

    python benchmarks/learned_selector.py features --records ~/.cache/adarag-bench/selector/M
    python benchmarks/learned_selector.py pareto --model M \
        --speed benchmarks/results/engine/engine_ttft_learned_qwen.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from common import RESULTS, rows_dir, write_results
from runs.fidelity.rows import by_dataset

from adarag.evaluation.fidelity import FidelityRow, paired_rules, read_rows, summarize
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    stage = sub.add_parser("features", help="feature families and held-out fits, from labels")
    stage.add_argument("--records", type=Path, required=True, help="the labels' directory")
    stage.add_argument("--output", type=Path, default=RESULTS / "fidelity" / "learned")
    stage.set_defaults(fn=features)
    stage = sub.add_parser("pareto", help="the report split's table, from fidelity rows")
    stage.add_argument("--model", required=True, help="the checkpoint's directory name")
    stage.add_argument("--rows", type=Path, default=rows_dir(RESULTS / "fidelity"))
    stage.add_argument("--speed", type=Path, help="an `engine.py ttft` result (JSON)")
    stage.add_argument("--baseline", default="query_deviation")
    stage.add_argument("--output", type=Path, default=RESULTS / "fidelity" / "learned")
    stage.set_defaults(fn=pareto)
    args = parser.parse_args()
    args.fn(args)


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


def _speed_of(rule: str, ratio: float, rows: Sequence[FidelityRow], timing: dict) -> str:
    """The mean TTFT speed-up over full prefill of ``rule`` at ``ratio`` (``-`` untimed)."""
    stats = timing.get("stats", {})
    if "full" not in stats:
        return "-"
    full = stats["full"]["mean"]
    if rule.startswith("ladder"):
        rungs = {
            key.rsplit(" ", 1)[-1]: value["mean"]
            for key, value in stats.items()
            if key.startswith(f"fused@{ratio:g} ladder")
        }
        finals = [row.final_ratio for row in rows]
        seconds = []
        for final in finals:
            key = "kept" if final is None or final <= ratio + 1e-9 else f"{final:g}"
            if key not in rungs:
                return "-"
            seconds.append(rungs[key])
        return f"{full / float(np.mean(seconds)):.2f}x"
    timed_as = "learned" if rule in ("output_oracle",) or rule.startswith("learned") else rule
    for key, value in stats.items():
        if key == f"fused@{ratio:g} {timed_as}" or key.startswith(f"fused@{ratio:g} {timed_as}:"):
            return f"{full / value['mean']:.2f}x"
    return "-"


def pareto(args: argparse.Namespace) -> None:
    """The report split's Pareto table of every rule and ratio."""
    folder = args.rows / args.model
    rows = [row for path in sorted(folder.glob("*.rows.jsonl")) for row in read_rows(path)]
    wanted = ("query_deviation", "learned", "output_oracle")
    rows = [
        r
        for r in rows
        if (r.rule in wanted or r.rule.startswith(("learned+w", "ladder"))) and 0.0 < r.ratio < 1.0
    ]
    if not rows:
        raise SystemExit(f"no rows of {wanted} under {folder}")
    timing = json.loads(args.speed.read_text()) if args.speed else {}
    rules = list(dict.fromkeys(r.rule for r in rows))
    lines = [
        f"# The learned selector and the routing ladder on held-out questions: {args.model}",
        "",
        "Report split (questions #40 on of each data set, none used for fitting or choosing). "
        "Exact agreement with full recomputation's answer and first-token agreement in %, gold "
        "F1 minus full recomputation's (paired, points), with 95% bootstrap intervals; "
        f"'paired' is exact agreement against `{args.baseline}` at the same ratio on the same "
        "questions. The speed-up is full prefill's mean TTFT over the rule's, measured side by "
        "side on MuSiQue prompts (~3.5K tokens) "
        + (f"(`{args.speed.name}`)" if args.speed else "(not measured)")
        + "; a ladder's mixes its rungs' TTFT by the share of requests ending on each; the "
        "oracle is timed as the learned rule at its ratio (its own search is not counted).",
        "",
    ]
    for dataset, subset in [*by_dataset(rows)]:
        lines += [
            f"## {dataset}",
            "",
            "| rule | ratio | n | exact agreement | paired | first-token agreement "
            "| gold F1 - full | routed | TTFT speed-up |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for rule in rules:
            for ratio in sorted({r.ratio for r in subset if r.rule == rule}):
                group = [r for r in subset if r.rule == rule and r.ratio == ratio]
                (summary,) = summarize(group)
                pair = (
                    "-"
                    if rule == args.baseline
                    else str(
                        paired_rules(subset, rule, args.baseline, ratio, "exact_agreement") or "-"
                    )
                )
                routed = [r.final_ratio is not None and r.final_ratio > ratio + 1e-9 for r in group]
                lines.append(
                    f"| {rule} | {ratio:g} | {summary.num_questions} | {summary.exact_interval} "
                    f"| {pair} | {summary.first_token_interval} | {summary.gold_f1_vs_full} "
                    f"| {100 * np.mean(routed):.0f}% | {_speed_of(rule, ratio, group, timing)} |"
                )
        lines.append("")
    write_results(
        f"{args.model}_pareto", None, "\n".join(lines).rstrip("\n"), directory=args.output
    )
    print(f"wrote {args.output / args.model}_pareto.md")


if __name__ == "__main__":
    main()
