"""Options shared by sub-commands, and the configuration they build."""

from __future__ import annotations

import argparse
import json
from typing import Any

from adarag.config import AdaRagConfig
from adarag.errors import InputError


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--model and --threads."""
    parser.add_argument(
        "--model",
        help="'default' (smollm2-135m), 'qwen2.5-coder-0.5b' or a local Hugging Face checkpoint "
        "directory",
    )
    parser.add_argument("--threads", type=int, help="CPU threads for torch")


def add_knowledge_base_arguments(parser: argparse.ArgumentParser) -> None:
    """--collection, --chroma-dir, --chunk-tokens, --chunk-overlap, --top-k and --where."""
    parser.add_argument("--collection", help="Chroma collection (default: 'adarag')")
    parser.add_argument("--chroma-dir", help="Chroma directory (default: <home>/chroma)")
    parser.add_argument("--chunk-tokens", type=int, help="model tokens per ingested chunk")
    parser.add_argument("--chunk-overlap", type=int, help="tokens shared by adjacent chunks")
    parser.add_argument("--top-k", type=int, help="chunks retrieved per question")
    parser.add_argument(
        "--where",
        action="append",
        metavar="KEY=VALUE",
        help="retrieve only chunks with this metadata (repeat for several; VALUE read as JSON "
        "when it parses, e.g. chunk_idx=0, else as text)",
    )


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
    if getattr(args, "where", None):
        retrieval["where"] = dict(_metadata_pair(item) for item in args.where)
    return AdaRagConfig.build(base, engine=engine, retrieval=retrieval, **overrides)


def _metadata_pair(item: str) -> tuple[str, Any]:
    """``KEY=VALUE`` as (key, value), the value parsed as JSON when it parses.

    Raises:
        InputError: No ``=`` or an empty key.
    """
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise InputError(f"--where takes KEY=VALUE, got {item!r} (e.g. --where title=Lothair)")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value
