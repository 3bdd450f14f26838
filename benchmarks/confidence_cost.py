"""Cost of the augmentation confidence check relative to the prefill of the same step.

Each question's top-6 passages (BM25 among its own, as ``adarag bench`` ranks them) have their
independent KV precomputed (as ingest does); then the pipeline answers with adaptive augmentation,
so every step is a real one: earlier chunks from the hard tier, the new one from the independent
tier. The prefill projects the last l layers' hidden states through the LM head in the GEMM that
yields the decoding logits, so the check costs

- the extra rows of that GEMM: the head over l rows minus over one row, timed on the real model's
  hidden states (median of many runs; the same for every step), plus
- the reduction to KL and entropy (``StepTrace.confidence_s``, timed in every step).

For comparison, the separate logit-lens pass over the hidden states (what a check costs when the
prefill does not provide the logits) is timed too.

    python benchmarks/confidence_cost.py --questions 20
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from common import DEFAULT_DATA_DIR, machine, write_results

from adarag import AdaRAG
from adarag.evaluation.workload import load_questions
from adarag.kernels import logit_lens
from adarag.schema import GenerationParams

TOP_K = 6


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--dataset", nargs="+", default=["musique", "hotpotqa"])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        run(args, AdaRAG(cache={"store": {"directory": scratch}}))


def run(args: argparse.Namespace, rag: AdaRAG) -> None:
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
    write_results("confidence_cost", {"machine": machine(), **costs, "datasets": results}, table)


if __name__ == "__main__":
    main()
