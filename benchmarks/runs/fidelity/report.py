"""The report of ``fidelity.py run``, rebuilt from every row: tables, paired differences, plots."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from common import machine, write_results

from adarag.evaluation.fidelity import (
    FidelityRow,
    FidelitySummary,
    Target,
    matched_speedup,
    paired_rules,
    read_rows,
    smallest_ratio_meeting,
    summarize,
)
from adarag.evaluation.machine import describe_machine, describe_sittings
from adarag.evaluation.plots import pyplot
from adarag.evaluation.workload import FIDELITY_CHUNKS


def write_report(args: argparse.Namespace, model: str, out: Path) -> None:
    """``<model><tag>.md``: the pooled table, the paired differences, one table per data set.

    Each data set's summaries (``<dataset><tag>.json``) and plot go beside its rows in ``out``.
    """
    measured_on = machine()
    sittings = read_sittings(out, args.tag)
    target = report_target(args, model)
    sections, pooled = [], []
    for dataset in args.dataset:
        stem = out / f"{dataset}{args.tag}"
        rows = read_rows(stem.with_suffix(".rows.jsonl"))
        if not rows:
            continue
        pooled += rows
        count = len({row.qid for row in rows})
        title = (
            f"{model}, {dataset}: {count} questions from #{args.offset}, "
            f"{FIDELITY_CHUNKS[dataset]} chunks, {args.max_new_tokens} new tokens (greedy)"
        )
        summaries = summarize(rows)
        payload = {
            "title": title,
            "machine": measured_on,
            "sittings": sittings,
            "summaries": [asdict(s) for s in summaries],
        }
        write_results(stem.name, payload, None, directory=out)
        _plot(summaries, title, stem.with_name(stem.name + "_agreement.png"))
        sections.append(_section(title, summaries, target))
    if not pooled:
        return
    count = len({(row.dataset, row.qid) for row in pooled})
    title = f"{model}, {len(sections)} data sets pooled ({count} questions)"
    summaries = summarize(pooled)
    parts = [
        _section(title, summaries, target),
        _paired(pooled, args.baseline),
        _matched(summaries, args.baseline),
        *sections,
    ]
    header = [
        f"# Fidelity: {model}",
        "",
        _machine_line(sittings, measured_on),
        "",
        "Every figure is a mean over questions with its 95% bootstrap interval in brackets. "
        "'gold F1 - full' is the paired difference against full recomputation of the same "
        "prompts. Exact agreement compares the whole greedy answer (up to the new-token budget) "
        "with full recomputation's.",
        "",
    ]
    write_results(f"{model}{args.tag}", None, "\n".join(header + parts), directory=args.output)


def _sittings_path(out: Path, tag: str) -> Path:
    return out / f"sittings{tag}.jsonl"


def record_sitting(out: Path, tag: str, info: dict) -> None:
    """Append one measuring run's machine (CPU, threads, load at its start) beside its rows.

    ``info`` also counts the rows already there (``rows_before``), measured by earlier runs.
    """
    out.mkdir(parents=True, exist_ok=True)
    with _sittings_path(out, tag).open("a") as file:
        file.write(json.dumps(info) + "\n")


def _machine_line(sittings: list[dict], now: dict) -> str:
    """The runs that measured the rows; ``now`` (the report's own moment) when none recorded."""
    if not sittings:
        return (
            f"{describe_machine(now)} (when this report was written: the runs that measured "
            "its rows did not record their machine)"
        )
    line = describe_sittings(sittings)
    if sittings[0].get("rows_before", 1):  # a record without the count cannot vouch for them
        line += " Some rows were measured before the first of these runs, on an unrecorded machine."
    return line


def read_sittings(out: Path, tag: str) -> list[dict]:
    """The machines of every run that measured rows of ``tag`` (none for rows measured before)."""
    path = _sittings_path(out, tag)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


PAIRED_METRICS = {
    "exact_agreement": "exact agreement, points",
    "first_token_agreement": "first-token agreement, points",
    "first_token_kl": "first-token KL, x100",
    "gold_f1": "gold F1, points",
}


def _paired(rows: list[FidelityRow], baseline: str) -> str:
    """Each rule against ``baseline`` at each ratio below 1: paired differences per metric."""
    rules = [rule for rule in dict.fromkeys(row.rule for row in rows) if rule != baseline]
    ratios = sorted({row.ratio for row in rows if row.ratio < 1.0})
    lines = []
    for metric, label in PAIRED_METRICS.items():
        lines += [
            f"## Paired against {baseline} ({label}; 95% interval; p)",
            "",
            "| rule | " + " | ".join(f"{ratio:.2f}" for ratio in ratios) + " |",
            "|---|" + "---|" * len(ratios),
        ]
        for rule in rules:
            cells = []
            for ratio in ratios:
                found = paired_rules(rows, rule, baseline, ratio, metric)
                cells.append("-" if found is None else f"{found} p={found.p_value:.2f}")
            lines.append(f"| {rule} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


MATCHED_METRICS = {
    "exact_agreement": "exact agreement",
    "first_token_agreement": "first-token agreement",
}


def _matched(summaries: list[FidelitySummary], baseline: str) -> str:
    """Each rule's speed-up at the quality ``baseline`` keeps at its largest ratio below 1."""
    own = [s for s in summaries if s.rule == baseline and s.ratio < 1.0]
    if not own:
        return ""
    anchor = max(own, key=lambda s: s.ratio)
    lines = [
        f"## Matched quality: the speed-up at {baseline}'s quality at ratio {anchor.ratio:.2f}",
        "",
        "Interpolated in cost (TTFT share of full's) between each rule's ratios; '>=' where its "
        "fastest ratio already keeps it.",
        "",
        "| rule | "
        + " | ".join(
            f"{label} {getattr(anchor, metric):.1f}%" for metric, label in MATCHED_METRICS.items()
        )
        + " |",
        "|---|" + "---|" * len(MATCHED_METRICS),
    ]
    for rule in dict.fromkeys(s.rule for s in summaries):
        cells = []
        for metric in MATCHED_METRICS:
            found = matched_speedup(summaries, rule, getattr(anchor, metric), metric)
            if found is None:
                cells.append("not reached")
            else:
                cells.append(f"{'>= ' if found.at_fastest else ''}{found.speedup:.2f}x")
        lines.append(f"| {rule} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def report_target(args: argparse.Namespace, model: str) -> Target:
    """The target the report reads: ``--target-first-token`` or ``--target-exact``.

    Else the model's usual one: SmolLM2, whose answers are too weak for exact agreement to mean
    much, first-token agreement >= 90%; any other model exact agreement >= 85%.
    """
    first_token = getattr(args, "target_first_token", None)
    exact = getattr(args, "target_exact", None)
    if first_token is not None:
        return Target(min_first_token_agreement=first_token)
    if exact is not None:
        return Target(min_exact_agreement=exact)
    return Target(min_first_token_agreement=90.0) if "SmolLM2" in model else Target()


def _section(title: str, summaries: list[FidelitySummary], target: Target) -> str:
    lines = [
        f"## {title}",
        "",
        "| rule | ratio | recomputed | n | exact agree % | first-token agree % | first-token KL "
        "| gold F1 | gold F1 - full | TTFT s (full) | speed-up |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {s.rule} | {s.ratio:.2f} | {100 * s.recomputed_share:.0f}% | {s.num_questions} "
            f"| {s.exact_interval} | {s.first_token_interval} | {s.first_token_kl:.3f} "
            f"| {s.gold_f1_interval} | {s.gold_f1_vs_full} "
            f"| {s.ttft_s:.2f} ({s.full_ttft_s:.2f}) | {s.full_ttft_s / s.ttft_s:.2f}x |"
        )
    lines += ["", f"Smallest ratio meeting the target ({_describe(target)}):", ""]
    for rule in dict.fromkeys(s.rule for s in summaries):
        hit = smallest_ratio_meeting(summaries, rule, target)
        if hit is None:
            lines.append(f"- {rule}: none of the ratios")
        else:
            speedup = hit.full_ttft_s / hit.ttft_s
            lines.append(f"- {rule}: {hit.ratio:.2f} (TTFT {hit.ttft_s:.2f} s, {speedup:.2f}x)")
    return "\n".join(lines) + "\n"


def _describe(target: Target) -> str:
    if target.min_first_token_agreement is not None:
        return f"first-token agreement >= {target.min_first_token_agreement:.0f}%"
    return (
        f"exact agreement >= {target.min_exact_agreement:.0f}% and gold F1 >= "
        f"{100 * target.min_gold_f1_share:.0f}% of full recomputation's"
    )


def _plot(summaries: list[FidelitySummary], title: str, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    panels = (
        ("exact agreement with full (%)", "exact_agreement"),
        ("first-token KL", "first_token_kl"),
    )
    for axis, (label, field) in zip(axes, panels, strict=True):
        for rule in dict.fromkeys(s.rule for s in summaries):
            points = sorted((s.ratio, getattr(s, field)) for s in summaries if s.rule == rule)
            style = ":" if "oracle" in rule or rule == "random" else "-"
            axis.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", label=rule)
        axis.set_xlabel("recomputed share of each chunk")
        axis.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
