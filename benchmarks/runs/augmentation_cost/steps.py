"""``augmentation_cost.py steps``: one augmentation step's cost, with and without the step cache."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from common import CACHE, machine, write_results

from adarag import AdaRAG
from adarag.augment.step_cost import StepCostModel
from adarag.evaluation.machine import describe_machine
from adarag.schema import Chunk, GenerationParams
from runs.augmentation_cost import OUTPUT
from runs.depth.run import hard_tier_pipeline
from runs.depth.splits import MAX_K

STEP_VARIANTS = {"new cache per step": False, "previous step's cache": True}


def steps(rag: AdaRAG, question: str, chunks: list[Chunk]) -> list[tuple[int, float, torch.Tensor]]:
    """(processed tokens, seconds, logits) of every step of one question."""
    layout = rag.layout(question, chunks, GenerationParams(max_new_tokens=16))
    out = []
    started = time.perf_counter()
    for step in rag.augmentation.prefill_steps(layout, 16):  # each yielded after its write-back
        out.append(
            (step.result.num_processed_tokens, time.perf_counter() - started, step.output.logits)
        )
        started = time.perf_counter()
    return out


def step_cost(args: argparse.Namespace) -> None:
    """The ``steps`` subcommand: each variant's fit of a step's time."""
    items = [json.loads(line) for line in (CACHE / f"{args.dataset}.retrieved.jsonl").open()]
    items = items[args.offset : args.offset + args.questions]
    rags = {
        name: hard_tier_pipeline(args.model, args.threads, args.storage_dtype, reuse_step_kv=reuse)
        for name, reuse in STEP_VARIANTS.items()
    }
    for rag in rags.values():
        steps(rag, "warm-up?", [Chunk("A short passage."), Chunk("Another one.")])
    timed, max_diff = _time_steps(rags, items)
    _write_step_cost(args, rags, len(items), timed, max_diff)


def _time_steps(
    rags: dict[str, AdaRAG], items: list[dict]
) -> tuple[dict[str, list[tuple[int, float]]], float]:
    """Each variant's processed tokens and seconds per step, and the variants' largest logit gap."""
    timed: dict[str, list[tuple[int, float]]] = {name: [] for name in rags}
    max_diff = 0.0
    for index, item in enumerate(items):
        chunks = [Chunk(c["text"], c["id"], c["score"]) for c in item["chunks"][:MAX_K]]
        order = list(rags) if index % 2 == 0 else list(reversed(rags))
        logits = {}
        for name in order:
            result = steps(rags[name], item["question"], chunks)
            timed[name] += [(tokens, seconds) for tokens, seconds, _ in result]
            logits[name] = [row[2] for row in result]
        for a, b in zip(*logits.values(), strict=True):
            max_diff = max(max_diff, float((a - b).abs().max()))
        print(
            f"[{index}] "
            + "  ".join(
                f"{name}: {sum(s for _, s in timed[name][-MAX_K:]):.2f} s" for name in rags
            ),
            flush=True,
        )
    return timed, max_diff


def _write_step_cost(
    args: argparse.Namespace,
    rags: dict[str, AdaRAG],
    num_questions: int,
    timed: dict[str, list[tuple[int, float]]],
    max_diff: float,
) -> None:
    """``step_cost_<model>_<storage dtype>.{md,json}``: each variant's fit."""
    fits = {
        name: StepCostModel.fit([t for t, _ in rows], [s for _, s in rows])
        for name, rows in timed.items()
    }
    model = Path(rags["new cache per step"].config.engine.model).name
    lines = [
        f"# Augmentation step cost, {model}",
        "",
        f"`python benchmarks/augmentation_cost.py steps --model {args.model} "
        f"--questions {args.questions} --threads {args.threads} "
        f"--storage-dtype {args.storage_dtype}`. "
        f"{describe_machine(machine())} {num_questions} {args.dataset} questions x "
        f"{MAX_K} steps per variant, in one process, alternating. Largest logit difference "
        f"between the variants: {max_diff:.2e}.",
        "",
        "| variant | fixed s per step | ms per processed token | mean step s | 12 steps s |",
        "|---|---|---|---|---|",
    ]
    for name, rows in timed.items():
        seconds = [s for _, s in rows]
        lines.append(
            f"| {name} | {fits[name].fixed_s:.3f} | {1e3 * fits[name].per_token_s:.3f} | "
            f"{statistics.fmean(seconds):.3f} | {MAX_K * statistics.fmean(seconds):.2f} |"
        )
    payload = {
        "machine": machine(),
        "storage_dtype": args.storage_dtype,
        "model": model,
        "questions": num_questions,
        "max_logit_diff": max_diff,
        "fits": {n: {"fixed_s": f.fixed_s, "per_token_s": f.per_token_s} for n, f in fits.items()},
        "steps": timed,
    }
    write_results(
        f"step_cost_{model}_{args.storage_dtype}", payload, "\n".join(lines), directory=OUTPUT
    )
    print("\n".join(lines))
