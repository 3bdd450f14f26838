"""The fused prefill benchmark's markdown table and its target."""

from __future__ import annotations

import argparse
from typing import Any

from runs.fused_prefill_gpu.context import VARIANTS

TARGET_RATIO, TARGET_SPEEDUP, TARGET_CONTEXT = 0.15, 4.0, 8192


def markdown(results: dict[str, Any], args: argparse.Namespace) -> str:
    device = results["device"]
    lines = [
        f"Fused vs full prefill on {device['name']} (torch {device['torch']}), random weights "
        f"at Llama-3-8B shapes with {args.layers} layers, {args.dtype}, chunks of "
        f"{args.chunk_tokens} tokens, ratio {args.ratio}; median of {args.reps} prefills "
        f"after {args.warmup} warm-up, wall seconds to the first-token logits.",
        "",
        "| context | recomputed | full: transformers | full: torch | full: Triton "
        "| fused: torch | fused: Triton | Triton full / fused |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        lines.append(
            f"| {row['context']} | {row['recomputed']} | {row['full_transformers_s']:.3f} "
            f"| {row['full_torch_s']:.3f} | {row['full_triton_s']:.3f} "
            f"| {row['fused_torch_s']:.3f} | {row['fused_triton_s']:.3f} "
            f"| {row['speedup_triton']:.2f}x |"
        )
    target = results["target"]
    lines += ["", f"Target (>= {TARGET_SPEEDUP}x at {TARGET_RATIO} from {TARGET_CONTEXT} tokens): "]
    lines[-1] += "met" if target["met"] else "NOT met"
    lines[-1] += f" (min {target['min_speedup']:.2f}x)."
    lines += [
        "",
        "Checks: relative L2 error of the last-token logits (full prefill against transformers' "
        "float32 forward of the same weights; fused at the ratio between the backends and against "
        "full) and the recomputed positions both backends chose:",
        "",
        "| context | full: transformers | full: torch | full: Triton | fused 1.0 vs full "
        "| fused Triton vs torch | same positions | fused vs full |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        errors = row["errors_vs_float32"]
        context = f"{row['context']} (FAILED)" if row["failed_checks"] else row["context"]
        lines.append(
            f"| {context} | {errors['full_transformers']:.2e} "
            f"| {errors['full_torch']:.2e} | {errors['full_triton']:.2e} "
            f"| {errors['fused_1.0_vs_full']:.2e} "
            f"| {row['fused_triton_vs_torch_logits_error']:.2e} "
            f"| {row['fused_triton_vs_torch_same_positions']:.1%} "
            f"| {row['fused_vs_full_logits_error']:.2e} |"
        )
    names = list(VARIANTS)
    lines += ["", "Fidelity levers through Triton (seconds per fused prefill):", ""]
    lines += ["| context | full | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for row in results["rows"]:
        cells = " | ".join(f"{row['levers_triton_s'][name]:.3f}" for name in names)
        lines.append(f"| {row['context']} | {row['full_triton_s']:.3f} | {cells} |")
    return "\n".join(lines)
