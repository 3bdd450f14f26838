"""Shared pieces of the benchmark scripts: data, timing, machine description, result files."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adarag.config import RecomputeConfig
from adarag.evaluation.machine import machine
from adarag.evaluation.workload import DATA_DIR_ENV, DEFAULT_DATA_DIR

if TYPE_CHECKING:
    from adarag import AdaRAG

__all__ = [
    "CACHE",
    "DEFAULT_DATA_DIR",
    "machine",
    "load_jsonl",
    "musique_prompts",
    "pipeline_for",
    "rows_dir",
    "run_subcommand",
    "timed",
    "summary",
    "write_results",
]

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
CACHE = Path(os.environ.get("ADARAG_BENCH_CACHE", Path.home() / ".cache" / "adarag-bench"))
"""What the repository does not keep: per-question rows (so a long run resumes), retrieved
chunks, probe records. ``$ADARAG_BENCH_CACHE``, else ``~/.cache/adarag-bench``."""


def rows_dir(output: Path) -> Path:
    """Where the per-question rows of the results written under ``output`` go.

    The same path under :data:`CACHE` for a folder of ``benchmarks/results``; ``output`` itself
    for a folder elsewhere.
    """
    try:
        return CACHE / output.resolve().relative_to(RESULTS)
    except ValueError:
        return output


def load_jsonl(name: str, data_dir: Path | None = None, limit: int | None = None) -> list[dict]:
    """Rows of ``<data_dir>/<name>`` (default ``$ADARAG_DATA_DIR``, else ``./data``)."""
    path = (data_dir or DEFAULT_DATA_DIR) / name
    if not path.is_file():
        raise SystemExit(f"data file {path} not found; pass --data-dir or set {DATA_DIR_ENV}")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows[:limit] if limit else rows


def musique_prompts(
    rag: Any, data_dir: Path | None, questions: int, passages: int
) -> Iterator[tuple[dict, Any, Any, list[Any]]]:
    """Per musique question: its row, prompt, system KV and each chunk's independent KV.

    The prompt holds the question's first ``passages`` passages; the KV is computed as ingest
    computes it (untimed).
    """
    from adarag.evaluation.reuse import independent_chunks

    for row in load_jsonl("musique_dev.jsonl", data_dir, questions):
        layout = rag.prompts.layout(
            row["question"], [p["text"] for p in row["passages"][:passages]]
        )
        system_kv, chunk_kvs = independent_chunks(rag.engine, layout)
        yield row, layout, system_kv, chunk_kvs


def pipeline_for(model: str, threads: int | None) -> AdaRAG:
    """A pipeline of ``model`` on ``threads`` torch threads (torch's own count when None)."""
    from adarag import AdaRAG

    engine: dict[str, Any] = {"model": model}
    if threads:
        engine["num_threads"] = threads
    return AdaRAG(engine=engine)


def run_subcommand(parser: argparse.ArgumentParser) -> None:
    """Parse the command line and run the chosen subcommand's function (its ``fn`` default).

    The function gets the subcommand's options alone, as a script of that one command would:
    the namespace holds neither the subcommand's name (``command``) nor its function, so the
    results that record every option record the same ones.
    """
    args = parser.parse_args()
    command = args.fn
    del args.fn, args.command
    command(args)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Wall seconds of one call and its result."""
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def summary(values: list[float]) -> dict[str, float]:
    """Mean, p50 and p95 of a list of seconds."""
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"mean": statistics.fmean(values), "p50": statistics.median(values), "p95": p95}


def load_summary(results: list[dict], clients: int, wall_s: float, tokens: int) -> dict:
    """One client count's figures: requests and tokens per second, TTFT and latency.

    Args:
        results: One dict per request, with its ``ttft_s`` and ``latency_s``.
        clients: Concurrent clients.
        wall_s: Seconds from the first request sent to the last answer ended.
        tokens: Completion tokens of all the requests.
    """
    ttft = summary([r["ttft_s"] for r in results])
    return {
        "clients": clients,
        "num_requests": len(results),
        "wall_s": wall_s,
        "requests_per_s": len(results) / wall_s,
        "tokens_per_s": tokens / wall_s,
        "completion_tokens": tokens,
        "ttft_p50_s": ttft["p50"],
        "ttft_p95_s": ttft["p95"],
        "latency_p50_s": summary([r["latency_s"] for r in results])["p50"],
    }


def write_results(name: str, payload: Any, table: str | None, *, directory: Path = RESULTS) -> None:
    """Write ``<directory>/<name>.json`` (``payload``) and ``<directory>/<name>.md`` (``table``).

    A None ``payload`` or ``table`` writes no file of that kind. The JSON is compact (one line):
    the table is what a reader reads. ``directory`` is ``benchmarks/results`` unless a script
    writes under a folder of it or its ``--output``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    if payload is not None:
        (directory / f"{name}.json").write_text(json.dumps(payload) + "\n")
    if table is not None:
        (directory / f"{name}.md").write_text(table + "\n")


class ChildWorker:
    """``target(connection, *args)`` in a spawned process of its own, answering through a pipe.

    The target sends ``"ready"`` once, then answers every message until it receives ``None``.
    vLLM binds its OpenMP threads and NUMA memory when it starts; in its own process that cannot
    slow the other engines of a benchmark run.
    """

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(target=target, args=(child, *args))
        self.process.start()
        assert self.connection.recv() == "ready"

    def __call__(self, message: Any) -> Any:
        self.connection.send(message)
        return self.connection.recv()

    def close(self) -> None:
        self.connection.send(None)
        self.process.join()


def parse_rule(text: str) -> tuple[str, RecomputeConfig]:
    """A named selection from ``name:key=value,...`` (e.g. ``sinks:chunk_start_tokens=4``)."""
    name, _, spec = text.partition(":")
    knobs: dict[str, Any] = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        knobs[key] = _rule_value(value)
    return name, RecomputeConfig(**knobs)


def _rule_value(text: str) -> Any:
    if "-" in text and all(part.isdigit() for part in text.split("-")):
        first, last = text.split("-")
        return (int(first), int(last))
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return None if text == "none" else text
