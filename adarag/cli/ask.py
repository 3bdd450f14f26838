"""``adarag ask``: answer a question over given chunks, reusing their KV."""

from __future__ import annotations

import argparse
import time

from adarag.cli.options import add_model_arguments, build_config, read_chunks
from adarag.engine.batch import SegmentSource
from adarag.engine.generator import TorchGenerator
from adarag.errors import InputError
from adarag.schema import GenerationParams, PromptLayout

HELP = "answer a question over chunks (files or JSONL passages) with fused chunk-KV prefill"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the command's options."""
    parser.add_argument("question", help="the question to answer")
    parser.add_argument("chunks", nargs="+", help="text/markdown files or JSONL of passages")
    parser.add_argument(
        "--ratio", type=float, default=0.15, help="recomputation ratio of cached chunks"
    )
    parser.add_argument("--full", action="store_true", help="full prefill (no reuse) instead")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Precompute each chunk's KV, fuse, decode; print answer, TTFT and recomputed tokens."""
    config = build_config(args, cache={"independent": {"recompute_ratio": args.ratio}})
    chunks = read_chunks(args.chunks)
    if not chunks:
        raise InputError("no chunks given; pass at least one file or passage")
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    generator = TorchGenerator(config)
    layout = generator.layout(args.question, [chunk.text for chunk in chunks])
    generator.check_fits(layout, params.max_new_tokens)
    sources = None
    if not args.full:
        started = time.perf_counter()
        system = generator.prefill(PromptLayout((), (), layout.system_ids))
        system_kv = system.kv.segment(0, len(layout.system_ids))
        chunk_kvs = [generator.compute_chunk(ids, system_kv) for ids in layout.chunk_ids]
        print(f"precomputed {len(chunk_kvs)} chunks in {time.perf_counter() - started:.2f} s")
        ratio = config.cache.independent.recompute_ratio
        sources = [SegmentSource(system_kv), *(SegmentSource(kv, ratio) for kv in chunk_kvs)]
        sources.append(SegmentSource())
    started = time.perf_counter()
    output = generator.prefill(layout, sources, max_new_tokens=params.max_new_tokens)
    answer = generator.stream(layout, output, params)
    first = next(answer, "")
    ttft = time.perf_counter() - started
    print(f"answer: {first}{''.join(answer)}")
    print(
        f"TTFT {ttft:.2f} s | prompt {layout.num_tokens} tokens | recomputed "
        f"{output.num_recomputed_tokens} ({output.num_recomputed_tokens / layout.num_tokens:.1%})"
    )
    return 0
