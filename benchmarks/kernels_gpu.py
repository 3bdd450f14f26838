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
import math
from typing import Any

import torch
from common import RESULTS, machine, write_results
from runs.kernels_gpu.attention import TARGET_RATIO, TARGET_SPEEDUP, bench_attention
from runs.kernels_gpu.kernels import bench_logit_lens, bench_mass, bench_rope, bench_scatter
from runs.kernels_gpu.report import markdown
from runs.kernels_gpu.timing import Timer

CONTEXTS = (2048, 4096, 8192, 16384, 32768)
RATIOS = (0.05, 0.10, 0.15, 0.20, 0.30)


def _parse_args() -> argparse.Namespace:
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
    return parser.parse_args()


def _target(rows: list[dict]) -> dict[str, Any]:
    """Whether selective attention met its target against masked SDPA at the target ratio."""
    at_target = [row["speedup_vs_sdpa"] for row in rows if math.isclose(row["ratio"], TARGET_RATIO)]
    min_speedup = min(at_target) if at_target else float("nan")
    return {
        "ratio": TARGET_RATIO,
        "speedup": TARGET_SPEEDUP,
        "min_speedup": min_speedup,
        "met": bool(at_target) and min_speedup >= TARGET_SPEEDUP,
    }


def main() -> None:
    args = _parse_args()
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
    results["target"] = _target(results["selective_attention"])
    table = markdown(results, args)
    print(table)
    if device.type == "cuda" and not args.no_write:
        write_results("kernels_gpu", results, table, directory=RESULTS / "kernels-gpu")


if __name__ == "__main__":
    main()
