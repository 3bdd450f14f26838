"""``augmentation_cost.py confidence``: the confidence check against its step's prefill."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch
from common import machine, write_results

from adarag import AdaRAG
from adarag.engine.prefill_request import PrefillRequest
from adarag.evaluation.workload import load_questions
from adarag.kernels import logit_lens
from adarag.schema import GenerationParams
from runs.augmentation_cost import OUTPUT

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
    hidden = engine.prefill(PrefillRequest(layout)).layer_hidden
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
