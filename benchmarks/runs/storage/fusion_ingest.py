"""``storage.py fusion-ingest``: warming fused chunk KV against warming independent KV only."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from common import RESULTS, load_jsonl, machine, write_results

from adarag import AdaRAG, AdaRagConfig
from adarag.evaluation.machine import describe_machine
from adarag.retrievers import KnowledgeBase
from adarag.schema import Chunk


class _TimedRetriever:
    """The knowledge base's retrieval, its seconds summed."""

    def __init__(self, kb: KnowledgeBase) -> None:
        self.kb, self.seconds = kb, 0.0

    def retrieve(self, query: str, top_k: int) -> list[Chunk]:
        started = time.perf_counter()
        found = self.kb.retrieve(query, top_k)
        self.seconds += time.perf_counter() - started
        return found


def _warm(home: Path, model: str, chunks: list[Chunk], kb: KnowledgeBase, **cache: Any) -> dict:
    config = AdaRagConfig.build(home=home, engine={"model": model}, cache=cache)
    retriever = _TimedRetriever(kb)
    rag = AdaRAG(config, retriever=retriever)
    rag.warm([])  # the model and the system prefix, untimed
    started = time.perf_counter()
    rag.warm(chunks)
    seconds = time.perf_counter() - started
    stats = rag.cache_stats().store
    return {
        "warm_s_per_chunk": seconds / len(chunks),
        "search_s_per_chunk": retriever.seconds / len(chunks),
        "disk_bytes": stats.disk_bytes,
        "entries": stats.disk_entries,
    }


def fusion_ingest(args: argparse.Namespace) -> None:
    """The ``fusion-ingest`` subcommand."""
    measured_on = machine()  # the load average before the runs
    rows = load_jsonl("2wikimqa_corpus.jsonl", args.data_dir, limit=args.chunks)
    chunks = [Chunk(f"{row['title']}\n{row['text']}") for row in rows]
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        retrieval = AdaRagConfig.build(home=root / "kb", retrieval={"min_top_score": None})
        with KnowledgeBase.from_config(retrieval) as kb:
            stored = kb.add_chunks(chunks)
            plain = _warm(root / "plain", args.model, stored, kb)
            fusion = {"enabled": True, "num_neighbors": args.neighbors}
            fused = _warm(root / "fused", args.model, stored, kb, fusion=fusion)
    lines = [
        f"# FusionRAG ingest cost ({Path(args.model).name}, {len(chunks)} 2Wiki passages, "
        f"{args.neighbors} neighbours)",
        "",
        describe_machine(measured_on) + " Shared with other jobs: timings are indicative.",
        "",
        "| warm | s/chunk | of which neighbour search | KV on disk (MB) | entries |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, row in (("independent KV only", plain), ("independent + fused KV", fused)):
        lines.append(
            f"| {label} | {row['warm_s_per_chunk']:.3f} | {row['search_s_per_chunk']:.3f} "
            f"| {row['disk_bytes'] / 2**20:.1f} | {row['entries']} |"
        )
    ratio_s = fused["warm_s_per_chunk"] / plain["warm_s_per_chunk"]
    ratio_bytes = fused["disk_bytes"] / plain["disk_bytes"]
    lines += ["", f"Fused warm: {ratio_s:.1f}x the time and {ratio_bytes:.2f}x the bytes."]
    table = "\n".join(lines)
    print(table)
    write_results(
        args.name,
        {
            "machine": measured_on,
            "chunks": len(chunks),
            "neighbors": args.neighbors,
            "plain": plain,
            "fused": fused,
        },
        table,
        directory=RESULTS / "policies",
    )
