"""Adaptive depth against every fixed top-k, over real retrieval (Chroma, no gold forced in).

Three stages, each resumable:

``retrieve``: each data set's knowledge base (``adarag.evaluation.corpora``) is embedded into an
on-disk Chroma (all-MiniLM-L6-v2) once, and every question's top-12 chunks are written with their
scores to ``<cache>/<dataset>.retrieved.jsonl``.

``run``: per question, every augmentation step k = 1..12 (``record_depth``: step k
reuses steps 1..k-1's exact KV from the hard tier and computes chunk k and the question; no other
tier, float32 store, so step k's answer is the full-recomputation answer of static top-k) with
its answer, gold F1, lens confidence, first-token margin, answer stability and wall time; plus
full prefills of the top-12 prompt and of one more depth (cycling over 1..11), every third
question, for the static TTFT fit. One JSON line per question in
``results/depth/<model>/<dataset>.jsonl``; the depth probe's features of every step (the residual
stream at three layers, the lens signals, the retrieval scores) go to
``<cache>/depth-probe/<model>/<dataset>/`` (large; out of the repository).

``--split calibration`` retrieves and runs other questions of each set, none of the report's:
the depth probe is fitted on them (``adarag calibrate --depth --dataset 2wikimqa hotpotqa
musique --records <cache>/depth-probe-calibration/<model>``); their JSON lines go to
``<cache>/depth-calibration/``.

``report``: fixed top-k for k = 1..12, the adaptive rules (thresholds chosen on the calibration
questions, figures on the report questions) and the per-question oracle depth; tables and plots
in ``results/depth/``.

    python benchmarks/depth_pareto.py retrieve
    python benchmarks/depth_pareto.py run --model qwen2.5-coder-0.5b --dataset hotpotqa
    python benchmarks/depth_pareto.py report
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from common import DEFAULT_DATA_DIR, RESULTS

from adarag.evaluation.corpora import (
    RETRIEVAL_DATASETS,
    corpus_chunks,
    gold_titles,
    is_gold,
    questions,
)
from adarag.evaluation.metrics import best_exact_match, best_f1
from adarag.schema import Chunk, GenerationParams

if TYPE_CHECKING:
    from adarag import AdaRAG

MAX_K = 12
OUTPUT = RESULTS / "depth"
STATIC_EVERY = 3  # time full prefills for every third question (the static fit needs a few)
CACHE = Path(os.environ.get("ADARAG_BENCH_CACHE", Path.home() / ".cache" / "adarag-bench"))
# questions per data set: the first CALIBRATION choose the rules' thresholds, the rest report
OFFSETS = {"2wikimqa": 100, "hotpotqa": 100, "musique": 40}
REPORTED = 45  # questions from each offset: 5 calibrate the hand-made rules, 40 report
PROBE_RECORDS = {"report": CACHE / "depth-probe", "calibration": CACHE / "depth-probe-calibration"}


def split_rows(rows: list[dict], dataset: str, split: str, count: int) -> list[dict]:
    """The questions of ``split``: the report's (from the offset), or ``count`` others."""
    start = OFFSETS[dataset]
    if split == "report":
        return rows[start : start + count]
    others = rows[:start] + rows[start + REPORTED :]
    return others[:count]


def retrieved_path(dataset: str, split: str) -> Path:
    """Where a split's top-12 per question are written."""
    infix = "" if split == "report" else ".calibration"
    return CACHE / f"{dataset}{infix}.retrieved.jsonl"


def retrieve(args: argparse.Namespace) -> None:
    """Embed each corpus into Chroma (once) and write every question's top-12."""
    from adarag.config import RetrievalConfig
    from adarag.retrievers import KnowledgeBase

    for dataset in args.datasets:
        path = retrieved_path(dataset, args.split)
        if path.exists():
            print(f"{path} exists")
            continue
        config = RetrievalConfig(collection=f"depth-{dataset}", chroma_directory=CACHE / "chroma")
        with KnowledgeBase(config) as kb:
            chunks = corpus_chunks(dataset, args.data_dir)
            if kb.count() < len(chunks):
                started = time.perf_counter()
                kb.add_chunks(chunks, source=dataset)
                print(
                    f"{dataset}: {len(chunks)} chunks embedded in "
                    f"{time.perf_counter() - started:.0f} s"
                )
            rows = questions(dataset, args.data_dir)
            selected = split_rows(rows, dataset, args.split, args.questions)
            lines = []
            for row in selected:
                found = kb.retrieve(row["question"], MAX_K)
                titles = gold_titles(dataset, row)
                lines.append(
                    json.dumps(
                        {
                            "qid": str(row["id"]),
                            "question": row["question"],
                            "answers": row["answers"],
                            "type": row.get("type"),
                            "num_gold": len(titles),
                            "chunks": [
                                {
                                    "id": c.chunk_id,
                                    "text": c.text,
                                    "score": c.score,
                                    "gold": is_gold(c, titles, row["answers"]),
                                }
                                for c in found
                            ],
                        }
                    )
                )
        path.write_text("\n".join(lines) + "\n")
        print(f"{dataset}: {len(lines)} questions retrieved -> {path}")


def hard_tier_pipeline(
    model: str, threads: int, storage_dtype: str = "float32", **levers: object
) -> AdaRAG:
    """A pipeline of ``model`` whose only tier is the hard one, its store in memory.

    Step k's answer is then static top-k's with a float32 store (``exact_steps``).
    """
    from adarag import AdaRAG, AdaRagConfig
    from adarag.evaluation.profiling.depth_probe import exact_steps

    config = AdaRagConfig.build(engine={"model": model, "num_threads": threads})
    return AdaRAG(exact_steps(config, storage_dtype, **levers))


def run(args: argparse.Namespace) -> None:
    """Every step of every question (resuming after the questions already written)."""
    from adarag.evaluation.profiling.calibration import answer_each_step
    from adarag.evaluation.profiling.depth_probe import (
        has_depth_record,
        probe_layers,
        record_depth,
        save_depth_record,
    )

    root = OUTPUT if args.split == "report" else CACHE / "depth-calibration"
    out = root / args.model_dir / f"{args.dataset}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    done = (
        {json.loads(line)["qid"] for line in out.read_text().splitlines()}
        if out.exists()
        else set()
    )
    items = [json.loads(line) for line in retrieved_path(args.dataset, args.split).open()]
    items = items[: args.questions]
    rag = hard_tier_pipeline(args.model, args.threads)
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    layers = probe_layers(rag.engine.spec.num_layers)
    probes = PROBE_RECORDS[args.split] / args.model_dir
    answer_each_step(rag, rag.layout("warm-up?", ["A short passage."], params), params)
    index, count = (int(part) for part in args.shard.split("/"))
    for index_in_set, item in enumerate(items):
        if index_in_set % count != index:
            continue
        probed = has_depth_record(probes, args.dataset, item["qid"])
        if item["qid"] in done and probed:
            continue
        chunks = [Chunk(c["text"], c["id"], c["score"]) for c in item["chunks"]]
        started = time.perf_counter()
        record, steps = record_depth(
            rag,
            args.dataset,
            item["qid"],
            item["question"],
            chunks,
            item["answers"],
            params,
            layers,
        )
        wall_s = time.perf_counter() - started
        save_depth_record(probes, record)
        if item["qid"] in done:  # the JSON line is there already (the same greedy answers)
            continue
        tokens = [
            rag.layout(item["question"], chunks[:k], params).num_tokens for k in range(1, MAX_K + 1)
        ]
        static = []
        timed_depths = (MAX_K, 1 + (index_in_set // STATIC_EVERY) % (MAX_K - 1))
        for k in timed_depths if index_in_set % STATIC_EVERY == 0 else ():
            layout = rag.layout(item["question"], chunks[:k], params)
            begun = time.perf_counter()
            rag.engine.prefill(layout, max_new_tokens=params.max_new_tokens)
            static.append(
                {"k": k, "tokens": layout.num_tokens, "seconds": time.perf_counter() - begun}
            )
        row = {
            "qid": item["qid"],
            "index": index_in_set,
            "type": item["type"],
            "scores": [c["score"] for c in item["chunks"]],
            "gold": [c["gold"] for c in item["chunks"]],
            "num_gold": item["num_gold"],
            "prompt_tokens": tokens,
            "wall_s": wall_s,
            "static": static,
            "steps": [
                {
                    "processed": trace.num_processed_tokens,
                    "step_s": trace.prefill_s + trace.confidence_s,
                    "confidence": trace.confidence,
                    "margin": trace.margin,
                    "stable": trace.is_stable,
                    "answer": answer,
                    "f1": best_f1(answer, item["answers"]),
                    "em": best_exact_match(answer, item["answers"]),
                }
                for trace, answer in steps
            ],
        }
        with out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        f1s = " ".join(f"{100 * s['f1']:.0f}" for s in row["steps"])
        print(f"[{index_in_set}] {wall_s:.1f} s  F1 by k: {f1s}", flush=True)


def report(args: argparse.Namespace) -> None:
    """Tables and plots from every recorded question."""
    from depth_report import write_report

    write_report(OUTPUT, args.calibration, PROBE_RECORDS["report"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    stage = sub.add_parser("retrieve")
    stage.add_argument("--datasets", nargs="+", default=list(RETRIEVAL_DATASETS))
    stage.add_argument("--questions", type=int, default=60)
    stage.add_argument("--split", choices=("report", "calibration"), default="report")
    stage.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    stage.set_defaults(fn=retrieve)
    stage = sub.add_parser("run")
    stage.add_argument("--model", default="smollm2-135m")
    stage.add_argument("--dataset", choices=RETRIEVAL_DATASETS, required=True)
    stage.add_argument("--questions", type=int, default=60)
    stage.add_argument("--threads", type=int, default=1)
    stage.add_argument("--max-new-tokens", type=int, default=16)
    stage.add_argument("--split", choices=("report", "calibration"), default="report")
    stage.add_argument("--shard", default="0/1", help="i/n: every n-th question from the i-th")
    stage.set_defaults(fn=run)
    stage = sub.add_parser("report")
    stage.add_argument(
        "--calibration",
        type=int,
        default=5,
        help="the first N questions of each set choose the rules' thresholds",
    )
    stage.set_defaults(fn=report)
    args = parser.parse_args()
    if args.stage == "run":
        args.model_dir = {
            "smollm2-135m": "SmolLM2-135M-Instruct",
            "qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B-Instruct",
        }.get(args.model, Path(args.model).name)
    args.fn(args)


if __name__ == "__main__":
    main()
