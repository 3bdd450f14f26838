"""``adarag ask``: answer a question over given chunks through the pipeline, reusing their KV."""

from __future__ import annotations

import argparse
import time
from typing import Any

from adarag.cli.display import describe, stream_answer
from adarag.cli.options import add_model_arguments, build_config, positive_int
from adarag.errors import InputError
from adarag.pipeline import AdaRAG
from adarag.retrievers.chunking import read_passages
from adarag.schema import GenerationParams

HELP = "answer a question over chunks (files or JSONL passages) with fused chunk-KV prefill"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the command's options."""
    parser.add_argument("question", help="the question to answer")
    parser.add_argument(
        "chunks", nargs="+", help="text/markdown files, JSONL of passages, or folders of them"
    )
    parser.add_argument(
        "--ratio",
        type=float,
        help="recomputation ratio of chunks reused from the independent tier "
        "(default: cache.independent.recompute_ratio)",
    )
    parser.add_argument("--full", action="store_true", help="full prefill (no reuse) instead")
    parser.add_argument("--max-new-tokens", type=positive_int, default=48)
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Warm each chunk's KV (once, kept in the home), answer statically; print the figures."""
    cache: dict[str, Any] = {}
    if args.ratio is not None:
        cache["independent"] = {"recompute_ratio": args.ratio}
    if args.full:
        cache = {tier: {"enabled": False} for tier in ("hard", "soft", "independent")}
    flags = {"cache.independent.recompute_ratio": "--ratio"}
    config = build_config(args, flags, cache=cache, augment={"enabled": False})
    chunks = read_passages(args.chunks)
    if not chunks:
        raise InputError("no chunks given; pass at least one file or passage")
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    with AdaRAG(config) as rag:
        if not args.full:
            started = time.perf_counter()
            computed = rag.warm(chunks)
            print(
                f"precomputed {computed} of {len(chunks)} chunks "
                f"in {time.perf_counter() - started:.2f} s"
            )
        print("answer: ", end="")
        answer = stream_answer(rag.stream(args.question, chunks=chunks, params=params))
        print("\n".join(describe(answer)))
    return 0
