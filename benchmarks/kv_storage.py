"""Chunk-KV storage formats: bytes per token, and loading an entry from disk against computing it.

For each storage format (float32, float16, bfloat16, int8) and one real model: the bytes an
entry takes per token on disk, the time to load a stored chunk from the disk tier (read, verify
the checksum and layout, decode) and the time to compute the same chunk's KV (a prefill of the
chunk after the system prefix), side by side over the same passages. Agreement with full
recomputation per format is measured by ``fidelity.py --storage ...``.

    python benchmarks/kv_storage.py --model default --chunks 8
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from common import load_jsonl, machine, write_results

from adarag import AdaRAG
from adarag.cache.codec import TokenLayout
from adarag.cache.store import LayeredKVStore
from adarag.config import StoreConfig
from adarag.evaluation.reuse import system_prefix_kv

FORMATS = ("float32", "float16", "bfloat16", "int8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="default")
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--name", default="kv_storage")
    args = parser.parse_args()

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
        results[storage] = {
            "bytes_per_token": disk_bytes / tokens,
            "load_s_per_chunk": statistics.median(load_s),
            "compute_s_per_chunk": statistics.median(compute_s),
        }
        print(storage, results[storage])
    measured_on = machine()
    name = engine.checkpoint.name
    lines = [
        f"# Chunk-KV storage formats: {name}",
        "",
        f"Machine: {measured_on['cpu']}, {measured_on['cores']} cores, torch "
        f"{measured_on['torch']}; {len(kvs)} MuSiQue passages, {tokens / len(kvs):.0f} tokens "
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
    )


if __name__ == "__main__":
    main()
