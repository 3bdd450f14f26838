"""Triton kernels against their torch twins and masked SDPA, at the shapes of Llama-3-8B.

Random bfloat16 tensors (weights do not matter for timing): 32 query heads, 8 KV heads, head_dim
128, a 128256 x 4096 LM head. For each context length and recomputation ratio, the selected
queries are a sorted random subset of the positions that always holds the last 32 (the query
suffix). Every variant is checked against the twin before it is timed; a mismatch stops the run.
Times are CUDA-event medians after warm-up, with the L2 cache flushed before every call.

Rows:
- selective_attention: Triton kernel vs the twin (blocked SDPA) vs one SDPA call with an explicit
  boolean mask [num_q, num_kv] over K/V expanded to every query head beforehand (untimed); SDPA
  runs on the fastest backend that accepts the mask (efficient, cuDNN or torch's own choice).
- segment_attention_mass: all context tokens as queries (the first-layer selection pass), one
  segment per 512 tokens; results stay on the GPU (and, in a column of their own, copied whole
  to the CPU).
- rope_delta: every cached key of the context re-rotated, all 32 layers in one call.
- kv_scatter: the recomputed rows of one layer written into the fused cache.
- logit_lens: 4 lens layers against the LM head.

    python benchmarks/kernels_gpu.py    # full grid, writes results/kernels-gpu/kernels_gpu.*
    python benchmarks/kernels_gpu.py --contexts 8192 --ratios 0.15 --sweep-tiles

The issue's target: selective attention at least 1.5x faster than masked SDPA at 15%.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from common import RESULTS, machine, write_results

from adarag.kernels.kv_scatter import kv_scatter_ref, kv_scatter_triton
from adarag.kernels.logit_lens import logit_lens_ref, logit_lens_triton
from adarag.kernels.rope_delta import rope_delta_ref, rope_delta_triton
from adarag.kernels.selective_attention import (
    AttentionTiling,
    segment_attention_mass_ref,
    segment_attention_mass_triton,
    selective_attention_ref,
    selective_attention_triton,
)

CONTEXTS = (2048, 4096, 8192, 16384, 32768)
RATIOS = (0.05, 0.10, 0.15, 0.20, 0.30)
TARGET_RATIO, TARGET_SPEEDUP = 0.15, 1.5
QUERY_SUFFIX_TOKENS = 32
SEGMENT_TOKENS = 512
SWEEP_TILINGS = [
    AttentionTiling(128, 32, 8, 3),
    AttentionTiling(128, 64, 8, 3),
    AttentionTiling(128, 64, 8, 2),
    AttentionTiling(64, 64, 4, 3),
    AttentionTiling(64, 32, 4, 3),
    AttentionTiling(128, 128, 8, 2),
]
BF16_TOLERANCE = {"atol": 2e-2, "rtol": 2e-2}


class Timer:
    """Median milliseconds per call: CUDA events on a GPU, wall clock elsewhere (smoke runs)."""

    def __init__(self, device: torch.device, warmup: int, reps: int) -> None:
        self.device, self.warmup, self.reps = device, warmup, reps
        self.is_cuda = device.type == "cuda"
        # writing 256 MB evicts the H100's 50 MB L2, so no call reuses the previous one's reads
        flush_elements = 64 * 2**20 if self.is_cuda else 1
        self.flush_buffer = torch.empty(flush_elements, dtype=torch.int32, device=device)

    def __call__(self, fn: Callable[[], Any]) -> float:
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.reps):
            self.flush_buffer.zero_()
            if self.is_cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                started = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - started))
        return statistics.median(times)


def check(name: str, actual: torch.Tensor, expected: torch.Tensor, **tolerance: float) -> None:
    """Stop the run when a variant disagrees with the twin."""
    try:
        torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), **tolerance)
    except AssertionError as err:
        raise SystemExit(f"{name}: output differs from the twin, not timing it\n{err}") from err


def selected_positions(num_kv: int, ratio: float, device: torch.device) -> torch.Tensor:
    """Sorted positions of ``ceil(ratio * num_kv)`` queries, always holding the query suffix."""
    num_q = max(QUERY_SUFFIX_TOKENS, math.ceil(ratio * num_kv))
    suffix = torch.arange(num_kv - QUERY_SUFFIX_TOKENS, num_kv)
    chosen = torch.randperm(num_kv - QUERY_SUFFIX_TOKENS)[: num_q - QUERY_SUFFIX_TOKENS]
    return torch.cat((chosen.sort().values, suffix)).to(device)


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


def bench_mass(args: argparse.Namespace, timer: Timer, device: torch.device) -> list[dict]:
    rows = []
    for num_kv in args.contexts:
        q = torch.randn(num_kv, args.heads, args.head_dim, dtype=args.dtype, device=device)
        k = torch.randn(num_kv, args.kv_heads, args.head_dim, dtype=args.dtype, device=device)
        positions = torch.arange(num_kv, device=device)
        bounds = list(range(0, num_kv, SEGMENT_TOKENS)) + [num_kv]
        cu = torch.tensor(bounds, dtype=torch.int64, device=device)
        scale = args.head_dim**-0.5
        twin = segment_attention_mass_ref(q, k, positions, scale, cu)
        runs = {
            "triton": partial(segment_attention_mass_triton, q, k, positions, scale, cu),
            "twin": partial(segment_attention_mass_ref, q, k, positions, scale, cu),
        }
        check("segment_attention_mass", runs["triton"](), twin, atol=1e-2, rtol=0)
        row = {"context": num_kv, "num_q": num_kv, "num_segments": len(bounds) - 1}
        row.update({f"{name}_ms": timer(run) for name, run in runs.items()})
        # what every head's mass costs when copied to the CPU whole (the op's old contract)
        row["triton_to_cpu_ms"] = timer(lambda run=runs["triton"]: run().cpu())
        row["speedup_vs_twin"] = row["twin_ms"] / row["triton_ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def bench_rope(args: argparse.Namespace, timer: Timer, device: torch.device) -> list[dict]:
    rows = []
    head_dim = args.head_dim
    inv_freq = 1.0 / 500000.0 ** (torch.arange(0, head_dim, 2, device=device) / head_dim)
    for num_tokens in args.contexts:
        shape = (args.layers, num_tokens, args.kv_heads, head_dim)
        k = torch.randn(shape, dtype=args.dtype, device=device)
        delta = torch.randint(-num_tokens, num_tokens, (num_tokens,), device=device)
        runs = {
            "triton": partial(rope_delta_triton, k, delta, inv_freq),
            "twin": partial(rope_delta_ref, k, delta, inv_freq),
        }
        check("rope_delta", runs["triton"](), runs["twin"](), **BF16_TOLERANCE)
        row = {"context": num_tokens, "layers": args.layers}
        row.update({f"{name}_ms": timer(run) for name, run in runs.items()})
        row["speedup_vs_twin"] = row["twin_ms"] / row["triton_ms"]
        row["triton_gb_per_s"] = 2 * k.numel() * k.element_size() / row["triton_ms"] / 1e6
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def bench_scatter(args: argparse.Namespace, timer: Timer, device: torch.device) -> list[dict]:
    rows = []
    for num_slots in args.contexts:
        k_cache = torch.zeros(num_slots, args.kv_heads, args.head_dim, dtype=args.dtype)
        k_cache, v_cache = k_cache.to(device), k_cache.clone().to(device)
        for ratio in args.ratios:
            positions = selected_positions(num_slots, ratio, device)
            shape = (positions.numel(), args.kv_heads, args.head_dim)
            k = torch.randn(shape, dtype=args.dtype, device=device)
            v = torch.randn_like(k)
            expected_k, expected_v = k_cache.clone(), v_cache.clone()
            kv_scatter_ref(expected_k, expected_v, k, v, positions)
            kv_scatter_triton(k_cache, v_cache, k, v, positions)
            check("kv_scatter k", k_cache, expected_k, atol=0, rtol=0)
            check("kv_scatter v", v_cache, expected_v, atol=0, rtol=0)
            runs = {
                "triton": partial(kv_scatter_triton, k_cache, v_cache, k, v, positions),
                "twin": partial(kv_scatter_ref, k_cache, v_cache, k, v, positions),
            }
            row = {"context": num_slots, "ratio": ratio, "num_tokens": positions.numel()}
            row.update({f"{name}_ms": timer(run) for name, run in runs.items()})
            row["speedup_vs_twin"] = row["twin_ms"] / row["triton_ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def bench_logit_lens(args: argparse.Namespace, timer: Timer, device: torch.device) -> list[dict]:
    hidden = 3 * torch.randn(args.lens_layers, args.hidden_size, device=device).to(args.dtype)
    norm_weight = torch.ones(args.hidden_size, dtype=args.dtype, device=device)
    lm_head = torch.randn(args.vocab, args.hidden_size, dtype=args.dtype, device=device) / 30
    runs = {
        "triton": partial(logit_lens_triton, hidden, norm_weight, 1e-5, lm_head),
        "twin": partial(logit_lens_ref, hidden, norm_weight, 1e-5, lm_head),
    }
    (kl, entropy), (twin_kl, twin_entropy) = runs["triton"](), runs["twin"]()
    check("logit_lens kl", kl, twin_kl, atol=1e-3, rtol=1e-4)
    check("logit_lens entropy", entropy, twin_entropy, atol=1e-3, rtol=1e-4)
    row = {"layers": args.lens_layers, "vocab": args.vocab, "hidden_size": args.hidden_size}
    row.update({f"{name}_ms": timer(run) for name, run in runs.items()})
    row["speedup_vs_twin"] = row["twin_ms"] / row["triton_ms"]
    row["triton_gb_per_s"] = lm_head.numel() * lm_head.element_size() / row["triton_ms"] / 1e6
    print(json.dumps(row), flush=True)
    return [row]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    parser.add_argument("--ratios", type=float, nargs="+", default=list(RATIOS))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden-size", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--lens-layers", type=int, default=4)
    parser.add_argument("--dtype", dest="dtype_name", default="bfloat16")
    parser.add_argument(
        "--device", default="cuda", help="cpu: a smoke run (TRITON_INTERPRET=1), never written"
    )
    parser.add_argument("--sweep-tiles", action="store_true", help="also time other tilings")
    parser.add_argument("--no-write", action="store_true", help="print only; keep results/")
    args = parser.parse_args()
    args.dtype = getattr(torch, args.dtype_name)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark needs a GPU (--device cpu smoke-runs it)")
    torch.manual_seed(0)
    timer = Timer(device, args.warmup, args.reps)

    import triton

    results: dict[str, Any] = {
        "device": {
            "name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda": torch.version.cuda,
        },
        "machine": machine(),
        "settings": {k: v for k, v in vars(args).items() if k != "dtype"},
    }
    results["selective_attention"] = bench_attention(args, timer, device)
    results["segment_attention_mass"] = bench_mass(args, timer, device)
    results["rope_delta"] = bench_rope(args, timer, device)
    results["kv_scatter"] = bench_scatter(args, timer, device)
    results["logit_lens"] = bench_logit_lens(args, timer, device)
    at_target = [
        row["speedup_vs_sdpa"]
        for row in results["selective_attention"]
        if math.isclose(row["ratio"], TARGET_RATIO)
    ]
    min_speedup = min(at_target) if at_target else float("nan")
    results["target"] = {
        "ratio": TARGET_RATIO,
        "speedup": TARGET_SPEEDUP,
        "min_speedup": min_speedup,
        "met": bool(at_target) and min_speedup >= TARGET_SPEEDUP,
    }
    table = markdown(results, args)
    print(table)
    if device.type == "cuda" and not args.no_write:
        write_results("kernels_gpu", results, table, directory=RESULTS / "kernels-gpu")


if __name__ == "__main__":
    main()
