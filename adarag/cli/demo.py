"""``adarag demo``: ingest the bundled corpus into Chroma, then answer a few bundled questions."""

from __future__ import annotations

import argparse
from importlib import resources

from adarag.cli.display import describe, stream_answer
from adarag.cli.ingest import ingest_and_warm, warm_chunks
from adarag.cli.options import (
    add_knowledge_base_arguments,
    add_model_arguments,
    answer_tokens,
    build_config,
    positive_int,
)
from adarag.data import demo_questions
from adarag.pipeline import AdaRAG
from adarag.retrievers import KnowledgeBase
from adarag.schema import GenerationParams

HELP = "ingest a bundled corpus into Chroma and answer questions, showing sources, TTFT and tiers"
DEMO_COLLECTION = "adarag-demo"
DEMO_TOP_K = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the command's options."""
    parser.add_argument("--questions", type=positive_int, default=3, help="how many demo questions")
    parser.add_argument(
        "--max-new-tokens",
        type=answer_tokens,
        default=32,
        help="answer tokens generated at most per question (default: 32)",
    )
    parser.add_argument(
        "--rewarm", action="store_true", help="precompute the KV of chunks stored by earlier runs"
    )
    add_knowledge_base_arguments(
        parser, default_collection=DEMO_COLLECTION, default_top_k=DEMO_TOP_K
    )
    parser.set_defaults(collection=DEMO_COLLECTION, top_k=DEMO_TOP_K)
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Ingest (unchanged data is skipped), answer the questions, then warm the rest.

    Only the chunks the questions retrieve have their KV precomputed before the first answer;
    every other chunk of the corpus (of the whole collection with ``--rewarm``) is warmed after
    the answers, so a later ``adarag chat`` finds them cached.
    """
    config = build_config(args)
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    questions = demo_questions()[: args.questions]
    with KnowledgeBase.from_config(config) as kb:
        rag = AdaRAG(config, retriever=kb)
        corpus = resources.files("adarag.data").joinpath("demo_corpus.jsonl")
        with resources.as_file(corpus) as corpus_path:
            report = ingest_and_warm(rag, kb, [corpus_path], warm=False)
        needed = {
            chunk.chunk_id: chunk
            for record in questions
            for chunk in rag.retrieve(str(record["question"]))
        }
        warm_chunks(rag, list(needed.values()), desc="warming the questions' chunks")
        for record in questions:
            question = str(record["question"])
            gold = ", ".join(str(answer) for answer in record["answers"])  # type: ignore[attr-defined]
            print(f"\nQ: {question}  (gold: {gold})\nA: ", end="")
            answer = stream_answer(rag.stream(question, params=params))
            print("\n".join(describe(answer)))
        print()
        if args.rewarm:
            warm_chunks(rag, kb.chunks(), desc="warming stored chunks")
        else:
            # every chunk of the corpus, not only the added ones: a run stopped before their KV
            # was stored (a crash, ^C) is completed here
            warm_chunks(rag, kb.chunks(sources=report.sources), desc="warming the other chunks")
    print(
        f"\nChat with this corpus: adarag chat --collection {config.retrieval.collection}"
        "\nAdd your own files:    adarag ingest notes.md passages.jsonl && adarag chat"
    )
    return 0
