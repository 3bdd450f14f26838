"""Fidelity benchmark: each selection rule and ratio against full recomputation of the same prompt.

For each model and data set, every question's prompt is prefilled in full (the reference) and
fused from its chunks' independent KV at each ratio under each rule (``random`` and ``oracle``
are controls), then decoded greedily. Writes, under ``--output`` (default
``benchmarks/results/fidelity``): ``<model>/<dataset>.json`` (every row), ``<model>.md`` (tables)
and ``<model>/<dataset>_agreement.png`` (agreement vs ratio per rule).

    python benchmarks/fidelity.py --model qwen2.5-coder-0.5b --questions 20 --offset 40

Rules are named selections; ``--rule name:key=value,...`` adds one (e.g.
``qa_global:selection_policy=query_attention,budget=global``).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from common import DEFAULT_DATA_DIR, RESULTS

from adarag import AdaRAG
from adarag.config import RecomputeConfig
from adarag.evaluation.fidelity import (
    FidelityRow,
    FidelityRun,
    FidelitySummary,
    Target,
    smallest_ratio_meeting,
    summarize,
)
from adarag.evaluation.machine import describe_machine, machine
from adarag.evaluation.plots import pyplot
from adarag.evaluation.workload import DATASETS, load_questions
from adarag.schema import GenerationParams

RATIOS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
BUILT_IN_RULES = {
    "cross_attention": {"selection_policy": "cross_attention"},
    "kv_deviation": {"selection_policy": "kv_deviation"},
    "query_attention": {"selection_policy": "query_attention"},
    "random": {"selection_policy": "random"},
    "oracle": {"selection_policy": "oracle"},
}
CHUNKS_PER_DATASET = {"musique": 4, "hotpotqa": 6, "2wikimqa": 6, "2wikimqa-gold": 6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="default")
    parser.add_argument("--dataset", nargs="+", default=list(DATASETS), choices=DATASETS)
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--offset", type=int, default=40, help="skip this many questions")
    parser.add_argument("--ratios", type=float, nargs="+", default=list(RATIOS))
    parser.add_argument("--rules", nargs="+", default=list(BUILT_IN_RULES))
    parser.add_argument("--rule", action="append", default=[], help="name:key=value,...")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--output", type=Path, default=RESULTS / "fidelity")
    parser.add_argument("--tag", default="", help="suffix of the output names")
    parser.add_argument(
        "--storage",
        nargs="+",
        default=["float32"],
        choices=["float32", "float16", "bfloat16", "int8"],
        help="storage formats the reused KV passes through (rules named <rule>@<format>)",
    )
    args = parser.parse_args()

    rules = {name: RecomputeConfig(**BUILT_IN_RULES[name]) for name in args.rules}
    rules |= dict(_parse_rule(text) for text in args.rule)
    engine: dict[str, Any] = {"model": args.model}
    if args.threads:
        engine["num_threads"] = args.threads
    rag = AdaRAG(engine=engine)
    model = rag.generator.checkpoint.name
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    run = FidelityRun(rag, rules, args.ratios, params, args.storage)
    out = args.output / model
    out.mkdir(parents=True, exist_ok=True)
    measured_on = machine()
    sections: dict[str, str] = {}
    pooled: list[FidelityRow] = []
    for dataset in args.dataset:
        started = time.perf_counter()
        questions = load_questions(
            dataset, args.data_dir, args.questions, CHUNKS_PER_DATASET[dataset], args.offset
        )
        rows: list[FidelityRow] = []
        for idx, item in enumerate(questions, 1):
            rows += run.question(dataset, item)
            print(
                f"{model} {dataset} {idx}/{len(questions)} ({time.perf_counter() - started:.0f} s)"
            )
            # written after every question, so a run stopped early keeps what it measured
            title = (
                f"{model}, {dataset}: {idx} questions from #{args.offset}, "
                f"{CHUNKS_PER_DATASET[dataset]} chunks, {args.max_new_tokens} new tokens (greedy)"
            )
            sections[dataset] = _write_dataset(
                out / f"{dataset}{args.tag}", title, rows, rules, measured_on, model
            )
            _write_report(args, model, measured_on, sections, pooled + rows)
        pooled += rows
        print(sections.get(dataset, ""))


def _write_dataset(
    stem: Path,
    title: str,
    rows: list[FidelityRow],
    rules: dict[str, RecomputeConfig],
    measured_on: dict[str, Any],
    model: str,
) -> str:
    """The data set's JSON and plot; returns its markdown section."""
    summaries = summarize(rows)
    payload = {
        "title": title,
        "machine": measured_on,
        "rules": {name: rule.model_dump() for name, rule in rules.items()},
        "summaries": [asdict(s) for s in summaries],
        "rows": [asdict(r) for r in rows],
    }
    stem.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")
    _plot(summaries, title, stem.with_name(stem.name + "_agreement.png"))
    return _section(title, summaries, model)


def _write_report(
    args: argparse.Namespace,
    model: str,
    measured_on: dict[str, Any],
    sections: dict[str, str],
    pooled: list[FidelityRow],
) -> None:
    """``<model>.md``: the pooled table (with several data sets), then one per data set."""
    parts = list(sections.values())
    if len(sections) > 1:
        count = len({(row.dataset, row.qid) for row in pooled})
        title = f"{model}, {len(sections)} data sets pooled ({count} questions)"
        parts.insert(0, _section(title, summarize(pooled), model))
    header = [f"# Fidelity: {model}", "", describe_machine(measured_on), ""]
    (args.output / f"{model}{args.tag}.md").write_text("\n".join(header + parts) + "\n")


def _parse_rule(text: str) -> tuple[str, RecomputeConfig]:
    name, _, spec = text.partition(":")
    knobs: dict[str, Any] = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        knobs[key] = _value(value)
    return name, RecomputeConfig(**knobs)


def _value(text: str) -> Any:
    if "-" in text and all(part.isdigit() for part in text.split("-")):
        first, last = text.split("-")
        return (int(first), int(last))
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return None if text == "none" else text


def _section(title: str, summaries: list[FidelitySummary], model: str) -> str:
    target = Target(min_first_token_agreement=90.0) if "SmolLM2" in model else Target()
    lines = [
        f"## {title}",
        "",
        "| rule | ratio | exact agree % | F1 agree % | first-token agree % | first-token KL "
        "| gold EM | gold F1 (full) | gold contains | TTFT s (full) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {s.rule} | {s.ratio:.2f} | {s.exact_agreement:.0f} | {s.f1_agreement:.1f} "
            f"| {s.first_token_agreement:.0f} | {s.first_token_kl:.3f} | {s.gold_em:.1f} "
            f"| {s.gold_f1:.1f} ({s.reference_gold_f1:.1f}) | {s.gold_contains:.0f} "
            f"| {s.ttft_s:.2f} ({s.full_ttft_s:.2f}) |"
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
            style = ":" if rule in ("random", "oracle") else "-"
            axis.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", label=rule)
        axis.set_xlabel("recomputed share of each chunk")
        axis.set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
