"""``depth.py run``: every augmentation step of every question, one JSON line per question."""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING

from adarag.engine.prefill_request import PrefillRequest
from adarag.evaluation.metrics import best_exact_match, best_f1
from adarag.schema import Chunk, GenerationParams
from runs.depth.splits import MAX_K, PROBE_RECORDS, ROWS, recorded_qids, retrieved_path

if TYPE_CHECKING:
    from adarag import AdaRAG

STATIC_EVERY = 3  # time full prefills for every third question (the static fit needs a few)


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

    out = ROWS[args.split] / args.model_dir / f"{args.dataset}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    done = recorded_qids(out)
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
        row = _question_row(rag, item, index_in_set, chunks, params, wall_s, steps)
        with out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        f1s = " ".join(f"{100 * s['f1']:.0f}" for s in row["steps"])
        print(f"[{index_in_set}] {wall_s:.1f} s  F1 by k: {f1s}", flush=True)


def _question_row(
    rag: AdaRAG,
    item: dict,
    index_in_set: int,
    chunks: list[Chunk],
    params: GenerationParams,
    wall_s: float,
    steps: list,
) -> dict:
    """A question's JSON line: its steps, prompt tokens and, every third, timed full prefills."""
    tokens = [
        rag.layout(item["question"], chunks[:k], params).num_tokens for k in range(1, MAX_K + 1)
    ]
    static = []
    timed_depths = (MAX_K, 1 + (index_in_set // STATIC_EVERY) % (MAX_K - 1))
    for k in timed_depths if index_in_set % STATIC_EVERY == 0 else ():
        layout = rag.layout(item["question"], chunks[:k], params)
        begun = time.perf_counter()
        rag.engine.prefill(PrefillRequest(layout, max_new_tokens=params.max_new_tokens))
        static.append({"k": k, "tokens": layout.num_tokens, "seconds": time.perf_counter() - begun})
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
    return row
