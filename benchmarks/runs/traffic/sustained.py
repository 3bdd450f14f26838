"""``traffic.py sustained``: hit rates and TTFT of novel queries over Zipf-popular chunks."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from common import load_jsonl

from adarag import AdaRAG, AdaRagConfig
from adarag.kv import ChunkKV
from adarag.schema import GenerationParams
from runs.traffic.sustained_report import hit_rate, summarize, write_report

# the store's eviction and admission settings (cache.store) compared here; not the named
# policies of adarag.policies, which all run over one store setting
STORE_POLICIES = {
    "lru": {"eviction_policy": "lru", "admission": "always"},
    "lfu": {"eviction_policy": "lfu", "admission": "always"},
    "frequency-lru": {"eviction_policy": "lru", "admission": "frequency"},
    "frequency-lfu": {"eviction_policy": "lfu", "admission": "frequency"},
}


def zipf_queries(
    num_queries: int, pool: int, chunks_per_query: int, exponent: float, seed: int
) -> list[list[int]]:
    """Per query, ``chunks_per_query`` distinct pool indices drawn with Zipf popularity."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, pool + 1) ** exponent
    weights /= weights.sum()
    rank_to_passage = rng.permutation(pool)  # popularity unrelated to corpus order
    return [
        [int(rank_to_passage[r]) for r in rng.choice(pool, chunks_per_query, False, weights)]
        for _ in range(num_queries)
    ]


def cut_chunks(rag: AdaRAG, passages: list[dict], num_tokens: int) -> list[str]:
    """Each passage (title and text) cut to its first ``num_tokens`` tokens."""
    tokenizer = rag.tokenizer
    chunks = []
    for passage in passages:
        ids = tokenizer.encode(f"{passage['title']}\n{passage['text']}")[:num_tokens]
        chunks.append(tokenizer.decode(ids))
    return chunks


def replay(pipeline: AdaRAG, question: str, chunk_texts: list[str]) -> list[str]:
    """One query through the pipeline's cache only: lookup, then write-back of stand-in KV.

    The store decides from keys and byte sizes alone, and both equal a real query's, so the
    tiers and the store's state afterwards are those of a real run (the KV values are zeros).
    """
    cache = pipeline.cache
    chunk_ids = pipeline.layout(question, chunk_texts).chunk_ids
    if cache.system_kv() is None:  # a real query reads (or first computes) the system KV too
        cache.put_system(_zeros(pipeline, cache.num_system_tokens))
    hits = cache.lookup(chunk_ids)
    cache.write_back(chunk_ids, hits, [_zeros(pipeline, len(ids)) for ids in chunk_ids])
    return [hit.tier for hit in hits]


def _zeros(pipeline: AdaRAG, num_tokens: int) -> ChunkKV:
    spec = pipeline.engine.spec
    shape = (spec.num_layers, num_tokens, spec.num_kv_heads, spec.head_dim)
    return ChunkKV(torch.zeros(shape), torch.zeros(shape), 0)


def run_policies(
    rag: AdaRAG,
    stores: dict[str, dict],
    questions: list[str],
    queries: list[list[int]],
    chunks: list[str],
    timed_every: int | None,
) -> dict[str, dict]:
    """Every query through one pipeline per store setting: tiers per query, TTFT of some.

    Every ``timed_every``-th query (the first included) runs through the real pipeline (model
    included) and its TTFT is kept; the others are replayed on the cache alone. None replays
    every query. The policies take each query in turn, so their timed runs of a query are
    seconds apart and meet the same machine load.
    """
    pipelines = {name: rag.with_config(cache={"store": store}) for name, store in stores.items()}
    params = GenerationParams(max_new_tokens=1)
    results: dict[str, dict] = {
        name: {"tiers": [], "disk_reads": [], "ttft_s": {}, "recomputed": {}} for name in stores
    }
    for idx, (question, chunk_ids) in enumerate(zip(questions, queries, strict=True)):
        texts = [chunks[i] for i in chunk_ids]
        for name, pipeline in pipelines.items():
            result = results[name]
            reads_before = pipeline.cache_stats().store.disk_reads if idx else 0
            if timed_every is not None and idx % timed_every == 0:
                answer = pipeline.query(question, chunks=texts, params=params)
                result["tiers"].append(list(answer.trace.steps[0].tiers))
                result["ttft_s"][idx] = answer.trace.ttft_s
                result["recomputed"][idx] = answer.trace.num_recomputed_tokens
            else:
                result["tiers"].append(replay(pipeline, question, texts))
            result["disk_reads"].append(pipeline.cache_stats().store.disk_reads - reads_before)
    for name, pipeline in pipelines.items():
        stats = pipeline.cache_stats()
        results[name].update(
            memory_evictions=stats.store.memory_evictions,
            disk_evictions=stats.store.disk_evictions,
            disk_writes=stats.store.disk_writes,
            num_probation_writes=stats.tiers.num_probation_writes,
        )
    return results


def sustained_traffic(args: argparse.Namespace) -> None:
    """The ``sustained`` subcommand."""

    config = AdaRagConfig.build(engine={"num_threads": args.threads}, augment={"enabled": False})
    rag = AdaRAG(config)
    passages = load_jsonl("2wikimqa_corpus.jsonl", args.data_dir)[: args.pool]
    questions = [row["question"] for row in load_jsonl("2wikimqa_dev.jsonl", args.data_dir)]
    assert len(questions) >= args.queries, f"only {len(questions)} questions"
    questions = questions[: args.queries]
    chunks = cut_chunks(rag, passages, args.chunk_tokens)
    queries = zipf_queries(args.queries, len(chunks), args.chunks, args.zipf, args.seed)
    spec = rag.engine.spec
    dtype_bytes = 2  # the default bfloat16 storage
    token_bytes = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * dtype_bytes
    chunk_bytes = token_bytes * args.chunk_tokens
    simulated, timed = _run_every_policy(args, rag, questions, queries, chunks, chunk_bytes)
    window = args.window
    summaries = [summarize(name, simulated[name], timed.get(name), window) for name in simulated]
    write_report(args, rag, chunks, queries, chunk_bytes, simulated, timed, summaries)


def _run_every_policy(
    args: argparse.Namespace,
    rag: AdaRAG,
    questions: list[str],
    queries: list[list[int]],
    chunks: list[str],
    chunk_bytes: int,
) -> tuple[dict[str, dict], dict[str, dict]]:
    """Every query through each store policy, each with an empty store of its own.

    Returns every query's tiers per policy and the timed runs' (empty with ``--no-model``).
    """
    with tempfile.TemporaryDirectory() as directory:

        def stores(kind: str) -> dict[str, dict]:
            return {
                name: {
                    **STORE_POLICIES[name],
                    "memory_capacity_bytes": args.memory_chunks * chunk_bytes,
                    "disk_capacity_bytes": args.disk_chunks * chunk_bytes,
                    "directory": str(Path(directory) / f"{name}-{kind}"),
                }
                for name in args.policies
            }

        every = None if args.no_model else args.timed_every
        simulated = run_policies(rag, stores("run"), questions, queries, chunks, every)
        timed = {} if args.no_model else simulated
        if args.check_replay and not args.no_model:  # model runs take the tiers a replay gives
            replayed = run_policies(rag, stores("replay"), questions, queries, chunks, None)
            for name in args.policies:
                assert replayed[name]["tiers"] == simulated[name]["tiers"], name
        for name, result in simulated.items():
            print(f"{name}: hit rate {hit_rate(result['tiers']):.3f}")
    return simulated, timed
