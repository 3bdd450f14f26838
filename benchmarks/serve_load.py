"""Load on one ``adarag serve``: throughput and TTFT for 1, 4 and 16 concurrent streaming clients.

Builds a knowledge base of the bundled demo corpus's first ``--passages`` passages (``adarag
ingest``, which precomputes each chunk's KV), starts ``adarag serve`` as a process of its own on
a free loopback port, asks every question once (warm-up: afterwards every prompt's chunks are
hard-tier hits, as for a repeated question), then, for each client count, sends ``--requests``
streamed chat completions (the demo questions in turn, ``--max-tokens`` greedy tokens) split
evenly over that many clients, each client sending its next request when the last one ended.
TTFT is measured by the client: from sending the request to the first text delta. Finally a
second server with one active slot and a 2-request queue gets ``--burst`` requests at once:
the requests past the queue are refused with 429 at once, the others answered.

    python benchmarks/serve_load.py --output serve_load
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from importlib import resources
from pathlib import Path

import openai
from common import RESULTS, load_summary, machine, write_results
from runs.serve_load.server import Server, ingest

from adarag import AdaRagConfig
from adarag.evaluation.machine import describe_machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="default")
    parser.add_argument("--passages", type=int, default=40)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-active", type=int, default=4)
    parser.add_argument("--burst", type=int, default=16)
    parser.add_argument("--output", default="serve_load")
    parser.add_argument(
        "--batch-decode",
        action="store_true",
        help="also run every client count against a server started with --batch-decode",
    )
    args = parser.parse_args()
    info = machine()

    with tempfile.TemporaryDirectory(prefix="adarag-serve-load-") as tmp:
        config_path, questions = _prepare(Path(tmp), args)
        levels, startup_s = [], None
        modes = {"one at a time": []} | (
            {"batched": ["--batch-decode"]} if args.batch_decode else {}
        )
        for mode, extra in modes.items():
            with Server(config_path, ["--max-active", str(args.max_active), *extra]) as server:
                startup_s = startup_s or server.startup_s
                asyncio.run(_load(server.base_url, questions, 1, len(questions), args.max_tokens))
                for clients in args.clients:
                    level = asyncio.run(
                        _load(server.base_url, questions, clients, args.requests, args.max_tokens)
                    )
                    level["summary"]["decode"] = mode
                    levels.append(level)
                    print(json.dumps(levels[-1]["summary"]))
                shutdown_s = server.stop()
        with Server(config_path, ["--max-active", "1", "--max-queued", "2"]) as small:
            burst = asyncio.run(_burst(small.base_url, questions, args.burst, args.max_tokens))
            print(json.dumps(burst))

    payload = {
        "machine": info,
        "settings": vars(args),
        "server_startup_s": startup_s,
        "shutdown_s": shutdown_s,
        "levels": levels,
        "queue_full": burst,
    }
    write_results(args.output, payload, _table(payload), directory=RESULTS / "serving")


def _prepare(root: Path, args: argparse.Namespace) -> tuple[Path, list[str]]:
    """A knowledge base of the first passages (ingested, KV warmed) and the questions."""
    data = resources.files("adarag.data")
    lines = data.joinpath("demo_corpus.jsonl").read_text().splitlines()[: args.passages]
    corpus = root / "passages.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    rows = data.joinpath("demo_questions.jsonl").read_text().splitlines()[: args.questions]
    questions = [json.loads(row)["question"] for row in rows]
    config = AdaRagConfig.build(
        engine={"model": args.model},
        retrieval={"chroma_directory": str(root / "chroma"), "collection": "load", "top_k": 3},
        cache={"store": {"directory": str(root / "kv")}},
    )
    return ingest(root, config, corpus), questions


async def _stream(client: openai.AsyncOpenAI, question: str, max_tokens: int) -> dict:
    """One streamed chat completion: TTFT, latency and completion tokens."""
    started = time.perf_counter()
    ttft_s = None
    stream = await client.chat.completions.create(
        model="adarag",
        messages=[{"role": "user", "content": question}],
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    tokens = 0
    async for chunk in stream:
        if ttft_s is None and chunk.choices and chunk.choices[0].delta.content:
            ttft_s = time.perf_counter() - started
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    latency_s = time.perf_counter() - started
    return {
        "ttft_s": ttft_s if ttft_s is not None else latency_s,
        "latency_s": latency_s,
        "tokens": tokens,
    }


async def _load(
    base_url: str, questions: list[str], clients: int, requests: int, max_tokens: int
) -> dict:
    """``requests`` streamed requests over ``clients`` clients, each one request at a time."""
    per_client = max(1, requests // clients)

    async def one_client(idx: int, client: openai.AsyncOpenAI) -> list[dict]:
        results = []
        for turn in range(per_client):
            question = questions[(idx * per_client + turn) % len(questions)]
            results.append(await _stream(client, question, max_tokens))
        return results

    async with openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0) as client:
        started = time.perf_counter()
        per_client_results = await asyncio.gather(*(one_client(i, client) for i in range(clients)))
        wall_s = time.perf_counter() - started
    results = [result for group in per_client_results for result in group]
    tokens = sum(r["tokens"] for r in results)
    return {
        "clients": clients,
        "requests": results,
        "summary": load_summary(results, clients, wall_s, tokens),
    }


async def _burst(base_url: str, questions: list[str], burst: int, max_tokens: int) -> dict:
    """``burst`` requests at once against one active slot and a 2-request queue."""

    async def one(client: openai.AsyncOpenAI, question: str) -> tuple[str, float]:
        started = time.perf_counter()
        try:
            await _stream(client, question, max_tokens)
            return "answered", time.perf_counter() - started
        except openai.RateLimitError:
            return "429", time.perf_counter() - started

    async with openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0) as client:
        outcomes = await asyncio.gather(
            *(one(client, questions[i % len(questions)]) for i in range(burst))
        )
    refused = [s for kind, s in outcomes if kind == "429"]
    answered = [s for kind, s in outcomes if kind == "answered"]
    return {
        "burst": burst,
        "max_active": 1,
        "max_queued": 2,
        "num_429": len(refused),
        "num_answered": len(answered),
        "max_429_s": max(refused, default=None),
        "max_answered_s": max(answered, default=None),
    }


def _table(payload: dict) -> str:
    settings = payload["settings"]
    lines = [
        "# adarag serve under load",
        "",
        describe_machine(payload["machine"]),
        "",
        f"One `adarag serve` process ({settings['model']} model, `--max-active "
        f"{settings['max_active']}`), a knowledge base of {settings['passages']} demo passages "
        f"(KV precomputed by `adarag ingest`), top-3 retrieval; {settings['questions']} demo "
        f"questions asked once before (warm-up), then {settings['requests']} streamed chat "
        f"completions of at most {settings['max_tokens']} greedy tokens per client count. "
        f"Server start (model load) {payload['server_startup_s']:.1f} s; SIGTERM to exit "
        f"(cache flushed) {payload['shutdown_s']:.2f} s.",
        "",
        "| decoding | clients | requests | requests/s | tokens/s | TTFT p50 | TTFT p95 | "
        "latency p50 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for level in payload["levels"]:
        s = level["summary"]
        lines.append(
            f"| {s.get('decode', 'one at a time')} | {s['clients']} | {s['num_requests']} | "
            f"{s['requests_per_s']:.2f} | "
            f"{s['tokens_per_s']:.1f} | {s['ttft_p50_s']:.3f} s | {s['ttft_p95_s']:.3f} s | "
            f"{s['latency_p50_s']:.3f} s |"
        )
    burst = payload["queue_full"]
    lines += [
        "",
        f"Queue full: {burst['burst']} streamed requests at once against `--max-active 1 "
        f"--max-queued 2`: {burst['num_answered']} answered, {burst['num_429']} refused with "
        f"429 (the slowest refusal after {burst['max_429_s'] or 0:.3f} s; the last answer after "
        f"{burst['max_answered_s'] or 0:.2f} s).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
