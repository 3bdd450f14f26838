"""``adarag bench``: AdaCache against its baselines on real QA data, with tables and plots.

``--dataset`` runs the policies over a query stream with power-law repeats (AdaCache's
figures); ``--workload`` runs every policy side by side on a workload and scores its answers
against the ``full`` policy's (:mod:`adarag.evaluation.side_by_side`). ``--report-only`` writes
the tables and plots of earlier runs again from their ``.json`` files, without a model.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

from adarag.cli.options import (
    add_model_arguments,
    answer_tokens,
    build_config,
    check_input_paths,
)
from adarag.config import AdaRagConfig
from adarag.errors import InputError
from adarag.evaluation.dataset_report import rewrite_dataset_report, write_dataset_report
from adarag.evaluation.harness import BenchRunner, QueryRecord
from adarag.evaluation.machine import machine
from adarag.evaluation.report import PolicySummary, summarize
from adarag.evaluation.side_by_side import (
    WORKLOADS,
    load_workload,
    policy_row,
    rewrite_workload_report,
    write_workload_report,
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
TOP_K = {"dataset": 6, "workload": 5}
"""Chunks per prompt unless ``--top-k`` says otherwise."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the command's options."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--dataset", nargs="+", choices=DATASETS, help="default: hotpotqa")
    source.add_argument(
        "--workload",
        nargs="+",
        choices=WORKLOADS,
        help="every policy side by side, answers scored against the full policy's",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help=f"the QA data sets' dev files (default ${DATA_DIR_ENV}, else ./data)",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=12,
        help="distinct questions per dataset; with --workload, queries per workload",
    )
    parser.add_argument("--offset", type=int, default=0, help="skip this many questions")
    parser.add_argument("--queries", type=int, default=24, help="stream length (>= --limit)")
    parser.add_argument("--zipf", type=float, default=1.1, help="power-law exponent of repeats")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument(
        "--policies",
        nargs="+",
        default=list(POLICIES),
        choices=list(POLICIES),
        help="the policies compared (default: all)",
    )
    parser.add_argument(
        "--top-k",
        type=int,
        help=f"chunks per prompt (default {TOP_K['dataset']}; {TOP_K['workload']} with --workload)",
    )
    parser.add_argument(
        "--top-k-sweep", type=int, nargs="*", default=[], help="also TTFT vs top-k (Figure 8)"
    )
    parser.add_argument(
        "--max-new-tokens",
        type=answer_tokens,
        default=16,
        help="answer tokens generated at most per question (default: 16)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=Path("bench-results"),
        help="folder the results are written to (default: bench-results)",
    )
    parser.add_argument("--work-dir", type=Path, help="scratch for caches (default: temporary)")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="write the tables and plots of the earlier runs under --output again from their "
        ".json files, without running a model",
    )
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run every dataset (or workload) and policy; write markdown, JSON and PNGs under --output."""
    args.top_k = args.top_k or TOP_K["workload" if args.workload else "dataset"]
    if not args.workload:
        args.dataset = args.dataset or ["hotpotqa"]
    if args.report_only:
        _rewrite_reports(args)
        return 0
    check_input_paths([args.data_dir], "--data-dir")
    config = build_config(args)
    measured_on = machine()
    engine = load_engine(config.engine, config.kernels, config.home)
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    args.output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.work_dir) as scratch:
        for name in args.workload or args.dataset:
            keep_logits = bool(args.workload)  # the first-token KL against full's
            runner = BenchRunner(engine, config, Path(scratch) / name, params, keep_logits)
            started = time.perf_counter()
            if args.workload:
                _run_workload(args, name, runner, measured_on)
            else:
                _run_dataset(args, config, name, runner, measured_on)
            print(f"{name}: done in {(time.perf_counter() - started) / 60:.1f} min")
    return 0


def _rewrite_reports(args: argparse.Namespace) -> None:
    """The tables and plots of every earlier run of the datasets (workloads) under --output."""
    if args.workload:
        paths = [p for w in args.workload for p in sorted(args.output.glob(f"{w}_*.json"))]
    else:
        paths = [
            args.output / f"{d}.json" for d in args.dataset if (args.output / f"{d}.json").is_file()
        ]
    if not paths:
        names = ", ".join(args.workload or args.dataset)
        raise InputError(
            f"--output: no earlier run of {names} under {args.output} (its .json files); "
            "run without --report-only first, or name the folder they were written to"
        )
    for path in paths:
        if args.workload:
            rewrite_workload_report(path)
        else:
            rewrite_dataset_report(path)
        print(f"rewrote the tables and plots of {path}")


def _run_workload(
    args: argparse.Namespace, workload: str, runner: BenchRunner, measured_on: dict[str, Any]
) -> None:
    """Every policy over ``workload`` (``full``, the reference, first): one row each."""
    questions, stream = load_workload(workload, args.data_dir, args.limit, args.top_k, args.seed)
    runner.ingest(questions)
    policies = list(dict.fromkeys(["full", *args.policies]))
    records = {name: runner.run(POLICIES[name], questions, stream, args.top_k) for name in policies}
    rows = [policy_row(name, records[name], records["full"], runner) for name in policies]
    model = runner.engine.checkpoint.name
    title = (
        f"{model}, {workload}: {len(stream)} queries, top-{args.top_k}, "
        f"{args.max_new_tokens} new tokens (greedy), seed {args.seed}"
    )
    stem = args.output / f"{workload}_{model}"
    write_workload_report(stem, title, rows, records, measured_on)
    print(stem.with_suffix(".md").read_text())


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
    table = write_dataset_report(
        args.output, dataset, title, records, summaries, sweep, measured_on
    )
    print(table)


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
