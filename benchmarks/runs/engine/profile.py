"""``engine.py profile``: where the engine's time goes, torch.profiler's op families per variant."""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

import torch
from common import machine, musique_prompts, write_results
from torch.profiler import ProfilerActivity, profile

from adarag import AdaRAG
from adarag.config import AdaRagConfig
from adarag.engine.prefill_request import PrefillRequest
from adarag.evaluation.reuse import reuse_sources
from runs.engine import OUTPUT

FAMILIES = (
    (
        "GEMM (projections, MLP, LM head)",
        ("aten::addmm", "aten::mm", "aten::linear", "aten::bmm", "mkldnn::_linear_pointwise"),
    ),
    (
        "attention (SDPA or vLLM-CPU's kernel)",
        (
            "scaled_dot_product",
            "flash_attention",
            "_efficient_attention",
            "cpu_attention_with_kv_cache",
            "cpu_attn_reshape_and_cache",
            "get_scheduler_metadata",
        ),
    ),
    (
        "elementwise (silu, mul, add, norms, RoPE)",
        (
            "aten::mul",
            "aten::add",
            "aten::silu",
            "aten::rsqrt",
            "aten::pow",
            "aten::mean",
            "aten::neg",
            "aten::cat",
            "aten::sub",
        ),
    ),
    (
        "copies and casts",
        (
            "aten::copy_",
            "aten::to",
            "aten::_to_copy",
            "aten::contiguous",
            "aten::clone",
            "aten::index",
            "aten::index_put",
            "aten::scatter",
        ),
    ),
)


def family(name: str) -> str:
    """The family an op belongs to (by its aten name)."""
    for label, patterns in FAMILIES:
        if any(pattern in name for pattern in patterns):
            return label
    return "other"


def profiled(run, repeats: int) -> tuple[float, dict[str, float], list[tuple[str, float, int]]]:  # type: ignore[no-untyped-def]
    """Wall seconds per run, self CPU seconds per family and the top ops (per run)."""
    run()  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            run()
    events = prof.key_averages()
    total_self = sum(e.self_cpu_time_total for e in events) / 1e6 / repeats
    families: dict[str, float] = defaultdict(float)
    top = []
    for event in events:
        seconds = event.self_cpu_time_total / 1e6 / repeats
        families[family(event.key)] += seconds
        top.append((event.key, seconds, event.count // repeats))
    top.sort(key=lambda row: -row[1])
    return total_self, dict(families), top[:12]


def profile_ops(args: argparse.Namespace) -> None:
    """The ``profile`` subcommand."""

    rag = AdaRAG(AdaRagConfig.model_validate({"engine": {"dtype": args.dtype}}))
    engine = rag.engine
    results: dict[str, list[tuple[float, dict[str, float], list]]] = defaultdict(list)
    num_tokens = []
    prompts = musique_prompts(rag, args.data_dir, args.questions, args.passages)
    for _, layout, system_kv, chunk_kvs in prompts:
        num_tokens.append(layout.num_tokens)
        sources = reuse_sources(system_kv, chunk_kvs, 0.15)
        prefill = engine.prefill(PrefillRequest(layout, max_new_tokens=args.decode_tokens + 1))

        def decode(prefill=prefill) -> None:  # type: ignore[no-untyped-def]
            kv = prefill.kv
            start = kv.length
            token = int(prefill.logits.argmax())
            for _ in range(args.decode_tokens):
                token = int(engine.runner.decode(token, kv).argmax())
            kv.length = start

        with torch.inference_mode():
            results["full prefill"].append(
                profiled(lambda layout=layout: engine.prefill(PrefillRequest(layout)), args.repeats)
            )
            results["fused prefill @0.15"].append(
                profiled(
                    lambda layout=layout, sources=sources: engine.prefill(
                        PrefillRequest(layout, sources)
                    ),
                    args.repeats,
                )
            )
            results[f"decode x{args.decode_tokens}"].append(profiled(decode, args.repeats))
    _report(args, results, num_tokens)


def _report(
    args: argparse.Namespace,
    results: dict[str, list[tuple[float, dict[str, float], list]]],
    num_tokens: list[int],
) -> None:
    """``results/engine/<output>.{md,json}``: each variant's op families and top ops."""
    lines = [
        f"Engine op profile ({args.dtype}), {len(num_tokens)} musique questions x {args.passages} "
        f"passages (mean {statistics.fmean(num_tokens):.0f} tokens); self CPU seconds per run.",
        f"Machine: {machine()['cpu']}, {machine()['cores']} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads.",
        "",
    ]
    payload: dict[str, object] = {"machine": machine(), "dtype": args.dtype, "variants": {}}
    for variant, runs in results.items():
        total = statistics.fmean(run[0] for run in runs)
        fams: dict[str, float] = defaultdict(float)
        for run in runs:
            for name, seconds in run[1].items():
                fams[name] += seconds / len(runs)
        lines += [f"**{variant}**: {total:.3f} s", "", "| op family | s | share |", "|---|---|---|"]
        for name, seconds in sorted(fams.items(), key=lambda item: -item[1]):
            lines.append(f"| {name} | {seconds:.3f} | {100 * seconds / total:.1f}% |")
        lines += ["", "| top op (last question) | s | calls |", "|---|---|---|"]
        lines += [f"| {key} | {seconds:.3f} | {count} |" for key, seconds, count in runs[-1][2]]
        lines.append("")
        payload["variants"][variant] = {  # type: ignore[index]
            "seconds": total,
            "families": fams,
            "top_ops": runs[-1][2],
        }
    table = "\n".join(lines)
    print(table)
    write_results(args.output, payload, table, directory=OUTPUT)
