"""``learned_selector.py pareto``: the report split's rules against full recomputation; TTFT."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import numpy as np
from common import write_results

from adarag.evaluation.fidelity import FidelityRow, paired_rules, read_rows, summarize
from runs.fidelity.rows import by_dataset


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
    # a rule timed under its own name first; the oracle and untimed variants as the learned rule
    fallback = "learned" if rule == "output_oracle" or rule.startswith("learned") else rule
    for timed_as in dict.fromkeys((rule, fallback)):
        for key, value in stats.items():
            if key == f"fused@{ratio:g} {timed_as}" or key.startswith(
                f"fused@{ratio:g} {timed_as}:"
            ):
                return f"{full / value['mean']:.2f}x"
    return "-"


def _machine_of(timing: dict) -> str:
    """The timed machine in a few words (a timing without it says so)."""
    info = timing.get("machine")
    if not info:
        return "machine not recorded"
    return f"{info['cpu']}, {info['cores']} cores, {info['date']}"


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
        + (f"(`{args.speed.name}`, {_machine_of(timing)})" if args.speed else "(not measured)")
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
