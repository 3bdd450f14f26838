"""``storage.py formats``: bytes per token, disk load and compute per chunk, per storage format."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from common import RESULTS, load_jsonl, machine, write_results

from adarag import AdaRAG
from adarag.cache.codec import TokenLayout
from adarag.cache.store import LayeredKVStore
from adarag.config import StoreConfig
from adarag.evaluation.reuse import system_prefix_kv
from adarag.kv import ChunkKV

FORMATS = ("float32", "float16", "bfloat16", "int8")


def storage_formats(args: argparse.Namespace) -> None:
    """The ``formats`` subcommand."""

    rag = AdaRAG(engine={"model": args.model})
    engine, spec = rag.engine, rag.engine.spec
    layout = TokenLayout(spec.num_layers, spec.num_kv_heads, spec.head_dim)
    rows = load_jsonl("musique_dev.jsonl", args.data_dir, limit=args.chunks)
    texts = [row["passages"][0]["text"] for row in rows][: args.chunks]
    system_ids = rag.prompts.system_ids
    system_kv = system_prefix_kv(engine, rag.prompts.layout("?", texts[:1]))
    chunk_ids = [rag.prompts.chunk_ids(text) for text in texts]
    compute_s, kvs = [], []
    for ids in chunk_ids:
        started = time.perf_counter()
        kvs.append(engine.compute_chunk(system_ids, ids, system_kv))
        compute_s.append(time.perf_counter() - started)
    tokens = sum(len(ids) for ids in chunk_ids)
    results: dict[str, Any] = {}
    for storage in FORMATS:
        results[storage] = _measure_format(storage, layout, kvs, tokens, compute_s)
        print(storage, results[storage])
    _write_table(args, engine.checkpoint.name, len(kvs), tokens, results)


def _measure_format(
    storage: str, layout: TokenLayout, kvs: list[ChunkKV], tokens: int, compute_s: list[float]
) -> dict[str, float]:
    """Bytes per token on disk and median seconds to load a chunk from a cold store."""
    with tempfile.TemporaryDirectory() as directory:
        config = StoreConfig(storage_dtype=storage, memory_capacity_bytes=0)
        writer = LayeredKVStore(config, Path(directory), "bench", layout)
        for idx, kv in enumerate(kvs):
            writer.put([f"chunk-{idx}"], kv, persist=True)
        disk_bytes = writer.snapshot().disk_bytes
        reader = LayeredKVStore(config, Path(directory), "bench", layout)  # a cold process
        load_s = []
        for idx in range(len(kvs)):
            started = time.perf_counter()
            loaded = reader.get(f"chunk-{idx}")
            load_s.append(time.perf_counter() - started)
            assert loaded is not None
    return {
        "bytes_per_token": disk_bytes / tokens,
        "load_s_per_chunk": statistics.median(load_s),
        "compute_s_per_chunk": statistics.median(compute_s),
    }


def _write_table(
    args: argparse.Namespace, name: str, num_chunks: int, tokens: int, results: dict[str, Any]
) -> None:
    """``results/storage-formats/<name>_<model>.{md,json}``."""
    measured_on = machine()
    lines = [
        f"# Chunk-KV storage formats: {name}",
        "",
        f"Machine: {measured_on['cpu']}, {measured_on['cores']} cores, torch "
        f"{measured_on['torch']}; {num_chunks} MuSiQue passages, {tokens / num_chunks:.0f} tokens "
        "each on average; medians per chunk. Disk load = read + checksum + layout check + decode, "
        "from a store opened cold (page cache warm).",
        "",
        "| storage | bytes/token | ×float32 | disk load s/chunk | compute s/chunk | compute/load |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    full = results["float32"]["bytes_per_token"]
    for storage, row in results.items():
        lines.append(
            f"| {storage} | {row['bytes_per_token']:.0f} | {full / row['bytes_per_token']:.2f} | "
            f"{row['load_s_per_chunk']:.4f} | {row['compute_s_per_chunk']:.3f} | "
            f"{row['compute_s_per_chunk'] / row['load_s_per_chunk']:.1f} |"
        )
    write_results(
        f"{args.name}_{name}",
        {"machine": measured_on, "model": name, "tokens": tokens, "formats": results},
        "\n".join(lines),
        directory=RESULTS / "storage-formats",
    )
