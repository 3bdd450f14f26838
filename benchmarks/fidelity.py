"""Fidelity benchmark: selection rules, levers and ratios against full recomputation.

For each model and data set, every question's prompt is prefilled in full (the reference) and
fused from its chunks' independent KV at each ratio under each rule (``random``, ``oracle`` and
``output_oracle`` are controls), then decoded greedily. Every question's rows are appended to
``<output>/<model>/<dataset><tag>.rows.jsonl`` as soon as it is measured, so a stopped run
resumes where it stopped (rows already there are not measured again) and several runs can share
the questions (``--shard i/n``). The report, rebuilt from all rows each time (or alone with
``--report-only``): ``<output>/<model><tag>.md`` with 95% bootstrap intervals on every figure,
the paired gold-F1 difference against full recomputation, and each rule's paired difference in
exact agreement against ``--baseline``; ``<model>/<dataset><tag>.json`` (summaries) and
``<model>/<dataset><tag>_agreement.png``.

    python benchmarks/fidelity.py --model qwen2.5-coder-0.5b --questions 40 --offset 40

Rules are named selections; ``--rule name:key=value,...`` adds one (e.g.
``sinks:selection_policy=kv_deviation,chunk_start_tokens=4``; the learned selector, windows of 4
and the routing ladder at a target: ``learned:selection_policy=learned``,
``learned+w4:selection_policy=learned,span_tokens=4``,
``ladder0.85:selection_policy=learned,target_agreement=0.85``, read from ``--profile`` or the
model's own profile). ``--fused n`` reuses FusionRAG's
fused entries instead of the independent KV: each chunk computed after its ``n`` most similar
passages of the data set's knowledge base (BM25 with the chunk's text; 2Wiki's corpus, HotpotQA's
and MuSiQue's pooled passages), rows named ``<rule>+fused<n>``; ``--fusion-gate g`` keeps a
chunk's independent KV unless ``g`` of its neighbours are in the prompt
(``<rule>+fused<n>in<g>``).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from common import DEFAULT_DATA_DIR, RESULTS, parse_rule

from adarag.config import DEFAULT_MODEL, FusionConfig, RecomputeConfig
from adarag.engine.provision import DEFAULT_PACKAGED_MODEL, PACKAGED_MODELS
from adarag.evaluation import corpora
from adarag.evaluation.fidelity import (
    FidelityRow,
    FidelitySummary,
    Target,
    append_rows,
    paired_rules,
    read_rows,
    smallest_ratio_meeting,
    summarize,
)
from adarag.evaluation.machine import describe_machine, machine
from adarag.evaluation.plots import pyplot
from adarag.evaluation.workload import DATASETS, FIDELITY_CHUNKS, load_questions
from adarag.retrievers.chunking import passage_text
from adarag.retrievers.memory import MemoryRetriever
from adarag.schema import Chunk

RATIOS = (0.0, 0.1, 0.2, 0.3, 0.5, 1.0)
BUILT_IN_RULES: dict[str, dict[str, Any]] = {
    "cross_attention": {"selection_policy": "cross_attention"},
    "kv_deviation": {"selection_policy": "kv_deviation"},
    "query_attention": {"selection_policy": "query_attention"},
    "random": {"selection_policy": "random"},
    "oracle": {"selection_policy": "oracle"},
    "output_oracle": {"selection_policy": "output_oracle"},
}


def main() -> None:
    args = _parse_args()
    rules = {name: RecomputeConfig(**BUILT_IN_RULES[name]) for name in args.rules}
    rules |= dict(parse_rule(text) for text in args.rule)
    model = _model_name(args.model)
    out = args.output / model
    if not args.report_only:
        _measure(args, rules, out)
    _report(args, model, out)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="default")
    parser.add_argument("--dataset", nargs="+", default=list(DATASETS), choices=DATASETS)
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--offset", type=int, default=40, help="skip this many questions")
    parser.add_argument("--shard", default="0/1", help="i/n: every n-th question from the i-th")
    parser.add_argument("--ratios", type=float, nargs="+", default=list(RATIOS))
    parser.add_argument("--rules", nargs="*", default=["kv_deviation"])
    parser.add_argument("--rule", action="append", default=[], help="name:key=value,...")
    parser.add_argument(
        "--baseline", default="kv_deviation", help="rule the others are paired with"
    )
    parser.add_argument(
        "--rule-ratios",
        action="append",
        default=[],
        metavar="NAME=R1,R2",
        help="measure rule NAME at these of --ratios only (e.g. ladder0.85=0.2)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--output", type=Path, default=RESULTS / "fidelity")
    parser.add_argument("--tag", default="", help="suffix of the output names")
    parser.add_argument(
        "--fused",
        type=int,
        metavar="N",
        help="reuse fused entries (each chunk after its N most similar passages)",
    )
    parser.add_argument(
        "--fusion-gate",
        type=int,
        default=0,
        metavar="G",
        help="with --fused: a chunk reuses its fused entry only when G of its neighbours are "
        "in the prompt (rows named <rule>+fused<N>in<G>)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="a model profile JSON whose learned selector and routing ladder the 'learned' and "
        "target_agreement rules read (default: the model's own profile)",
    )
    parser.add_argument("--report-only", action="store_true", help="rebuild the report from rows")
    parser.add_argument(
        "--storage",
        nargs="+",
        default=["float32"],
        choices=["float32", "float16", "bfloat16", "int8"],
        help="storage formats the reused KV passes through (rules named <rule>@<format>)",
    )
    return parser.parse_args()


def _model_name(model: str) -> str:
    """The checkpoint's directory name, without loading it (the report needs no model)."""
    name = DEFAULT_PACKAGED_MODEL if model == DEFAULT_MODEL else model
    packaged = PACKAGED_MODELS.get(name)
    return packaged.directory if packaged is not None else Path(name).name


def _measure(args: argparse.Namespace, rules: dict[str, RecomputeConfig], out: Path) -> None:
    from adarag import AdaRAG
    from adarag.evaluation.fidelity import FidelityRun
    from adarag.profiles import ModelProfile
    from adarag.schema import GenerationParams

    engine: dict[str, Any] = {"model": args.model}
    if args.threads:
        engine["num_threads"] = args.threads
    rag = AdaRAG(engine=engine)
    model = rag.engine.checkpoint.name
    assert model == out.name, f"model {model} writes under {out}"
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    fusion = None
    if args.fused:
        fusion = FusionConfig(num_neighbors=args.fused, min_neighbors_in_prompt=args.fusion_gate)
    index, count = (int(part) for part in args.shard.split("/"))
    profile = None
    if args.profile is not None:
        profile = ModelProfile.from_json(args.profile.read_text(), str(args.profile))
    for dataset in args.dataset:
        knowledge_base = _knowledge_base(dataset, args.data_dir) if args.fused else None
        run = FidelityRun(
            rag, rules, args.ratios, params, args.storage, knowledge_base, fusion, profile
        )
        only = _rule_ratios(args.rule_ratios)
        skipped = {
            (run.rule_name(rule, storage), ratio)
            for storage in args.storage
            for rule, ratios in only.items()
            for ratio in run.ratios
            if ratio not in ratios
        }
        names = [run.rule_name(rule, storage) for storage in args.storage for rule in rules]
        wanted = {(name, ratio) for name in names for ratio in run.ratios} - skipped
        path = out / f"{dataset}{args.tag}.rows.jsonl"
        questions = load_questions(
            dataset, args.data_dir, args.questions, FIDELITY_CHUNKS[dataset], args.offset
        )
        started = time.perf_counter()
        measured: dict[str, set[tuple[str, float]]] = {}
        for row in read_rows(path):  # read once; this run's own rows are added as it goes
            measured.setdefault(row.qid, set()).add((row.rule, row.ratio))
        for number, item in enumerate(questions):
            if number % count != index:
                continue
            done = measured.get(item.qid, set()) | skipped
            if wanted <= done:
                continue
            append_rows(path, run.question(dataset, item, done))
            print(
                f"{model} {dataset} #{args.offset + number} ({time.perf_counter() - started:.0f} s)"
            )


def _rule_ratios(specs: list[str]) -> dict[str, set[float]]:
    """``NAME=R1,R2`` specs as rule name -> the ratios it is measured at."""
    out = {}
    for spec in specs:
        name, _, ratios = spec.partition("=")
        out[name] = {float(ratio) for ratio in ratios.split(",") if ratio}
    return out


def _knowledge_base(dataset: str, data_dir: Path) -> MemoryRetriever:
    """Where fused entries find their neighbours, passages written as prompts hold them."""
    if dataset.startswith("2wikimqa"):
        return MemoryRetriever(corpora.corpus_chunks("2wikimqa", data_dir))
    texts = {
        passage_text(passage["text"], passage.get("title"))
        for row in corpora.questions(dataset, data_dir)
        for passage in row["passages"]
    }
    return MemoryRetriever([Chunk(text) for text in sorted(texts)])


def _report(args: argparse.Namespace, model: str, out: Path) -> None:
    """``<model><tag>.md``: the pooled table, the paired differences, one table per data set."""
    measured_on = machine()
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
            "summaries": [asdict(s) for s in summaries],
        }
        stem.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")
        _plot(summaries, title, stem.with_name(stem.name + "_agreement.png"))
        sections.append(_section(title, summaries, model))
    if not pooled:
        return
    count = len({(row.dataset, row.qid) for row in pooled})
    title = f"{model}, {len(sections)} data sets pooled ({count} questions)"
    parts = [_section(title, summarize(pooled), model), _paired(pooled, args.baseline), *sections]
    header = [
        f"# Fidelity: {model}",
        "",
        describe_machine(measured_on),
        "",
        "Every figure is a mean over questions with its 95% bootstrap interval in brackets. "
        "'gold F1 - full' is the paired difference against full recomputation of the same "
        "prompts. Exact agreement compares the whole greedy answer (up to the new-token budget) "
        "with full recomputation's.",
        "",
    ]
    (args.output / f"{model}{args.tag}.md").write_text("\n".join(header + parts) + "\n")


def _paired(rows: list[FidelityRow], baseline: str) -> str:
    """Each rule against ``baseline`` at each ratio: paired differences in exact agreement."""
    rules = list(dict.fromkeys(row.rule for row in rows))
    ratios = sorted({row.ratio for row in rows if 0.0 < row.ratio < 1.0})
    lines = [
        f"## Paired against {baseline} (exact agreement, points; 95% interval; p)",
        "",
        "| rule | " + " | ".join(f"{ratio:.2f}" for ratio in ratios) + " |",
        "|---|" + "---|" * len(ratios),
    ]
    for rule in rules:
        if rule == baseline:
            continue
        cells = []
        for ratio in ratios:
            found = paired_rules(rows, rule, baseline, ratio, "exact_agreement")
            cells.append("-" if found is None else f"{found} p={found.p_value:.2f}")
        lines.append(f"| {rule} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _section(title: str, summaries: list[FidelitySummary], model: str) -> str:
    target = Target(min_first_token_agreement=90.0) if "SmolLM2" in model else Target()
    lines = [
        f"## {title}",
        "",
        "| rule | ratio | recomputed | n | exact agree % | first-token agree % | first-token KL "
        "| gold F1 | gold F1 - full | TTFT s (full) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {s.rule} | {s.ratio:.2f} | {100 * s.recomputed_share:.0f}% | {s.num_questions} "
            f"| {s.exact_interval} | {s.first_token_interval} | {s.first_token_kl:.3f} "
            f"| {s.gold_f1_interval} | {s.gold_f1_vs_full} "
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
            style = ":" if "oracle" in rule or rule == "random" else "-"
            axis.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", label=rule)
        axis.set_xlabel("recomputed share of each chunk")
        axis.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
