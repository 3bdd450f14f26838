"""``adarag bench``: AdaCache against its baselines on real QA data, with tables and plots."""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from adarag.cli.options import (
    add_model_arguments,
    answer_tokens,
    build_config,
    check_input_paths,
)
from adarag.config import AdaRagConfig
from adarag.evaluation import plots
from adarag.evaluation.harness import BenchRunner, QueryRecord
from adarag.evaluation.machine import describe_machine, machine
from adarag.evaluation.report import (
    PolicySummary,
    by_question_type,
    markdown_table,
    speedups,
    summarize,
)
from adarag.evaluation.workload import (
    DATA_DIR_ENV,
    DATASETS,
    DEFAULT_DATA_DIR,
    load_questions,
    query_stream,
)
from adarag.pipeline.backends import load_engine
from adarag.policies import POLICIES
from adarag.retrievers.knowledge_base import KnowledgeBase
from adarag.schema import GenerationParams

HELP = "benchmark AdaCache against full recomputation, prefix caching, PromptCache, CacheBlend"
SWEEP_POLICIES = ("full", "prefix", "cacheblend", "adacache")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the command's options."""
    parser.add_argument("--dataset", nargs="+", default=["hotpotqa"], choices=DATASETS)
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help=f"the QA data sets' dev files (default ${DATA_DIR_ENV}, else ./data)",
    )
    parser.add_argument("--limit", type=int, default=12, help="distinct questions per dataset")
    parser.add_argument("--offset", type=int, default=0, help="skip this many questions")
    parser.add_argument("--queries", type=int, default=24, help="stream length (>= --limit)")
    parser.add_argument("--zipf", type=float, default=1.1, help="power-law exponent of repeats")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    parser.add_argument("--top-k", type=int, default=6)
    parser.add_argument(
        "--top-k-sweep", type=int, nargs="*", default=[], help="also TTFT vs top-k (Figure 8)"
    )
    parser.add_argument("--max-new-tokens", type=answer_tokens, default=16)
    parser.add_argument("--output", type=Path, default=Path("bench-results"))
    parser.add_argument("--work-dir", type=Path, help="scratch for caches (default: temporary)")
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run every dataset and policy; write markdown, JSON and PNGs under ``--output``."""
    check_input_paths([args.data_dir], "--data-dir")
    config = build_config(args)
    measured_on = machine()
    engine = load_engine(config.engine, config.kernels, config.home)
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    args.output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.work_dir) as scratch:
        for dataset in args.dataset:
            runner = BenchRunner(engine, config, Path(scratch) / dataset, params)
            started = time.perf_counter()
            _run_dataset(args, config, dataset, runner, measured_on)
            print(f"{dataset}: done in {(time.perf_counter() - started) / 60:.1f} min")
    return 0


def _run_dataset(
    args: argparse.Namespace,
    config: AdaRagConfig,
    dataset: str,
    runner: BenchRunner,
    measured_on: dict[str, Any],
) -> None:
    top_ks = sorted({args.top_k, *args.top_k_sweep})
    with contextlib.ExitStack() as stack:
        retriever = None
        if dataset == "2wikimqa":
            retriever = stack.enter_context(_corpus_knowledge_base(args, config, runner))
        questions = load_questions(
            dataset, args.data_dir, args.limit, max(top_ks), args.offset, corpus_retriever=retriever
        )
    stream = query_stream(len(questions), max(args.queries, len(questions)), args.zipf, args.seed)
    runner.ingest(questions)
    records: list[QueryRecord] = []
    for name in args.policies:
        records += runner.run(POLICIES[name], questions, stream, args.top_k)
    twins = {p.name: p.static_twin for p in POLICIES.values() if p.static_twin}
    summaries = summarize(records, twins)
    first = f" from #{args.offset}" if args.offset else ""
    title = f"{dataset}: {len(questions)} questions{first}, {len(stream)} queries, top-{args.top_k}"
    # Every point of the sweep answers each question once (cold caches), the main top-k too.
    once = query_stream(len(questions), len(questions), args.zipf, args.seed)
    sweep: dict[int, list[PolicySummary]] = {}
    for k in top_ks if args.top_k_sweep else []:
        runs = [r for p in SWEEP_POLICIES for r in runner.run(POLICIES[p], questions, once, k)]
        sweep[k] = summarize(runs, twins)
    _write(args, dataset, title, records, summaries, sweep, measured_on)


def _write(
    args: argparse.Namespace,
    dataset: str,
    title: str,
    records: list[QueryRecord],
    summaries: list[PolicySummary],
    sweep: dict[int, list[PolicySummary]],
    measured_on: dict[str, Any],
) -> None:
    out = args.output
    table = markdown_table(summaries)
    ratios = speedups(summaries)
    lines = [f"## {title}", "", describe_machine(measured_on), "", table, ""]
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
    (out / f"{dataset}.md").write_text("\n".join(lines) + "\n")
    payload = {
        "title": title,
        "machine": measured_on,
        "summaries": [asdict(s) for s in summaries],
        "speedups": ratios,
        "records": [asdict(r) for r in records],
        "top_k_sweep": {k: [asdict(s) for s in v] for k, v in sweep.items()},
    }
    (out / f"{dataset}.json").write_text(json.dumps(payload, indent=1) + "\n")
    plots.ttft_vs_quality(summaries, title, out / f"{dataset}_ttft_vs_f1.png")
    augmenting = [name for name in args.policies if POLICIES[name].augments]
    plots.depth_histogram(records, augmenting, args.top_k, title, out / f"{dataset}_depths.png")
    if len(sweep) > 1:
        sweep_title = f"{dataset}: TTFT vs top-k, each question once (cold caches)"
        plots.ttft_vs_top_k(sweep, sweep_title, out / f"{dataset}_ttft_vs_topk.png")
    print("\n".join(lines))


def _corpus_knowledge_base(
    args: argparse.Namespace, config: AdaRagConfig, runner: BenchRunner
) -> KnowledgeBase:
    """2WikiMultihopQA's corpus in the Chroma knowledge base under the home (ingested once).

    Nearly every passage is one chunk (6,119 passages make 6,962 chunks of at most
    ``retrieval.chunk_tokens``), and no similarity floor applies, so each question gets its
    full top-k.
    """
    retrieval = config.retrieval.model_copy(
        update={"collection": "bench-2wikimqa-corpus", "min_top_score": None}
    )
    kb = KnowledgeBase(retrieval, config.home)
    try:
        report = kb.ingest(
            [args.data_dir / "2wikimqa_corpus.jsonl"], tokenizer=runner.engine.tokenizer
        )
    except BaseException:
        kb.close()
        raise
    print(f"2wikimqa corpus: {kb.count()} chunks in Chroma ({len(report.added)} new)")
    return kb
