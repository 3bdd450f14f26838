"""``fidelity.py run``: measure the missing rows of every question, then the report."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from common import machine, parse_rule, pipeline_for, rows_dir

from adarag.config import FusionConfig, RecomputeConfig
from adarag.evaluation import corpora
from adarag.evaluation.fidelity import append_rows, read_rows
from adarag.evaluation.workload import FIDELITY_CHUNKS, load_questions
from adarag.retrievers.chunking import passage_text
from adarag.retrievers.memory import MemoryRetriever
from adarag.schema import Chunk
from runs.fidelity.report import record_sitting, write_report
from runs.fidelity.rows import model_name

RATIOS = (0.0, 0.1, 0.2, 0.3, 0.5, 1.0)
BUILT_IN_RULES: dict[str, dict[str, Any]] = {
    "cross_attention": {"selection_policy": "cross_attention"},
    "kv_deviation": {"selection_policy": "kv_deviation"},
    "query_attention": {"selection_policy": "query_attention"},
    "random": {"selection_policy": "random"},
    "oracle": {"selection_policy": "oracle"},
    "output_oracle": {"selection_policy": "output_oracle"},
}


def run(args: argparse.Namespace) -> None:
    """The ``run`` subcommand: measure the missing rows, then the report from every row."""
    rules = {name: RecomputeConfig(**BUILT_IN_RULES[name]) for name in args.rules}
    rules |= dict(parse_rule(text) for text in args.rule)
    model = model_name(args.model)
    rows = rows_dir(args.output) / model
    if not args.report_only:
        _measure(args, rules, rows)
    write_report(args, model, rows)


def _measure(args: argparse.Namespace, rules: dict[str, RecomputeConfig], out: Path) -> None:
    """Every missing row of every question, appended to ``out/<dataset><tag>.rows.jsonl``."""
    from adarag.evaluation.fidelity import FidelityRun
    from adarag.profiles import ModelProfile
    from adarag.schema import GenerationParams

    rag = pipeline_for(args.model, args.threads)
    model = rag.engine.checkpoint.name
    assert model == out.name, f"model {model} writes under {out}"
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    fusion = None
    if args.fused:
        fusion = FusionConfig(num_neighbors=args.fused, min_neighbors_in_prompt=args.fusion_gate)
    index, count = (int(part) for part in args.shard.split("/"))
    before = sum(len(read_rows(out / f"{name}{args.tag}.rows.jsonl")) for name in args.dataset)
    sitting: dict[str, Any] | None = {**machine(), "rows_before": before}  # recorded on first use
    profile = None
    if args.profile is not None:
        profile = ModelProfile.read(args.profile.parent, args.profile.name)
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
            if sitting is not None:  # a run that measures nothing is not one of the rows' runs
                record_sitting(out, args.tag, sitting)
                sitting = None
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
