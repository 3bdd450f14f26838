"""``vllm_connector.py serve-load``: plain vllm serve, with the connector, and adarag serve."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import tempfile
from pathlib import Path

from common import load_jsonl, machine, write_results

from adarag import AdaRAG, AdaRagConfig
from runs.serve_load.server import ingest
from runs.vllm_connector import OUTPUT
from runs.vllm_connector.serve_load_clients import run_level
from runs.vllm_connector.serve_load_report import agreement_with_vllm, serve_load_table
from runs.vllm_connector.serve_load_servers import variant_servers


def _questions(args: argparse.Namespace) -> list[str]:
    """The benchmark's questions, one per request of every client count."""
    rows = load_jsonl("2wikimqa_dev.jsonl", args.data_dir)[: sum(args.requests)]
    return [row["question"] for row in rows]


def _prepare(root: Path, args: argparse.Namespace) -> tuple[AdaRagConfig, int]:
    """The knowledge base (ingested, chunk KV precomputed) and the config every adarag uses.

    The knowledge base holds the evidence passages of every question, so each question
    retrieves its own evidence among other questions' passages.
    """
    rows = load_jsonl("2wikimqa_dev.jsonl", args.data_dir)[: sum(args.requests)]
    titles = {title for row in rows for title in row["gold_titles"]}
    passages = [
        p for p in load_jsonl("2wikimqa_corpus.jsonl", args.data_dir) if p["title"] in titles
    ]
    corpus = root / "passages.jsonl"
    corpus.write_text("".join(json.dumps({"text": p["text"]}) + "\n" for p in passages))
    config = AdaRagConfig.build(
        engine={
            "model": args.model,
            "num_threads": args.threads,
            "max_context_tokens": args.max_model_len,
        },
        retrieval={
            "chroma_directory": str(root / "chroma"),
            "collection": "load",
            "top_k": args.top_k,
            "min_top_score": None,
        },
        cache={"store": {"directory": str(root / "kv")}},
    )
    ingest(root, config, corpus)
    return config, len(passages)


def _levels(config: AdaRagConfig, args: argparse.Namespace) -> list[tuple[int, list[dict]]]:
    """Per client count, its questions with the prompt adarag builds for each."""
    from adarag.cli.options import open_knowledge_base

    questions = _questions(args)
    levels, offset = [], 0
    with open_knowledge_base(config) as kb:
        rag = AdaRAG(config, retriever=kb)
        for clients, requests in zip(args.clients, args.requests, strict=True):
            prompts = []
            for question in questions[offset : offset + requests]:
                chunks = rag.retrieve(question)
                layout = rag.layout(question, chunks)
                prompts.append(
                    {
                        "question": question,
                        "chunk_order": [c.chunk_id for c in chunks],
                        "token_ids": list(layout.token_ids),
                    }
                )
            levels.append((clients, prompts))
            offset += requests
        rag.close()
    return levels


def vllm_serve_load(args: argparse.Namespace) -> None:
    """The ``serve-load`` subcommand."""
    assert len(args.requests) == len(args.clients), "one --requests per --clients"
    # the hand-over key the replicas and the front ends this run starts share (they inherit it)
    os.environ.setdefault("ADARAG_HANDOFF_KEY", secrets.token_hex(32))
    if args.tables_only:
        payload = json.loads((OUTPUT / f"{args.output}.json").read_text())
        model = payload["settings"]["model"]
        agreement_with_vllm(payload["variants"], AdaRagConfig.build(engine={"model": model}))
        write_results(args.output, payload, serve_load_table(payload), directory=OUTPUT)
        return

    with tempfile.TemporaryDirectory(prefix="adarag-vllm-serve-") as tmp:
        root = Path(tmp)
        config, num_passages = _prepare(root, args)
        levels = _levels(config, args)
        results = {}
        for variant in args.variants:
            with variant_servers(variant, root, config, args) as (url, startup_s):
                runs = []
                for clients, prompts in levels:
                    if variant == "connector@1.0" and clients != 1:
                        continue
                    runs.append(asyncio.run(run_level(variant, url, clients, prompts, args)))
                    print(json.dumps({"variant": variant, **runs[-1]["summary"]}), flush=True)
                results[variant] = {"startup_s": startup_s, "levels": runs}
    agreement_with_vllm(results, config)
    prompts = [p for _, level in levels for p in level]
    payload = {
        "machine": machine(),
        "settings": vars(args),
        "num_passages": num_passages,
        "mean_prompt_tokens": sum(len(p["token_ids"]) for p in prompts) / len(prompts),
        "chunk_orders": [p["chunk_order"] for p in prompts],
        "variants": results,
    }
    payload["settings"]["data_dir"] = str(args.data_dir)
    write_results(args.output, payload, serve_load_table(payload), directory=OUTPUT)
