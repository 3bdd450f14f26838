"""``adarag ask``: answer one question from the knowledge base, or over given files."""

from __future__ import annotations

import argparse
import time
from typing import Any

from adarag.cli.display import describe, stream_answer
from adarag.cli.options import (
    add_knowledge_base_arguments,
    add_model_arguments,
    answer_tokens,
    build_config,
    open_knowledge_base,
)
from adarag.errors import InputError
from adarag.pipeline import AdaRAG
from adarag.retrievers.chunking import read_passages
from adarag.schema import GenerationParams

HELP = (
    "answer one question from the knowledge base (as chat does), or over given files or JSONL "
    "passages with fused chunk-KV prefill"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the command's options."""
    parser.add_argument("question", help="the question to answer")
    parser.add_argument(
        "chunks",
        nargs="*",
        help="text/markdown files, JSONL of passages, or folders of them; none: the knowledge "
        "base (--collection, --chroma-dir or --chroma-url, --top-k, --where)",
    )
    parser.add_argument(
        "--ratio",
        type=float,
        help="recomputation ratio of chunks reused from the independent tier "
        "(default: cache.independent.recompute_ratio)",
    )
    parser.add_argument("--full", action="store_true", help="full prefill (no reuse) instead")
    parser.add_argument(
        "--max-new-tokens",
        type=answer_tokens,
        default=48,
        help="answer tokens generated at most (default: 48)",
    )
    add_knowledge_base_arguments(parser)
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Answer from the knowledge base, or warm the given chunks' KV and answer statically."""
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    if not args.chunks:
        return _ask_knowledge_base(args, params)
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


def _ask_knowledge_base(args: argparse.Namespace, params: GenerationParams) -> int:
    """Retrieve from the knowledge base and answer with adaptive augmentation."""
    if args.ratio is not None or args.full:
        raise InputError("--ratio and --full apply to given files; pass the files to read")
    config = build_config(args)
    with open_knowledge_base(config) as kb:
        with AdaRAG(config, retriever=kb) as rag:
            print("answer: ", end="")
            answer = stream_answer(rag.stream(args.question, params=params))
            print("\n".join(describe(answer)))
    return 0
