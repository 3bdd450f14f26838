"""``adarag check``: the blending gate, run on the model before it serves reused chunk KV."""

from __future__ import annotations

import argparse
import sys

from adarag.cli.options import add_model_arguments, build_config, positive_int
from adarag.data import demo_corpus, demo_questions
from adarag.engine.gate import DEFAULT_SHIFT, check_blending
from adarag.pipeline import AdaRAG
from adarag.retrievers import MemoryRetriever
from adarag.schema import PromptLayout

HELP = "check that reusing chunk KV is exact for the model (re-rotation, ratio 1.0)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the command's options."""
    parser.add_argument(
        "--chunks", type=positive_int, default=2, help="bundled chunks in the checked prompt"
    )
    parser.add_argument(
        "--shift",
        type=positive_int,
        default=DEFAULT_SHIFT,
        help="positions the stored chunk KV is displaced from where it is loaded",
    )
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run the gate on a bundled question; 0 when it passes, 1 when a check fails."""
    rag = AdaRAG(build_config(args))
    try:
        report = check_blending(rag.engine, _layout(rag, args.chunks), shift=args.shift)
    finally:
        rag.close()
    print(report.summary())
    if report.passed:
        return 0
    print(
        f"adarag check: {report.model} failed the blending gate; do not serve it with reused "
        "chunk KV until it passes: serve the 'full' policy, which reuses nothing, or turn the "
        "tiers off (cache.hard, cache.soft and cache.independent with enabled=false)",
        file=sys.stderr,
    )
    return 1


def _layout(rag: AdaRAG, num_chunks: int) -> PromptLayout:
    """The first bundled question over its top BM25 chunks, laid out as the pipeline does."""
    question = str(demo_questions()[0]["question"])
    chunks = MemoryRetriever(demo_corpus()).retrieve(question, num_chunks)
    return rag.prompts.layout(question, [chunk.text for chunk in chunks])
