"""The files ``adarag bench --dataset`` writes per data set, and the same files again from JSON."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from adarag.evaluation import plots
from adarag.evaluation.harness import QueryRecord
from adarag.evaluation.machine import describe_machine
from adarag.evaluation.report import (
    Latency,
    PolicySummary,
    by_question_type,
    markdown_table,
    speedups,
)
from adarag.policies import POLICIES


def write_dataset_report(
    output: Path,
    dataset: str,
    title: str,
    records: list[QueryRecord],
    summaries: list[PolicySummary],
    sweep: dict[int, list[PolicySummary]],
    measured_on: dict[str, Any],
) -> str:
    """``<dataset>.{md,json}`` and its plots under ``output``; returns the markdown.

    Args:
        output: The folder written.
        dataset: The data set's name, the files' stem.
        title: The tables' heading.
        records: Every query of every policy at the main top-k.
        summaries: One per policy, from ``records``.
        sweep: Per top-k of the sweep, its summaries (empty without a sweep).
        measured_on: The machine's description (:func:`adarag.evaluation.machine.machine`).
    """
    payload = {
        "title": title,
        "machine": measured_on,
        "summaries": [asdict(s) for s in summaries],
        "speedups": speedups(summaries),
        "records": [asdict(r) for r in records],
        "top_k_sweep": {k: [asdict(s) for s in v] for k, v in sweep.items()},
    }
    output.mkdir(parents=True, exist_ok=True)
    (output / f"{dataset}.json").write_text(json.dumps(payload, indent=1) + "\n")
    return _write_tables(output, dataset, title, records, summaries, sweep, measured_on)


def rewrite_dataset_report(path: Path) -> str:
    """The ``.md`` and plots of an earlier run again, from its ``<dataset>.json`` at ``path``."""
    payload = json.loads(path.read_text())
    records = [QueryRecord(**record) for record in payload["records"]]
    summaries = [_summary(s) for s in payload["summaries"]]
    sweep = {int(k): [_summary(s) for s in v] for k, v in payload["top_k_sweep"].items()}
    return _write_tables(
        path.parent, path.stem, payload["title"], records, summaries, sweep, payload["machine"]
    )


def _write_tables(
    output: Path,
    dataset: str,
    title: str,
    records: list[QueryRecord],
    summaries: list[PolicySummary],
    sweep: dict[int, list[PolicySummary]],
    measured_on: dict[str, Any],
) -> str:
    ratios = speedups(summaries)
    lines = [f"## {title}", "", describe_machine(measured_on), "", markdown_table(summaries), ""]
    if ratios:
        lines.append(
            "AdaCache mean-TTFT speed-up over: "
            + ", ".join(f"{name} {ratio:.2f}x" for name, ratio in ratios.items())
        )
    types = by_question_type(records, "adacache", "adacache-static")
    if types:
        lines += [
            "",
            "By question type (adacache vs adacache-static):",
            "",
            "| type | queries | using >= 2 chunks % | mean chunks | F1 | static F1 |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {t} | {n} | {two:.0f} | {c:.2f} | {f:.1f} | {sf:.1f} |"
            for t, n, two, c, f, sf in types
        ]
    (output / f"{dataset}.md").write_text("\n".join(lines) + "\n")
    plots.ttft_vs_quality(summaries, title, output / f"{dataset}_ttft_vs_f1.png")
    augmenting = [
        s.policy for s in summaries if s.policy in POLICIES and POLICIES[s.policy].augments
    ]
    top_k = records[0].top_k if records else 0
    plots.depth_histogram(records, augmenting, top_k, title, output / f"{dataset}_depths.png")
    if len(sweep) > 1:
        sweep_title = f"{dataset}: TTFT vs top-k, each question once (cold caches)"
        plots.ttft_vs_top_k(sweep, sweep_title, output / f"{dataset}_ttft_vs_topk.png")
    return "\n".join(lines)


def _summary(fields: dict[str, Any]) -> PolicySummary:
    """A summary as ``asdict`` wrote it, its latencies rebuilt."""
    latencies = {
        name: None if fields[name] is None else Latency(**fields[name])
        for name in ("ttft", "ttft_cold", "ttft_warm")
    }
    return PolicySummary(**{**fields, **latencies})
