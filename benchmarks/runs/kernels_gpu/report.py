"""The kernel benchmark's markdown table."""

from __future__ import annotations

import argparse
from typing import Any

from runs.kernels_gpu.attention import TARGET_RATIO, TARGET_SPEEDUP


def markdown(results: dict[str, Any], args: argparse.Namespace) -> str:
    device = results["device"]
    lines = [
        f"Kernel benchmark on {device['name']} (torch {device['torch']}, triton "
        f"{device['triton']}), {args.dtype_name}, {args.heads} heads / {args.kv_heads} KV heads / "
        f"head_dim {args.head_dim}; median of {args.reps} calls after {args.warmup} warm-up, "
        "L2 flushed.",
        "",
        "### selective_attention",
        "",
        "| context | ratio | queries | Triton (ms) | twin (ms) | masked SDPA (ms) | SDPA backend "
        "| vs SDPA | vs twin |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["selective_attention"]:
        lines.append(
            f"| {row['context']} | {row['ratio']:.2f} | {row['num_q']} | {row['triton_ms']:.3f} "
            f"| {row['twin_ms']:.3f} | {row['masked_sdpa_ms']:.3f} | {row['sdpa_backend']} "
            f"| {row['speedup_vs_sdpa']:.2f}x | {row['speedup_vs_twin']:.2f}x |"
        )
    sweeps = [row for row in results["selective_attention"] if "tile_sweep_ms" in row]
    if sweeps:
        names = list(sweeps[0]["tile_sweep_ms"])
        lines += ["", f"Tile sweep at {TARGET_RATIO:.0%} (ms; default tiling as above):", ""]
        lines += ["| context | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for row in sweeps:
            times = " | ".join(f"{row['tile_sweep_ms'][name]:.3f}" for name in names)
            lines.append(f"| {row['context']} | {times} |")
    target = results["target"]
    lines += ["", f"Target (>= {TARGET_SPEEDUP}x vs masked SDPA at {TARGET_RATIO:.0%}): "]
    lines[-1] += "met" if target["met"] else "NOT met"
    lines[-1] += f" (min {target['min_speedup']:.2f}x over the contexts)."
    simple = [
        ("segment_attention_mass", "context", ["num_segments", "triton_to_cpu_ms"]),
        ("rope_delta", "context", ["layers", "triton_gb_per_s"]),
        ("kv_scatter", "context", ["ratio", "num_tokens"]),
        ("logit_lens", "vocab", ["layers", "hidden_size", "triton_gb_per_s"]),
    ]
    for name, key, extra in simple:
        lines += ["", f"### {name}", ""]
        header = [key, *extra, "Triton (ms)", "twin (ms)", "vs twin"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row in results[name]:
            cells = [row[key], *(row[c] for c in extra)]
            cells = [f"{c:.2f}" if isinstance(c, float) else str(c) for c in cells]
            cells += [f"{row['triton_ms']:.3f}", f"{row['twin_ms']:.3f}"]
            cells.append(f"{row['speedup_vs_twin']:.2f}x")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
