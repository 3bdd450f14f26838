"""``depth.py report``: fixed top-k, the adaptive rules and the oracle depth, from the records."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from common import RESULTS, write_results

from adarag.augment.probe import SIGNALS
from adarag.evaluation.depth import (
    DepthQuestion,
    Outcome,
    Prices,
    Rule,
    choose,
    fixed,
    fixed_at_tokens,
    oracle,
    prior,
    signal,
    signal_auroc,
    stable,
)
from adarag.evaluation.intervals import bootstrap_interval, paired_difference
from adarag.evaluation.machine import describe_machine, machine
from adarag.evaluation.plots import pyplot
from runs.depth.probe_replay import feature_row, probe_rule, probed
from runs.depth.splits import MAX_K, PROBE_RECORDS, ROWS

OUTPUT = RESULTS / "adaptive-augmentation" / "depth"
DEFAULT_K = 6
GAPS = (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.12, 0.15)
TAUS = [round(float(tau), 2) for tau in np.linspace(0.05, 0.95, 19)]
FAMILIES: dict[str, list[Rule]] = {
    "score-gap prior (static)": [prior(gap) for gap in GAPS],
    "lens confidence": [signal("confidence", tau, floor) for tau in TAUS for floor in (1, 2, 3, 4)],
    "first-token margin": [signal("margin", tau, floor) for tau in TAUS for floor in (1, 2, 3, 4)],
    "answer stability": [stable(floor, stride) for floor in (2, 3, 4, 5) for stride in (1, 2, 3)],
    "gap prior, then margin": [signal("margin", tau, 1, gap) for tau in TAUS for gap in GAPS],
    "gap prior, then stability": [
        stable(floor, stride, gap) for floor in (2, 3, 4) for stride in (1, 2) for gap in GAPS
    ],
}


def report(args: argparse.Namespace) -> None:
    """Tables and plots from every recorded question."""
    write_report(ROWS["report"], OUTPUT, args.calibration, PROBE_RECORDS["report"])


def load(model_dir: Path) -> dict[str, list[dict]]:
    """Each set's recorded questions (rows as written by ``run``)."""
    return {
        path.stem: [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for path in sorted(model_dir.glob("*.jsonl"))
    }


def write_report(rows: Path, output: Path, calibration: int, probe_records: Path) -> None:
    """``output/summary.md``, ``output/summary.json`` and one plot per model, from ``rows``.

    ``rows`` holds one folder of recorded questions per model. A model whose packaged profile
    holds a depth probe, with probe records of every report question under
    ``probe_records/<model>``, gets the probe's row too.
    """
    lines = [
        "# Adaptive depth against fixed top-k over real retrieval",
        "",
        "Each question's top-12 chunks come from an embedded Chroma knowledge base "
        "(all-MiniLM-L6-v2) over its data set's corpus, no gold passage forced in; step k's "
        "answer is the full-recomputation answer of static top-k (greedy, 16 new tokens). "
        "Gold F1 in points with 95% bootstrap intervals. TTFT is priced from each model's "
        "timed full prefills and steps (fits below; `adarag/evaluation/depth.py`), measured "
        "with one torch thread per process and up to four processes sharing the 2 cores, so "
        "compare TTFT within a model only. Rule parameters are chosen on the first "
        f"{calibration} questions of each set (pooled); every row below is on the others. "
        f"Report: `python benchmarks/depth.py report` ({describe_machine(machine())})",
        "",
    ]
    summary: dict[str, Any] = {}
    for model_dir in sorted(p for p in rows.iterdir() if p.is_dir()):
        sets = load(model_dir)
        if not sets:
            continue
        model_lines, summary[model_dir.name] = _model_report(
            model_dir.name, sets, calibration, probe_records, output
        )
        lines += model_lines
    write_results("summary", summary, "\n".join(lines), directory=output)


def _model_report(
    model: str,
    sets: dict[str, list[dict]],
    calibration: int,
    probe_records: Path,
    output: Path,
) -> tuple[list[str], dict[str, Any]]:
    """One model's section of the report and of the summary, and its plot."""
    everything = [DepthQuestion.from_record(row) for rows in sets.values() for row in rows]
    prices = Prices.fit(everything)
    tuning = [
        DepthQuestion.from_record(row)
        for rows in sets.values()
        for row in rows
        if row["index"] < calibration
    ]
    chosen = {name: choose(rules, tuning, prices, MAX_K) for name, rules in FAMILIES.items()}
    lines = _model_header(model, prices, len(tuning))
    summary: dict[str, Any] = {"prices": _prices(prices), "sets": {}}
    panels = {}
    signals: list[str] = []
    features: list[str] = []
    for dataset, rows in sets.items():
        held = [row for row in rows if row["index"] >= calibration]
        if not held:
            continue
        questions = [DepthQuestion.from_record(row) for row in held]
        fixed_outcomes = [Outcome.of(fixed(k), questions, prices) for k in range(1, MAX_K + 1)]
        found = probed(model, dataset, [q.qid for q in questions], probe_records)
        extra = [probe_rule(*found)] if found else []
        rules = [*chosen.values(), *extra, oracle()]
        outcomes = [Outcome.of(rule, questions, prices) for rule in rules]
        lines += _fixed_table(dataset, held, fixed_outcomes)
        lines += _rule_table(outcomes, fixed_outcomes)
        summary["sets"][dataset] = _set_summary(fixed_outcomes, outcomes)
        panels[dataset] = (fixed_outcomes, outcomes)
        signals.append(_signal_row(dataset, questions))
        if found:
            features.append(feature_row(dataset, *found))
    lines += _signal_tables(signals, features)
    plot = _plot(model, panels, output / f"{model}_pareto.png")
    lines += [f"![F1 against prompt tokens]({plot.name})", ""]
    return lines, summary


def _signal_tables(signals: list[str], features: list[str]) -> list[str]:
    """How well each step's signals rank the good steps; the depth probe's, if it has rows."""
    lines = [
        "How well each step's signal ranks the steps whose answer reaches gold F1 0.5 "
        "(AUROC over every step of the report questions; 0.5 is chance):",
        "",
        "| set | steps | answers with F1 >= 0.5 | lens confidence | first-token margin |",
        "|---|---|---|---|---|",
        *signals,
        "",
    ]
    if features:
        lines += [
            "How well the depth probe and each of its signals rank the steps no later step "
            "answers better than (its label; AUROC over every step of the report questions, "
            "0.5 is chance, below 0.5 ranks them last):",
            "",
            f"| set | steps | label true | probe | {' | '.join(SIGNALS)} |",
            "|---|---|---|---|" + "---|" * len(SIGNALS),
            *features,
            "",
        ]
    return lines


def _model_header(model: str, prices: Prices, num_tuning: int) -> list[str]:
    a, b, c = prices.static
    return [
        f"## {model}",
        "",
        f"Full prefill of n tokens: {a:.3f} s + {1e3 * b:.3f} ms x n + {1e6 * c:.4f} us x n^2. "
        f"Augmentation step: {prices.step.fixed_s:.3f} s fixed + "
        f"{1e3 * prices.step.per_token_s:.3f} ms per processed token. "
        f"Rules chosen on {num_tuning} calibration questions.",
        "",
    ]


def _fixed_table(dataset: str, rows: Sequence[dict], outcomes: Sequence[Outcome]) -> list[str]:
    lines = [
        f"### {dataset}: fixed top-k ({len(rows)} questions)",
        "",
        "| k | gold F1 [95% CI] | mean prompt tokens | TTFT s | a gold chunk in top-k |",
        "|---|---|---|---|---|",
    ]
    for k, outcome in enumerate(outcomes, 1):
        recall = 100 * np.mean([any(row["gold"][:k]) for row in rows])
        lines.append(
            f"| {k} | {bootstrap_interval(outcome.f1)} | {outcome.mean_tokens:.0f} | "
            f"{np.mean(outcome.seconds):.2f} | {recall:.0f}% |"
        )
    return [*lines, ""]


def _rule_table(outcomes: Sequence[Outcome], fixed_outcomes: Sequence[Outcome]) -> list[str]:
    default = float(np.mean(fixed_outcomes[DEFAULT_K - 1].seconds))
    best = max(fixed_outcomes, key=lambda o: o.mean_f1)
    lines = [
        f"Best fixed depth: top-{fixed_outcomes.index(best) + 1}, F1 {best.mean_f1:.1f}.",
        "",
        "| rule (chosen on calibration) | gold F1 [95% CI] | mean depth (range) | mean prompt "
        "tokens | TTFT s | F1 - fixed top-k at equal tokens [95% CI] | TTFT / static "
        f"top-{DEFAULT_K} |",
        "|---|---|---|---|---|---|---|",
    ]
    for outcome in outcomes:
        equal = fixed_at_tokens(fixed_outcomes, outcome.mean_tokens)
        gain = paired_difference(outcome.f1, equal)
        seconds = float(np.mean(outcome.seconds))
        lines.append(
            f"| {outcome.rule.name} | {bootstrap_interval(outcome.f1)} | "
            f"{np.mean(outcome.depth):.2f} ({min(outcome.depth)}-{max(outcome.depth)}) | "
            f"{outcome.mean_tokens:.0f} | {seconds:.2f} | {gain} | {seconds / default:.2f} |"
        )
    return [*lines, ""]


def _signal_row(dataset: str, questions: Sequence[DepthQuestion]) -> str:
    steps = [step for q in questions for step in q.steps]
    good = 100 * np.mean([step.f1 >= 0.5 for step in steps])
    cells = [signal_auroc(questions, name) for name in ("confidence", "margin")]
    shown = " | ".join("-" if cell is None else f"{cell:.2f}" for cell in cells)
    return f"| {dataset} | {len(steps)} | {good:.0f}% | {shown} |"


def _set_summary(fixed_outcomes: Sequence[Outcome], outcomes: Sequence[Outcome]) -> dict:
    def row(outcome: Outcome) -> dict:
        interval = bootstrap_interval(outcome.f1)
        equal = fixed_at_tokens(fixed_outcomes, outcome.mean_tokens)
        gain = paired_difference(outcome.f1, equal).difference
        return {
            "rule": outcome.rule.name,
            "f1": [interval.mean, interval.low, interval.high],
            "mean_depth": float(np.mean(outcome.depth)),
            "mean_tokens": outcome.mean_tokens,
            "ttft_s": float(np.mean(outcome.seconds)),
            "gain_over_fixed": [gain.mean, gain.low, gain.high],
        }

    return {
        "questions": len(fixed_outcomes[0].f1),
        "fixed": [row(o) for o in fixed_outcomes],
        "rules": [row(o) for o in outcomes],
    }


def _prices(prices: Prices) -> dict:
    return {
        "static": list(prices.static),
        "step_fixed_s": prices.step.fixed_s,
        "step_per_token_s": prices.step.per_token_s,
    }


def _plot(model: str, panels: dict, path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (dataset, (fixed_outcomes, outcomes)) in zip(axes[0], panels.items(), strict=True):
        intervals = [bootstrap_interval(o.f1) for o in fixed_outcomes]
        x = [o.mean_tokens for o in fixed_outcomes]
        y = [i.mean for i in intervals]
        err = [[i.mean - i.low for i in intervals], [i.high - i.mean for i in intervals]]
        ax.errorbar(x, y, yerr=err, fmt="-o", color="grey", label="fixed top-k", capsize=2)
        for k, (tx, ty) in enumerate(zip(x, y, strict=True), 1):
            ax.annotate(str(k), (tx, ty), fontsize=7, xytext=(2, 3), textcoords="offset points")
        for outcome in outcomes:
            ax.plot(
                outcome.mean_tokens,
                outcome.mean_f1,
                "*" if "oracle" in outcome.rule.name else "s",
                label=outcome.rule.name,
                markersize=8,
            )
        ax.set_title(f"{model}: {dataset}")
        ax.set_xlabel("mean prompt tokens")
        ax.set_ylabel("gold F1")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
