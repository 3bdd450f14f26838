"""``depth.py gain-report``: chunk selection by information gain against fixed top-k.

Per model, every rule's parameters are chosen on the calibration split's records (the three sets
pooled, none of the report's questions); every figure is on the report split. The best fixed
top-k is chosen per set on the report questions themselves, which favours the baseline.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from common import RESULTS, write_results

from adarag.augment.gain import DEFAULT_THRESHOLD
from adarag.evaluation.depth import auroc
from adarag.evaluation.gain_depth import (
    THRESHOLDS,
    GainQuestion,
    SetOutcome,
    SetRule,
    by_gain,
    by_gain_then_confidence,
    choose,
    fixed,
    gain_family,
    oracle_depth,
    oracle_subset,
    prefill_price,
    score_gap,
)
from adarag.evaluation.intervals import bootstrap_interval, paired_difference
from adarag.evaluation.machine import describe_machine, machine
from runs.depth.gain_run import COST_SIZES, GAIN_ROWS

OUTPUT = RESULTS / "adaptive-augmentation" / "gain"
GAPS = (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.12, 0.15)
CONFIDENCES = (0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6)
MODELS = {
    "SmolLM2-135M-Instruct": "SmolLM2-135M-Instruct",
    "Qwen2.5-Coder-0.5B-Instruct": "Qwen2.5-Coder-0.5B-Instruct",
}


def gain_report(args: argparse.Namespace) -> None:
    """Tables of every model with records (``summary.md``, ``summary.json``)."""
    info = machine()
    sections, payload = [_header(info)], {"machine": info, "models": {}}
    for model_dir in sorted(GAIN_ROWS["report"].iterdir()):
        report_sets = _load(model_dir)
        calibration = [
            q for qs in _load(GAIN_ROWS["calibration"] / model_dir.name).values() for q in qs
        ]
        if not report_sets or not calibration:
            continue
        text, data = _model_section(model_dir.name, report_sets, calibration)
        sections.append(text)
        payload["models"][model_dir.name] = data
    write_results("summary", payload, "\n\n".join(sections), directory=OUTPUT)
    print((OUTPUT / "summary.md").read_text())


def _load(model_dir: Path) -> dict[str, list[GainQuestion]]:
    if not model_dir.is_dir():
        return {}
    return {
        path.stem: [
            GainQuestion.from_record(json.loads(line))
            for line in path.read_text().splitlines()
            if line.strip()
        ]
        for path in sorted(model_dir.glob("*.jsonl"))
    }


def _header(info: dict[str, Any]) -> str:
    return (
        "# Chunk selection by information gain against fixed top-k, over real retrieval\n\n"
        "Each question's top-8 chunks come from an embedded Chroma knowledge base "
        "(all-MiniLM-L6-v2) over its set's corpus, no gold passage forced in. A chunk's gain is "
        "the drop in the normalised top-20 entropy of the question's next token with that chunk "
        "alone against no context, scored from each chunk's cached KV in one batched pass "
        "(`Engine.query_over_contexts`). Every answer is the full-recomputation answer of its "
        "prompt (greedy, 16 new tokens). Gold F1 in points with 95% bootstrap intervals; paired "
        "differences against the best fixed top-k of the same set (chosen on the report "
        "questions). Rules' τ, gap and confidence are chosen on the calibration split (other "
        "questions of the same sets, pooled) by the largest F1 over fixed top-k at equal mean "
        "tokens. TTFT: a quadratic fit of timed full prefills of the report questions, plus the "
        "measured scoring pass for the gain rules; both models' runs shared the 2 cores (one "
        "torch thread each), so compare TTFT within a model only. Records: `python "
        "benchmarks/depth.py gain`; tables: `python benchmarks/depth.py gain-report`.\n\n"
        + describe_machine(info)
    )


def _chosen_rules(calibration: Sequence[GainQuestion]) -> dict[str, SetRule]:
    price = prefill_price(calibration) if _timed(calibration) else (lambda _: 0.0)
    pairs = [(t, c) for t in THRESHOLDS for c in CONFIDENCES]
    return {
        "gain, gain order": choose(gain_family("gain"), calibration, price),
        "gain, retrieval order": choose(gain_family("retrieval"), calibration, price),
        "gain, then lens confidence": choose(
            [by_gain_then_confidence(t, c) for t, c in pairs], calibration, price
        ),
        "score gap": choose([score_gap(gap) for gap in GAPS], calibration, price),
    }


def _timed(questions: Sequence[GainQuestion]) -> bool:
    return sum(len(q.static) for q in questions) >= 3


def _model_section(
    name: str, report_sets: dict[str, list[GainQuestion]], calibration: list[GainQuestion]
) -> tuple[str, dict[str, Any]]:
    everything = [q for qs in report_sets.values() for q in qs]
    price = prefill_price(everything)
    chosen = _chosen_rules(calibration)
    lines = [f"## {name}", ""]
    lines.append(
        f"Rules chosen on {len(calibration)} calibration questions: "
        + "; ".join(f"{label}: `{rule.name}`" for label, rule in chosen.items())
        + "."
    )
    lines.append(_cost_line(everything, price))
    lines.append(_signal_line(everything))
    data: dict[str, Any] = {"chosen": {k: r.name for k, r in chosen.items()}, "sets": {}}
    targets = []
    for dataset, questions in report_sets.items():
        table, rows, target = _set_table(dataset, questions, chosen, price)
        lines += ["", table]
        data["sets"][dataset] = rows
        targets.append((dataset, target))
    lines += [
        "",
        "Target (either: ≥ +2 F1 over the best fixed k at ≤ its tokens, interval above 0; "
        "or ≥ 30% fewer tokens, paired interval containing 0 with its low end above -1):",
    ]
    lines += [f"- {dataset}: {target}" for dataset, target in targets]
    data["targets"] = dict(targets)
    return "\n".join(lines), data


def _signal_line(questions: Sequence[GainQuestion]) -> str:
    """How well the gain and the retrieval score rank useful chunks first (AUROC)."""
    gains = [g for q in questions for g in q.gains]
    scores = [s for q in questions for s in q.scores]
    gold = [flag for q in questions for flag in q.gold]
    right = [answered.f1 >= 0.5 for q in questions for answered in q.single]

    def auc(values: list[float], labels: list[bool]) -> str:
        value = auroc(values, labels)
        return "n/a" if value is None else f"{value:.2f}"

    return (
        f"Over the report questions' {len(gains)} chunks, AUROC of the gain for a gold chunk "
        f"{auc(gains, gold)} (the retrieval score: {auc(scores, gold)}), and for a chunk whose "
        f"answer alone reaches F1 0.5 {auc(gains, right)} (the retrieval score: "
        f"{auc(scores, right)})."
    )


def _cost_line(questions: Sequence[GainQuestion], price: Any) -> str:
    parts = []
    for size in COST_SIZES:
        timed = [q.cost[str(size)] for q in questions if str(size) in q.cost]
        if not timed:
            continue
        scoring = float(np.mean([t["scoring_s"] for t in timed]))
        full = float(np.mean([t["full_s"] for t in timed]))
        parts.append(
            f"N = {size}: scoring {1000 * scoring:.0f} ms against {1000 * full:.0f} ms for a full "
            f"prefill of top-{size} ({100 * scoring / full:.1f}%, {len(timed)} questions)"
        )
    return "Cost of scoring, measured side by side: " + "; ".join(parts) + "." if parts else ""


def _set_table(
    dataset: str, questions: list[GainQuestion], chosen: dict[str, SetRule], price: Any
) -> tuple[str, list[dict[str, Any]], str]:
    max_k = min(q.max_k for q in questions)
    fixed_outcomes = [SetOutcome.of(fixed(k), questions, price) for k in range(1, max_k + 1)]
    best = max(fixed_outcomes, key=lambda o: o.mean_f1)
    rules: list[tuple[str, SetRule]] = [(f"best fixed: {best.rule.name}", best.rule)]
    rules += [(label, rule) for label, rule in chosen.items()]
    untuned = f"IGP's τ = {DEFAULT_THRESHOLD} (not fitted), gain order"
    rules += [
        (untuned, by_gain(DEFAULT_THRESHOLD, "gain")),
        (
            f"IGP's τ = {DEFAULT_THRESHOLD} (not fitted), retrieval order",
            by_gain(DEFAULT_THRESHOLD, "retrieval"),
        ),
    ]
    no_context = SetRule("no context", lambda q: [])
    rules += [
        ("no context", no_context),
        ("oracle depth (bound)", oracle_depth()),
        (f"oracle subset ≤ {best.rule.name[4:]} (bound)", oracle_subset(int(best.rule.name[4:]))),
        ("oracle subset (bound)", oracle_subset()),
    ]
    header = (
        f"### {dataset} ({len(questions)} questions)\n\n"
        "| rule | gold F1 [95% CI] | mean chunks | mean prompt tokens | TTFT s | "
        "F1 - best fixed [95% CI] | tokens vs best fixed |\n|---|---|---|---|---|---|---|"
    )
    fixed_line = " ".join(f"top-{o.rule.name[4:]} {o.mean_f1:.1f}" for o in fixed_outcomes)
    lines, rows, target = [header], [], "not met"
    outcomes: dict[str, SetOutcome] = {}
    for label, rule in rules:
        outcome = outcomes[label] = SetOutcome.of(rule, questions, price)
        f1 = bootstrap_interval(outcome.f1)
        diff = paired_difference(outcome.f1, best.f1).difference
        change = f"{diff.mean:+.1f} [{diff.low:+.1f}, {diff.high:+.1f}]"
        token_ratio = outcome.mean_tokens / best.mean_tokens
        lines.append(
            f"| {label} (`{rule.name}`) | {f1} | "
            f"{np.mean(outcome.chunks):.2f} | {outcome.mean_tokens:.0f} | "
            f"{np.mean(outcome.seconds):.2f} | {change} | "
            f"{100 * (token_ratio - 1):+.0f}% |"
        )
        rows.append(
            {
                "label": label,
                "rule": rule.name,
                "f1": outcome.mean_f1,
                "f1_interval": [f1.low, f1.high],
                "chunks": float(np.mean(outcome.chunks)),
                "tokens": outcome.mean_tokens,
                "ttft_s": float(np.mean(outcome.seconds)),
                "f1_minus_best_fixed": [diff.mean, diff.low, diff.high],
                "token_ratio": token_ratio,
            }
        )
        if label in chosen and target == "not met":
            if diff.mean >= 2 and diff.low > 0 and token_ratio <= 1:
                target = f"met by `{rule.name}` (+F1 at ≤ tokens)"
            elif token_ratio <= 0.7 and -1 < diff.low <= 0 <= diff.high:
                target = f"met by `{rule.name}` (fewer tokens)"
    lines.append("")
    lines.append(f"Fixed top-k F1: {fixed_line}.")
    lines.append(_fitted_against_untuned(outcomes["gain, gain order"], outcomes[untuned]))
    return "\n".join(lines), rows, target


def _fitted_against_untuned(fitted: SetOutcome, untuned: SetOutcome) -> str:
    """The calibrated gain rule paired with IGP's hand-made τ in the same (gain) order."""
    if fitted.rule.name == untuned.rule.name:
        return f"The fitted gain rule is IGP's `{untuned.rule.name}` itself."
    diff = paired_difference(fitted.f1, untuned.f1).difference
    return (
        f"Fitted `{fitted.rule.name}` - IGP's `{untuned.rule.name}` (paired F1): "
        f"{diff.mean:+.1f} [{diff.low:+.1f}, {diff.high:+.1f}]."
    )
