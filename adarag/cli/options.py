"""Options shared by sub-commands, and the configuration they build."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from adarag.config import AdaRagConfig
from adarag.errors import InputError
from adarag.schema import Chunk


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--model and --threads."""
    parser.add_argument("--model", help="'default' or a local Hugging Face checkpoint directory")
    parser.add_argument("--threads", type=int, help="CPU threads for torch")


def add_knowledge_base_arguments(parser: argparse.ArgumentParser) -> None:
    """--collection, --chroma-dir, --chunk-tokens, --chunk-overlap and --top-k."""
    parser.add_argument("--collection", help="Chroma collection (default: 'adarag')")
    parser.add_argument("--chroma-dir", help="Chroma directory (default: <home>/chroma)")
    parser.add_argument("--chunk-tokens", type=int, help="model tokens per ingested chunk")
    parser.add_argument("--chunk-overlap", type=int, help="tokens shared by adjacent chunks")
    parser.add_argument("--top-k", type=int, help="chunks retrieved per question")


_RETRIEVAL_ARGUMENTS = {
    "collection": "collection",
    "chroma_dir": "chroma_directory",
    "chunk_tokens": "chunk_tokens",
    "chunk_overlap": "chunk_overlap_tokens",
    "top_k": "top_k",
}


def build_config(args: argparse.Namespace, **overrides: Any) -> AdaRagConfig:
    """The configuration from ``--config``, the model and knowledge-base options, and overrides."""
    base = AdaRagConfig.from_file(args.config) if getattr(args, "config", None) else None
    engine: dict[str, Any] = dict(overrides.pop("engine", {}))
    if getattr(args, "model", None):
        engine["model"] = args.model
    if getattr(args, "threads", None):
        engine["num_threads"] = args.threads
    retrieval: dict[str, Any] = dict(overrides.pop("retrieval", {}))
    for option, field in _RETRIEVAL_ARGUMENTS.items():
        if getattr(args, option, None) is not None:
            retrieval[field] = getattr(args, option)
    return AdaRagConfig.build(base, engine=engine, retrieval=retrieval, **overrides)


def read_chunks(paths: list[str]) -> list[Chunk]:
    """Chunks from text/markdown files (one chunk each) or JSONL files of passages.

    A JSONL line is ``{"text": ...}`` (optionally ``title``, ``id``) or a QA record with
    ``passages: [{"title", "text"}, ...]``.

    Raises:
        InputError: A path is missing or a JSONL line is not a passage.
    """
    chunks: list[Chunk] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_file():
            raise InputError(f"chunk file {path} does not exist")
        if path.suffix != ".jsonl":
            chunks.append(Chunk(path.read_text(), chunk_id=str(path), metadata={"source": raw}))
            continue
        for line_no, line in enumerate(path.read_text().splitlines(), start=1):
            if line.strip():
                chunks.extend(_passages(json.loads(line), f"{raw}:{line_no}"))
    return chunks


def _passages(record: dict[str, Any], where: str) -> list[Chunk]:
    if "text" in record:
        text = f"{record['title']}\n{record['text']}" if record.get("title") else record["text"]
        return [Chunk(text, chunk_id=str(record.get("id", where)), metadata={"source": where})]
    if "passages" in record:
        return [
            chunk
            for idx, passage in enumerate(record["passages"])
            for chunk in _passages(passage, f"{where}#{idx}")
        ]
    raise InputError(f"{where}: a JSONL line needs a 'text' or a 'passages' field")
