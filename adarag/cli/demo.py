"""``adarag demo``: answer bundled questions over a bundled corpus, full vs fused prefill."""

from __future__ import annotations

import argparse
import time

from adarag.cli.options import add_model_arguments, build_config
from adarag.data import demo_corpus, demo_questions
from adarag.engine.batch import SegmentSource
from adarag.engine.generator import TorchGenerator
from adarag.retrievers import MemoryRetriever
from adarag.schema import GenerationParams, PromptLayout

HELP = "answer a few bundled questions, showing sources, TTFT and recomputed tokens"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the command's options."""
    parser.add_argument("--questions", type=int, default=3, help="how many demo questions")
    parser.add_argument("--top-k", type=int, default=4)
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Retrieve, warm the chunks' KV, answer with full and with fused prefill."""
    config = build_config(args)
    generator = TorchGenerator(config)
    retriever = MemoryRetriever(demo_corpus())
    params = GenerationParams(max_new_tokens=32)
    ratio = config.cache.independent.recompute_ratio
    system = generator.prefill(PromptLayout((), (), generator.prompts.system_ids))
    system_kv = system.kv.segment(0, len(generator.prompts.system_ids))
    for record in demo_questions()[: args.questions]:
        question = str(record["question"])
        chunks = retriever.retrieve(question, args.top_k)
        layout = generator.layout(question, [chunk.text for chunk in chunks])
        chunk_kvs = [generator.compute_chunk(ids, system_kv) for ids in layout.chunk_ids]
        print(f"\nQ: {question}  (gold: {record['answers']})")
        for chunk in chunks:
            print(f"   source: {chunk.metadata.get('title')} (score {chunk.score:.1f})")
        fused = [SegmentSource(system_kv), *(SegmentSource(kv, ratio) for kv in chunk_kvs)]
        for label, sources in (("full prefill", None), (f"fused, ratio {ratio}", fused)):
            started = time.perf_counter()
            output = generator.prefill(
                layout, sources and [*sources, SegmentSource()], max_new_tokens=32
            )
            stream = generator.stream(layout, output, params)
            first = next(stream, "")
            ttft = time.perf_counter() - started
            print(
                f"   {label:>20}: TTFT {ttft:.2f} s, recomputed "
                f"{output.num_recomputed_tokens}/{layout.num_tokens} | {first}{''.join(stream)}"
            )
    return 0
