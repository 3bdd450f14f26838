"""Options shared by sub-commands, and the configuration they build."""

from __future__ import annotations

import argparse
from typing import Any

from adarag.config import AdaRagConfig


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--model and --threads."""
    parser.add_argument(
        "--model",
        help="'default' (smollm2-135m), 'qwen2.5-coder-0.5b' or a local Hugging Face checkpoint "
        "directory",
    )
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
