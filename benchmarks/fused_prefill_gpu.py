"""The engine's fused prefill against its full prefill on a GPU, at Llama-3-8B shapes.

A random-weight Llama (hidden 4096, 32 heads, 8 KV heads, head_dim 128, MLP 14336, vocab 128256;
32 layers by default, bfloat16) is built in GPU memory; weights do not matter for timing. Each
prompt is a 32-token system prefix, chunks of ``--chunk-tokens`` random ids and a 32-token query
suffix. Every chunk's independent KV is computed beforehand (a cache hit held on the GPU) and is
reused at ``--ratio`` with the default rule and with each fidelity lever; full prefill runs the
whole prompt. Times are wall seconds of one prefill to its first-token logits, synchronized,
median of ``--reps`` after a warm-up.

Checks before timing (a failed check is printed, recorded and marked in the table), as relative
L2 errors of the last-token logits against transformers' forward of the same weights in float32:
- the engine's full prefill with the Triton kernels and with the torch twins may err at most
  twice as much as transformers' own bfloat16 forward (SDPA), or 1e-2;
- a fused prefill at ratio 1.0 against the full prefill (both through Triton), likewise.
The fused prefill at ``--ratio`` is compared between the two backends and reported (bfloat16
near-ties can pick a few different tokens, so its logits are not held to a tolerance).

    python benchmarks/fused_prefill_gpu.py    # writes results/kernels-gpu/fused_prefill_gpu.*
    python benchmarks/fused_prefill_gpu.py --layers 4 --contexts 8192 --no-write
    python benchmarks/fused_prefill_gpu.py --ratio 0.2 --output fused_prefill_gpu_routing

The issue's target: fused prefill at 0.15 at least 4x faster than full prefill at 8K+ tokens.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch
from common import RESULTS, machine, write_results
from runs.fused_prefill_gpu.context import bench_context
from runs.fused_prefill_gpu.engines import build_engines, random_layout
from runs.fused_prefill_gpu.report import TARGET_CONTEXT, TARGET_RATIO, TARGET_SPEEDUP, markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--contexts", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--chunk-tokens", type=int, default=512)
    parser.add_argument("--ratio", type=float, default=TARGET_RATIO)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--device", default="cuda", help="cpu: a smoke run (TRITON_INTERPRET=1), never written"
    )
    parser.add_argument("--no-write", action="store_true", help="print only; keep results/")
    parser.add_argument(
        "--output", default="fused_prefill_gpu", help="results/kernels-gpu/<output>.{md,json}"
    )
    args = parser.parse_args()
    on_gpu = args.device.startswith("cuda")
    if on_gpu and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark needs a GPU (--device cpu smoke-runs it)")
    torch.manual_seed(0)
    ids = torch.Generator().manual_seed(0)
    results: dict[str, Any] = {
        "device": {
            "name": torch.cuda.get_device_name() if on_gpu else "cpu",
            "torch": torch.__version__,
        },
        "machine": machine(),
        "settings": vars(args),
        "rows": [],
    }
    with tempfile.TemporaryDirectory() as home, torch.inference_mode():
        engines, hf_model, reference_model = build_engines(args, Path(home))
        for num_tokens in args.contexts:
            layout = random_layout(num_tokens, args.chunk_tokens, ids)
            row = bench_context(engines, hf_model, reference_model, layout, args)
            results["rows"].append(row)
            report(results, args, write=on_gpu and not args.no_write)  # after each context


def report(results: dict[str, Any], args: argparse.Namespace, write: bool) -> None:
    """Print the table of the rows so far; write them to results/ when ``write``."""
    at_target = [
        row["speedup_triton"] for row in results["rows"] if row["context"] >= TARGET_CONTEXT
    ]
    min_speedup = min(at_target) if at_target else float("nan")
    results["target"] = {"min_speedup": min_speedup, "met": min_speedup >= TARGET_SPEEDUP}
    table = markdown(results, args)
    print(table, flush=True)
    if write:
        write_results(args.output, results, table, directory=RESULTS / "kernels-gpu")


if __name__ == "__main__":
    main()
