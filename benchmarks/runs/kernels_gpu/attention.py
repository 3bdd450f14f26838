"""Selective attention: the Triton kernel against its twin and masked SDPA, and a tile sweep."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F  # noqa: N812

from adarag.kernels.selective_attention import (
    AttentionTiling,
    selective_attention_ref,
    selective_attention_triton,
)
from runs.kernels_gpu.timing import BF16_TOLERANCE, Timer, check, selected_positions

TARGET_RATIO, TARGET_SPEEDUP = 0.15, 1.5
SWEEP_TILINGS = [
    AttentionTiling(128, 32, 8, 3),
    AttentionTiling(128, 64, 8, 3),
    AttentionTiling(128, 64, 8, 2),
    AttentionTiling(64, 64, 4, 3),
    AttentionTiling(64, 32, 4, 3),
    AttentionTiling(128, 128, 8, 2),
]


def masked_sdpa(
    q: torch.Tensor, k_expanded: torch.Tensor, v_expanded: torch.Tensor, mask: torch.Tensor
) -> Callable[[], torch.Tensor]:
    """One SDPA call with a boolean mask: [1, heads, num_q, dim] against expanded K/V."""
    q_heads = q.transpose(0, 1)[None].contiguous()  # SDPA's layout, prepared untimed
    return lambda: F.scaled_dot_product_attention(
        q_heads, k_expanded, v_expanded, attn_mask=mask, scale=q.shape[-1] ** -0.5
    )[0].transpose(0, 1)


def fastest_sdpa(
    timer: Timer, run: Callable[[], torch.Tensor], expected: torch.Tensor
) -> tuple[float, str]:
    """Time masked SDPA on every backend that accepts it; the fastest time and its backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    candidates: dict[str, list[SDPBackend] | None] = {"default": None}
    if timer.is_cuda:
        candidates["efficient"] = [SDPBackend.EFFICIENT_ATTENTION]
        candidates["cudnn"] = [SDPBackend.CUDNN_ATTENTION]
    results = {}
    for name, backends in candidates.items():
        if backends is None:
            check(f"masked SDPA ({name})", run(), expected, **BF16_TOLERANCE)
            results[name] = timer(run)
            continue
        try:
            with sdpa_kernel(backends):
                check(f"masked SDPA ({name})", run(), expected, **BF16_TOLERANCE)
                results[name] = timer(run)
        except RuntimeError:
            continue  # this backend does not take the mask or shape
    best = min(results, key=results.__getitem__)
    return results[best], best


def bench_attention(args: argparse.Namespace, timer: Timer, device: torch.device) -> list[dict]:
    rows = []
    for num_kv in args.contexts:
        k = torch.randn(num_kv, args.kv_heads, args.head_dim, dtype=args.dtype, device=device)
        v = torch.randn_like(k)
        group = args.heads // args.kv_heads
        k_expanded = k.repeat_interleave(group, dim=1).transpose(0, 1)[None].contiguous()
        v_expanded = v.repeat_interleave(group, dim=1).transpose(0, 1)[None].contiguous()
        for ratio in args.ratios:
            positions = selected_positions(num_kv, ratio, device)
            num_q = positions.numel()
            q = torch.randn(num_q, args.heads, args.head_dim, dtype=args.dtype, device=device)
            scale = args.head_dim**-0.5
            mask = torch.arange(num_kv, device=device)[None, :] <= positions[:, None]
            twin = selective_attention_ref(q, k, v, positions, scale)
            runs = {
                "triton": partial(selective_attention_triton, q, k, v, positions, scale),
                "twin": partial(selective_attention_ref, q, k, v, positions, scale),
            }
            check("selective_attention", runs["triton"](), twin, **BF16_TOLERANCE)
            row = {"context": num_kv, "ratio": ratio, "num_q": num_q}
            row.update({f"{name}_ms": timer(run) for name, run in runs.items()})
            sdpa = masked_sdpa(q, k_expanded, v_expanded, mask)
            row["masked_sdpa_ms"], row["sdpa_backend"] = fastest_sdpa(timer, sdpa, twin)
            row["speedup_vs_sdpa"] = row["masked_sdpa_ms"] / row["triton_ms"]
            row["speedup_vs_twin"] = row["twin_ms"] / row["triton_ms"]
            if args.sweep_tiles and math.isclose(ratio, TARGET_RATIO):
                row["tile_sweep_ms"] = sweep_tiles(timer, q, k, v, positions, scale, twin)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def sweep_tiles(
    timer: Timer,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    twin: torch.Tensor,
) -> dict[str, float]:
    """Selective attention under other launch settings (to retune ``_default_tiling``)."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources

    times = {}
    for tiling in SWEEP_TILINGS:
        name = "m{}-n{}-w{}-s{}".format(*tiling)

        def run(tiling: AttentionTiling = tiling) -> torch.Tensor:
            return selective_attention_triton(q, k, v, positions, scale, tiling=tiling)

        try:
            check(f"selective_attention {name}", run(), twin, **BF16_TOLERANCE)
        except (CompilationError, OutOfResources) as err:
            times[name] = float("nan")
            print(f"tiling {name}: {type(err).__name__}", flush=True)
            continue
        times[name] = timer(run)
    return times
