"""What adaptive augmentation costs: the confidence check, and one step with and without reuse.

``confidence``: the augmentation confidence check against the prefill of the same step. Each
question's top-6 passages (BM25 among its own, as ``adarag bench`` ranks them) have their
independent KV precomputed (as ingest does); then the pipeline answers with adaptive augmentation,
so every step is a real one: earlier chunks from the hard tier, the new one from the independent
tier. The prefill projects the last l layers' hidden states through the LM head in the GEMM that
yields the decoding logits, so the check costs

- the extra rows of that GEMM: the head over l rows minus over one row, timed on the real model's
  hidden states (median of many runs; the same for every step), plus
- the reduction to KL and entropy (``StepTrace.confidence_s``, timed in every step).

For comparison, the separate logit-lens pass over the hidden states (what a check costs when the
prefill does not provide the logits) is timed too.

``steps``: what one augmentation step costs, with and without prefilling into the previous step's
KV. Each question's 12 steps (its top-12 chunks from ``depth.py retrieve``: step k finds chunks
1..k-1 in the hard tier, computes chunk k and the question) run twice in one process,
``experimental.augment.reuse_step_kv`` off and on, in alternating order. A step's time is its
whole wall time: tier lookup, fused prefill, lens check and write-back. The fit ``fixed +
per_token x processed`` over all steps gives the per-step fixed cost of each variant; the
logits of the two are checked to be equal (float32 store: the rows left in place are the ones
the hard tier would load).

``step-cache``: first tokens of every augmentation step with and without the previous step's KV
cache. With the default bfloat16 store a hard hit loaded from the store is rounded, while the rows
the previous step's cache keeps are not. Each step's logits (8 HotpotQA questions x 12 steps, as
``steps`` runs them) are compared with the exact ones of a float32 store.

    python benchmarks/augmentation_cost.py confidence --questions 20
    python benchmarks/augmentation_cost.py steps --model qwen2.5-coder-0.5b --questions 8
    python benchmarks/augmentation_cost.py step-cache --model qwen2.5-coder-0.5b
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from common import CACHE, DEFAULT_DATA_DIR, RESULTS, machine, run_subcommand, write_results
from runs.depth.run import hard_tier_pipeline
from runs.depth.splits import MAX_K

from adarag import AdaRAG
from adarag.augment.step_cost import StepCostModel
from adarag.evaluation.machine import describe_machine
from adarag.evaluation.workload import load_questions
from adarag.kernels import logit_lens
from adarag.schema import Chunk, GenerationParams

OUTPUT = RESULTS / "adaptive-augmentation"
TOP_K = 6
STEP_VARIANTS = {"new cache per step": False, "previous step's cache": True}
STEP_CACHE_VARIANTS = {
    "float32 store (exact)": ("float32", False),
    "bfloat16 store, new cache per step": ("bfloat16", False),
    "bfloat16 store, previous step's cache": ("bfloat16", True),
}


def interleaved_medians(
    fns: dict[str, Callable[[], object]], repeats: int = 200
) -> dict[str, float]:
    """Median wall seconds of each function, calls interleaved so noise hits them alike."""
    for fn in fns.values():
        for _ in range(5):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


def head_costs(rag: AdaRAG, num_lens_layers: int) -> dict[str, float]:
    """Seconds of the LM head over 1 and l rows, and of a separate logit-lens pass."""
    engine = rag.engine
    layout = rag.prompts.layout("warm-up question?", ["a short passage about nothing."])
    hidden = engine.prefill(layout).layer_hidden
    model = engine.model
    with torch.inference_mode():
        medians = interleaved_medians(
            {
                "head_1_row_s": lambda: model.logits(hidden[-1:]),
                "head_l_rows_s": lambda: model.logits(hidden[-num_lens_layers:]),
                "separate_lens_s": lambda: logit_lens(
                    hidden[-num_lens_layers:],
                    model.final_norm_weight,
                    engine.spec.rms_norm_eps,
                    model.lm_head_weight,
                ),
            }
        )
    return medians


def confidence(args: argparse.Namespace) -> None:
    """The ``confidence`` subcommand."""
    with tempfile.TemporaryDirectory() as scratch:
        measure_confidence(args, AdaRAG(cache={"store": {"directory": scratch}}))


def measure_confidence(args: argparse.Namespace, rag: AdaRAG) -> None:
    """Measure every step of the datasets' questions and write the results."""
    num_lens_layers = rag.config.experimental.augment.num_lens_layers
    costs = head_costs(rag, num_lens_layers)
    # the l-row GEMM can time below the (padded) one-row GEMM: no extra cost then, not a saving
    extra_head_s = max(costs["head_l_rows_s"] - costs["head_1_row_s"], 0.0)
    params = GenerationParams(max_new_tokens=1)
    results: dict[str, dict[str, float]] = {}
    for dataset in args.dataset:
        questions = load_questions(dataset, args.data_dir, args.questions, TOP_K)
        ratios, separate_ratios, prefill_times, reduce_times = [], [], [], []
        for question in questions:
            rag.warm(question.chunks)
            answer = rag.query(question.question, chunks=question.chunks, params=params)
            for step in answer.trace.steps:
                cost = extra_head_s + step.confidence_s
                ratios.append(cost / step.prefill_s)
                separate = costs["separate_lens_s"] + step.confidence_s
                separate_ratios.append(separate / step.prefill_s)
                prefill_times.append(step.prefill_s)
                reduce_times.append(step.confidence_s)
        results[dataset] = {
            "num_steps": len(ratios),
            "mean_step_prefill_s": statistics.fmean(prefill_times),
            "min_step_prefill_s": min(prefill_times),
            "mean_reduction_s": statistics.fmean(reduce_times),
            "mean_cost_ratio": statistics.fmean(ratios),
            "p95_cost_ratio": float(np.percentile(ratios, 95)),
            "max_cost_ratio": max(ratios),
            "mean_separate_pass_ratio": statistics.fmean(separate_ratios),
        }
        print(dataset, results[dataset])

    lines = [
        f"Confidence check (logit lens over the last {num_lens_layers} layers) vs the prefill of "
        f"the same augmentation step; {args.questions} questions per dataset, top-{TOP_K}, "
        "chunks warmed in the independent tier.",
        f"Machine: {machine()['cpu']}, {machine()['cores']} cores, torch {torch.__version__}.",
        "",
        f"LM head over 1 row {costs['head_1_row_s'] * 1e3:.2f} ms, over {num_lens_layers} rows "
        f"{costs['head_l_rows_s'] * 1e3:.2f} ms (extra {extra_head_s * 1e3:.2f} ms); a separate "
        f"logit-lens pass {costs['separate_lens_s'] * 1e3:.2f} ms.",
        "",
        "| dataset | steps | mean step prefill (ms) | shortest step (ms) | reduction (ms) | "
        "check / prefill, mean | p95 | max | separate pass / prefill, mean |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for dataset, r in results.items():
        lines.append(
            f"| {dataset} | {r['num_steps']} | {r['mean_step_prefill_s'] * 1e3:.0f} | "
            f"{r['min_step_prefill_s'] * 1e3:.0f} | {r['mean_reduction_s'] * 1e3:.2f} | "
            f"{r['mean_cost_ratio']:.2%} | {r['p95_cost_ratio']:.2%} | {r['max_cost_ratio']:.2%} | "
            f"{r['mean_separate_pass_ratio']:.2%} |"
        )
    table = "\n".join(lines)
    print(table)
    payload = {"machine": machine(), **costs, "datasets": results}
    write_results("confidence_cost", payload, table, directory=OUTPUT)


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


def step_cache(args: argparse.Namespace) -> None:
    """The ``step-cache`` subcommand: first tokens against a float32 store's."""
    items = [json.loads(line) for line in (CACHE / "hotpotqa.retrieved.jsonl").open()]
    items = items[args.offset : args.offset + args.questions]
    rags = {
        name: hard_tier_pipeline(args.model, 2, dtype, reuse_step_kv=reuse)
        for name, (dtype, reuse) in STEP_CACHE_VARIANTS.items()
    }
    logits: dict[str, list] = {name: [] for name in rags}
    for item in items:
        chunks = [Chunk(c["text"], c["id"], c["score"]) for c in item["chunks"][:MAX_K]]
        for name, rag in rags.items():
            logits[name] += [row[2] for row in steps(rag, item["question"], chunks)]
    exact = logits["float32 store (exact)"]
    lines = [
        f"# First tokens with and without the step cache, {args.model}",
        "",
        f"`python benchmarks/augmentation_cost.py step-cache --model {args.model}`. "
        f"{describe_machine(machine())} {len(items)} HotpotQA questions x {MAX_K} steps.",
        "",
        "| variant | first token equal to the exact one | max logit difference |",
        "|---|---|---|",
    ]
    rows = {}
    for name, values in logits.items():
        same = sum(int(a.argmax() == b.argmax()) for a, b in zip(values, exact, strict=True))
        diff = max(float((a - b).abs().max()) for a, b in zip(values, exact, strict=True))
        rows[name] = {"same_first_token": same, "steps": len(exact), "max_logit_diff": diff}
        lines.append(f"| {name} | {same}/{len(exact)} | {diff:.3g} |")
    payload = {"machine": machine(), "model": args.model, "variants": rows}
    write_results(f"step_cache_agreement_{args.model}", payload, "\n".join(lines), directory=OUTPUT)
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    command = sub.add_parser("confidence", help="the confidence check against its step's prefill")
    command.add_argument("--questions", type=int, default=20)
    command.add_argument("--dataset", nargs="+", default=["musique", "hotpotqa"])
    command.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    command.set_defaults(fn=confidence)
    command = sub.add_parser("steps", help="a step's cost with and without the step cache")
    command.add_argument("--model", default="smollm2-135m")
    command.add_argument("--dataset", default="hotpotqa")
    command.add_argument("--questions", type=int, default=8)
    command.add_argument("--offset", type=int, default=45, help="questions the depth run left out")
    command.add_argument("--threads", type=int, default=2)
    command.add_argument(
        "--storage-dtype",
        default="bfloat16",
        help="the store's format (bfloat16, the default: a hard hit loaded from the store is "
        "rounded, the rows left in place are not; float32: both variants compute the same)",
    )
    command.set_defaults(fn=step_cost)
    command = sub.add_parser("step-cache", help="first tokens with and without the step cache")
    command.add_argument("--model", default="smollm2-135m")
    command.add_argument("--questions", type=int, default=8)
    command.add_argument("--offset", type=int, default=45, help="questions the depth run left out")
    command.set_defaults(fn=step_cache)
    run_subcommand(parser)


if __name__ == "__main__":
    main()
