"""One context through every variant: the checks against float32, then the timings."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from adarag.config import RecomputeConfig
from adarag.engine.batch import SegmentSource
from adarag.engine.core import Engine
from adarag.engine.prefill_request import PrefillRequest
from adarag.evaluation.reuse import independent_chunks, reuse_sources
from adarag.schema import PromptLayout

# the default rule, then each fidelity lever on top of it (their cost decides what the default
# can afford)
VARIANTS: dict[str, dict[str, Any]] = {
    "query_deviation (default)": {},
    "kv_deviation": {"selection_policy": "kv_deviation"},
    "+ chunk-start s=4": {"chunk_start_tokens": 4},
    "+ query-shared budgets": {"chunk_allocation": "query"},
    "+ gradual layers": {"layer_schedule": "gradual", "layer_spread": 0.5},
    "+ APE T=S=0.9": {"context_temperature": 0.9, "context_scale": 0.9},
    # uncertainty routing: the query pass goes to the logits; a threshold above any entropy
    # keeps the request's ratio, one below every entropy routes it to full recomputation
    "+ routing, kept": {"uncertain_entropy": 1000.0},
    "+ routing, routed up": {"uncertain_entropy": 1e-3},
}
# an engine path may err this many times as much as transformers' own forward in the same dtype
ERROR_FACTOR, MIN_TOLERANCE = 2.0, 1e-2


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def seconds(fn: Callable[[], Any], warmup: int, reps: int) -> float:
    """Median wall seconds of ``fn`` with the GPU synchronized before and after."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        synchronize()
        started = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.double().flatten(), expected.double().flatten()
    return float((actual - expected).norm() / expected.norm())


def reference_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Last-token logits of the float32 model.

    SDPA has no fused float32 kernel for grouped heads, so its math path holds a [heads, n, n]
    float32 score matrix: 32 GiB at 16K tokens, 128 GiB at 32K (more than an H200 has beside the
    three models), hence the default contexts.
    """
    return model(ids, logits_to_keep=1).logits[0, -1]


def check(name: str, error: float, tolerance: float, failed: list[str]) -> None:
    passed = error <= tolerance
    verdict = "ok" if passed else "FAILED"
    print(f"check {name}: relative error {error:.2e} (at most {tolerance:.2e}) {verdict}")
    if not passed:
        failed.append(name)


def bench_context(
    engines: dict[str, Engine],
    hf_model: torch.nn.Module,
    reference_model: torch.nn.Module,
    layout: PromptLayout,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One context's checks and timings, every backend and variant."""
    all_ids = torch.tensor([layout.token_ids], device=args.device)
    row, sources = _checked_row(engines, hf_model, reference_model, layout, all_ids, args)
    _time_variants(row, engines, hf_model, layout, sources, all_ids, args)
    row["speedup_triton"] = row["full_triton_s"] / row["fused_triton_s"]
    print(json.dumps(row), flush=True)
    return row


def _checked_row(
    engines: dict[str, Engine],
    hf_model: torch.nn.Module,
    reference_model: torch.nn.Module,
    layout: PromptLayout,
    all_ids: torch.Tensor,
    args: argparse.Namespace,
) -> tuple[dict[str, Any], list[SegmentSource]]:
    """The context's row with every check's error, and the fused prefill's sources."""
    triton, twin = engines["triton"], engines["torch"]
    reference = reference_logits(reference_model, all_ids)
    hf_logits = hf_model(all_ids, logits_to_keep=1).logits[0, -1]
    hf_error = relative_error(hf_logits, reference)
    tolerance = max(ERROR_FACTOR * hf_error, MIN_TOLERANCE)
    print(f"transformers {args.dtype} vs float32: relative error {hf_error:.2e}", flush=True)
    full = triton.prefill(PrefillRequest(layout)).logits
    errors = {
        "full_triton": relative_error(full, reference),
        "full_torch": relative_error(twin.prefill(PrefillRequest(layout)).logits, reference),
        "full_transformers": hf_error,
        "full_triton_vs_transformers": relative_error(full, hf_logits),
    }
    failed: list[str] = []
    check("full prefill through Triton vs float32", errors["full_triton"], tolerance, failed)
    check("full prefill through torch vs float32", errors["full_torch"], tolerance, failed)
    system_kv, chunk_kvs = independent_chunks(triton, layout)
    everything = triton.prefill(
        PrefillRequest(layout, reuse_sources(system_kv, chunk_kvs, 1.0))
    ).logits
    errors["fused_1.0_vs_full"] = relative_error(everything, full)
    check("fused at ratio 1.0 vs full", errors["fused_1.0_vs_full"], tolerance, failed)
    sources = reuse_sources(system_kv, chunk_kvs, args.ratio)
    fused = {b: g.prefill(PrefillRequest(layout, sources)) for b, g in engines.items()}
    chosen = [set(out.recomputed_positions.tolist()) for out in fused.values()]
    row: dict[str, Any] = {
        "context": layout.num_tokens,
        "chunks": len(layout.chunk_ids),
        "ratio": args.ratio,
        "recomputed": fused["triton"].num_recomputed_tokens,
        "errors_vs_float32": errors,
        "failed_checks": failed,
        "fused_triton_vs_torch_logits_error": relative_error(
            fused["triton"].logits, fused["torch"].logits
        ),
        "fused_triton_vs_torch_same_positions": len(chosen[0] & chosen[1]) / len(chosen[1]),
        "fused_vs_full_logits_error": relative_error(fused["triton"].logits, full),
    }
    return row, sources


def _time_variants(
    row: dict[str, Any],
    engines: dict[str, Engine],
    hf_model: torch.nn.Module,
    layout: PromptLayout,
    sources: list[SegmentSource],
    all_ids: torch.Tensor,
    args: argparse.Namespace,
) -> None:
    """Seconds of each full and fused prefill, and of each lever through Triton, into ``row``."""
    triton = engines["triton"]

    def time_it(fn: Callable[[], Any]) -> float:
        return seconds(fn, args.warmup, args.reps)

    row["full_transformers_s"] = time_it(lambda: hf_model(all_ids, logits_to_keep=1))
    for backend, engine in engines.items():
        row[f"full_{backend}_s"] = time_it(lambda g=engine: g.prefill(PrefillRequest(layout)))
        row[f"fused_{backend}_s"] = time_it(
            lambda g=engine: g.prefill(PrefillRequest(layout, sources))
        )
    row["levers_triton_s"] = {}
    for name, settings in VARIANTS.items():
        selection = RecomputeConfig(**settings)
        row["levers_triton_s"][name] = time_it(
            lambda s=selection: triton.prefill(PrefillRequest(layout, sources, selection=s))
        )
