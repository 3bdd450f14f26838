"""``adarag profile``: measure the model's attention sinks and write its profile and heatmaps."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from adarag.cli.options import add_model_arguments, build_config, check_input_paths
from adarag.data import demo_corpus, demo_questions
from adarag.evaluation.plots import plot_profile
from adarag.evaluation.profiling.sinks import build_profile, chunk_attention
from adarag.pipeline import AdaRAG
from adarag.retrievers import MemoryRetriever

HELP = "profile chunk-level attention (transition layer, sink chunk) into the model's profile"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the command's options."""
    parser.add_argument(
        "--data",
        type=Path,
        help="JSONL of QA records with 'question' and 'passages' (e.g. musique_dev.jsonl); "
        "default: the bundled corpus with BM25-retrieved chunks",
    )
    parser.add_argument("--prompts", type=int, default=12, help="prompts to average over")
    parser.add_argument("--chunks", type=int, default=6, help="chunks per prompt (>= 3)")
    parser.add_argument("--output", type=Path, help="profile JSON path (default: in the home)")
    parser.add_argument("--plots", type=Path, help="directory for the PNG heatmaps")
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run the prompts, analyse, write JSON and PNGs."""
    if args.data is not None:
        check_input_paths([args.data], "--data")
    config = build_config(args)
    rag = AdaRAG(config)
    engine = rag.engine
    questions = _prompts(args.data, args.prompts, args.chunks)
    attention, count = chunk_attention(engine, rag.prompts, questions, args.chunks)
    profile = build_profile(engine, attention, count, engine.checkpoint.name)
    output = args.output or config.home / "profiles" / f"{engine.fingerprint}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(profile.to_json() + "\n")
    plots = plot_profile(profile, args.plots or output.with_suffix(""))
    print(f"profiled {count} prompts x {args.chunks} chunks of {engine.checkpoint.name}")
    for band in profile.bands:
        print(f"  layers {band.start + 1:>2}-{band.end:<2} {band.pattern}")
    sink = "none" if profile.sink_chunk_idx is None else f"chunk {profile.sink_chunk_idx + 1}"
    print(f"transition layer: {profile.transition_layer}, sink: {sink}")
    print(f"profile: {output}")
    print(f"heatmaps: {', '.join(str(path) for path in plots)}")
    return 0


def _prompts(data: Path | None, limit: int, num_chunks: int) -> list[tuple[str, list[str]]]:
    if data is not None:
        rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
        return [
            (row["question"], [p["text"] for p in row["passages"][:num_chunks]])
            for row in rows[:limit]
        ]
    retriever = MemoryRetriever(demo_corpus())
    questions = [str(record["question"]) for record in demo_questions()][:limit]
    return [(q, [c.text for c in retriever.retrieve(q, num_chunks)]) for q in questions]
