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
import copy
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from common import REPO, RESULTS, machine, write_results
from transformers import LlamaConfig, LlamaForCausalLM

from adarag.config import AdaRagConfig, RecomputeConfig
from adarag.engine.checkpoint import Checkpoint
from adarag.engine.core import Engine
from adarag.engine.loader import model_from_state
from adarag.engine.spec import ModelSpec
from adarag.evaluation.reuse import independent_chunks, reuse_sources
from adarag.schema import PromptLayout

sys.path.insert(0, str(REPO))
from tests.tiny_models import build_tiny_tokenizer  # noqa: E402

TARGET_RATIO, TARGET_SPEEDUP, TARGET_CONTEXT = 0.15, 4.0, 8192
SYSTEM_TOKENS = QUERY_TOKENS = 32
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


def llama_8b_shapes(num_layers: int) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        num_hidden_layers=num_layers,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )


def cast_keeping_rope(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``model.to(dtype)`` with RoPE's inverse frequencies kept in float32.

    ``from_pretrained(dtype=...)`` keeps them so; a plain ``.to(bfloat16)`` rounds them too, and
    then the angles of late positions are radians off (at 8K tokens the logits of such a model
    and of the exact rotation differ by more than their own norm).
    """
    kept = {n: b.clone() for n, b in model.named_buffers() if n.endswith("inv_freq")}
    model = model.to(dtype)
    for name, buffer in kept.items():
        owner, _, attribute = name.rpartition(".")
        model.get_submodule(owner).register_buffer(attribute, buffer, persistent=False)
    return model


def build_engines(
    args: argparse.Namespace, home: Path
) -> tuple[dict[str, Engine], torch.nn.Module, torch.nn.Module]:
    """A Triton and a torch engine sharing one random model; transformers' model of the
    weights in the same dtype, and in float32 (the reference)."""
    config = llama_8b_shapes(args.layers)
    dtype = getattr(torch, args.dtype)
    with torch.device(args.device):
        reference_model = LlamaForCausalLM(config).eval().requires_grad_(False)
    hf_model = cast_keeping_rope(copy.deepcopy(reference_model), dtype)
    path = home / "llama-8b-shapes"
    config.save_pretrained(path)
    tokenizer = build_tiny_tokenizer()
    tokenizer.save_pretrained(path)
    spec = ModelSpec.from_hf_config(config.to_dict())
    model = model_from_state(dict(hf_model.state_dict()), spec, dtype, args.device)
    checkpoint = Checkpoint(path, spec, f"random-{args.layers}-layers", tokenizer)
    engines = {}
    for backend in ("triton", "torch"):
        settings = AdaRagConfig.build(
            home=home,
            engine={"model": str(path), "device": args.device, "dtype": args.dtype},
            kernels={"backend": backend},
        )
        engines[backend] = Engine.for_model(checkpoint, model, settings.engine, settings.kernels)
    return engines, hf_model, reference_model


def random_layout(num_tokens: int, chunk_tokens: int, rng: torch.Generator) -> PromptLayout:
    """System prefix, chunks and query suffix of random ids, ``num_tokens`` in all."""

    def ids(count: int) -> tuple[int, ...]:
        return tuple(torch.randint(1000, 128000, (count,), generator=rng).tolist())

    num_chunks = max(1, (num_tokens - SYSTEM_TOKENS - QUERY_TOKENS) // chunk_tokens)
    return PromptLayout(
        system_ids=ids(SYSTEM_TOKENS),
        chunk_ids=tuple(ids(chunk_tokens) for _ in range(num_chunks)),
        query_ids=ids(QUERY_TOKENS),
    )


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
    triton, twin = engines["triton"], engines["torch"]
    all_ids = torch.tensor([layout.token_ids], device=args.device)
    reference = reference_logits(reference_model, all_ids)
    hf_logits = hf_model(all_ids, logits_to_keep=1).logits[0, -1]
    hf_error = relative_error(hf_logits, reference)
    tolerance = max(ERROR_FACTOR * hf_error, MIN_TOLERANCE)
    print(f"transformers {args.dtype} vs float32: relative error {hf_error:.2e}", flush=True)
    full = triton.prefill(layout).logits
    errors = {
        "full_triton": relative_error(full, reference),
        "full_torch": relative_error(twin.prefill(layout).logits, reference),
        "full_transformers": hf_error,
        "full_triton_vs_transformers": relative_error(full, hf_logits),
    }
    failed: list[str] = []
    check("full prefill through Triton vs float32", errors["full_triton"], tolerance, failed)
    check("full prefill through torch vs float32", errors["full_torch"], tolerance, failed)
    system_kv, chunk_kvs = independent_chunks(triton, layout)
    everything = triton.prefill(layout, reuse_sources(system_kv, chunk_kvs, 1.0)).logits
    errors["fused_1.0_vs_full"] = relative_error(everything, full)
    check("fused at ratio 1.0 vs full", errors["fused_1.0_vs_full"], tolerance, failed)
    sources = reuse_sources(system_kv, chunk_kvs, args.ratio)
    fused = {b: g.prefill(layout, sources) for b, g in engines.items()}
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

    def time_it(fn: Callable[[], Any]) -> float:
        return seconds(fn, args.warmup, args.reps)

    row["full_transformers_s"] = time_it(lambda: hf_model(all_ids, logits_to_keep=1))
    for backend, engine in engines.items():
        row[f"full_{backend}_s"] = time_it(lambda g=engine: g.prefill(layout))
        row[f"fused_{backend}_s"] = time_it(lambda g=engine: g.prefill(layout, sources))
    row["levers_triton_s"] = {}
    for name, settings in VARIANTS.items():
        selection = RecomputeConfig(**settings)
        row["levers_triton_s"][name] = time_it(
            lambda s=selection: triton.prefill(layout, sources, selection=s)
        )
    row["speedup_triton"] = row["full_triton_s"] / row["fused_triton_s"]
    print(json.dumps(row), flush=True)
    return row


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
