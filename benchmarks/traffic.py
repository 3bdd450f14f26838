"""Cache reuse under traffic: hit rates over a stream of novel queries, and RAGBoost's prefix hits.

``sustained``: reuse under sustained traffic, hit rates and TTFT of novel queries over
Zipf-popular chunks. Each query is a new 2WikiMultihopQA question whose ``--chunks`` context
chunks are drawn, without repetition within the query, from ``--pool`` corpus passages with Zipf
popularity (the passage of rank r is drawn with probability proportional to r^-s). Every passage
is cut to its first ``--chunk-tokens`` tokens. The same query sequence runs through the real
pipeline (static top-k, one answer token) for each cache policy, each with an empty store of its
own, capped at ``--memory-chunks`` and ``--disk-chunks`` chunks' worth of bytes:

- ``lru``: every write-back kept (``admission="always"``), least recently used evicted first;
- ``lfu``: every write-back kept, least frequently used evicted first;
- ``frequency-lru``: frequency admission (one-offs on probation), LRU eviction;
- ``frequency-lfu``: frequency admission, LFU eviction (the ``StoreConfig`` defaults).

Reported: the share of chunk lookups served by each tier, the hit rate (any tier) and TTFT per
query, their rolling means over ``--window`` queries, and queries 1-50 against the last 50.
Static top-k makes the store's decisions independent of the model's outputs, so the hit rates do
not depend on timing. Writes ``results/sustained-traffic/sustained_traffic.{md,json,png}``.

``prefix-hits``: prefix-cache hits of RAGBoost's ordering and scheduling, replayed without a
model. The multi-user workload (``adarag.evaluation.sessions``) is replayed through the same
context index and scheduler the pipeline uses (``adarag.cache.context_index``), over a cache of
chunk prefixes with LRU eviction at a capacity in chunk entries (``--capacity``, 0: unbounded).
Three arms, as RAGBoost's component breakdown: the retriever's order (plain prefix caching), the
longest-cached-prefix order, and that order with the batch scheduled. A chunk is a hit when it
and every chunk before it in the prompt are cached, i.e. a hard-tier hit. Writes
``results/policies/prefix_hits.{md,json}``.

    python benchmarks/traffic.py sustained
    python benchmarks/traffic.py prefix-hits --users 50 --questions-per-user 4 --top-k 5 10
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from common import DEFAULT_DATA_DIR, RESULTS, load_jsonl, machine, run_subcommand, write_results

from adarag import AdaRAG, AdaRagConfig
from adarag.cache.context_index import ContextIndex, schedule_contexts
from adarag.cache.keys import digest
from adarag.evaluation.sessions import multi_user_workload
from adarag.kv import ChunkKV
from adarag.schema import GenerationParams

# the store's eviction and admission settings (cache.store) compared here; not the named
# policies of adarag.policies, which all run over one store setting
STORE_POLICIES = {
    "lru": {"eviction_policy": "lru", "admission": "always"},
    "lfu": {"eviction_policy": "lfu", "admission": "always"},
    "frequency-lru": {"eviction_policy": "lru", "admission": "frequency"},
    "frequency-lfu": {"eviction_policy": "lfu", "admission": "frequency"},
}
SUSTAINED = RESULTS / "sustained-traffic"
TIERS = ("hard", "soft", "independent", "miss")
ARMS = ("retriever order", "longest cached prefix", "+ scheduling")


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


def hit_rate(tiers: list[list[str]]) -> float:
    """Share of chunk lookups served by any tier."""
    flat = [tier for query in tiers for tier in query]
    return sum(tier != "miss" for tier in flat) / max(len(flat), 1)


def rolling(values: list[float], window: int) -> list[float]:
    """Mean of each value and the ``window - 1`` before it (fewer at the start)."""
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def summarize(name: str, simulated: dict, timed: dict | None, window: int) -> dict:
    """Per-tier shares and hit rates (all queries) and TTFT means (the timed queries)."""
    tiers = simulated["tiers"]
    flat = [tier for query in tiers for tier in query]
    half = len(tiers) // 2
    row = {
        "policy": name,
        "tier_share": {tier: flat.count(tier) / len(flat) for tier in TIERS},
        "disk_read_share": sum(simulated["disk_reads"]) / len(flat),
        "hit_rate": hit_rate(tiers),
        "hit_rate_first": hit_rate(tiers[:window]),
        "hit_rate_last": hit_rate(tiers[-window:]),
        **{key: simulated[key] for key in simulated if key not in ("tiers", "disk_reads")},
    }
    if timed is not None:
        ttft, recomputed = timed["ttft_s"], timed["recomputed"]
        row["ttft_first_half_s"] = statistics.fmean(v for i, v in ttft.items() if i < half)
        row["ttft_second_half_s"] = statistics.fmean(v for i, v in ttft.items() if i >= half)
        row["recomputed_first_half"] = statistics.fmean(
            v for i, v in recomputed.items() if i < half
        )
        row["recomputed_second_half"] = statistics.fmean(
            v for i, v in recomputed.items() if i >= half
        )
    for key in ("ttft_s", "recomputed"):
        row.pop(key, None)
    return row


def plot(
    simulated: dict[str, dict], timed: dict[str, dict], window: int, title: str, path: Path
) -> None:
    """Rolling hit rate and TTFT against the query index, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 if timed else 1
    figure, axes = plt.subplots(panels, 1, figsize=(8, 3.4 * panels), sharex=True, squeeze=False)
    top = axes[0][0]
    for name, result in simulated.items():
        hits = [hit_rate([query]) for query in result["tiers"]]
        top.plot(range(1, len(hits) + 1), rolling(hits, window), label=name)
    top.set_ylabel(f"hit rate (rolling mean of {window})")
    top.set_ylim(0, 1)
    top.legend()
    top.set_title(title, fontsize=9)
    for name, result in timed.items():
        bottom = axes[1][0]
        indices = sorted(result["ttft_s"])
        ttft_ms = [1000 * result["ttft_s"][i] for i in indices]
        smoothed = rolling(ttft_ms, 3)
        bottom.plot([i + 1 for i in indices], smoothed, marker="o", markersize=3, label=name)
        bottom.set_ylabel("TTFT ms (rolling mean of 3 timed queries)")
        bottom.legend()
    axes[-1][0].set_xlabel("query index")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


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
    window = args.window
    summaries = [summarize(name, simulated[name], timed.get(name), window) for name in simulated]
    distinct = len({i for query in queries for i in query})
    num_timed = len(range(0, args.queries, args.timed_every))
    timing = (
        "no TTFT (--no-model)"
        if args.no_model
        else f"TTFT of {num_timed} queries per policy (every {args.timed_every}th, the first "
        "included) run through the model, the policies one after another on each; the other "
        "queries are replayed on the same cache (lookup and write-back of stand-in KV of the "
        "same size), which leaves the store as a model run does (`--check-replay` checks that "
        "the model runs take the tiers of a replay of all queries)"
    )
    setup = (
        f"{args.queries} novel 2WikiMultihopQA questions, {args.chunks} chunks each drawn from "
        f"{len(chunks)} corpus passages with Zipf s={args.zipf} ({distinct} distinct chunks "
        f"used), chunks of at most {args.chunk_tokens} tokens; store capped at "
        f"{args.memory_chunks} chunks in memory and {args.disk_chunks} on disk "
        f"({chunk_bytes / 2**20:.2f} MiB per chunk, bfloat16); "
        f"{rag.engine.checkpoint.name}, static top-k, 1 answer token, {args.threads} threads. "
        f"Hit rates over all queries; {timing}"
    )
    half = args.queries // 2
    lines = [
        "# Reuse under sustained traffic",
        "",
        setup + ".",
        "",
        f"Machine: {machine()}",
        "",
        "Share of chunk lookups per cache tier, hit rate (any tier), share read from the disk "
        f"tier, hit rate of queries 1-{window} and {args.queries - window + 1}-{args.queries}, "
        f"mean TTFT and recomputed prompt tokens of the timed queries among queries 1-{half} and "
        f"{half + 1}-{args.queries}:",
        "",
        "| policy | hard | soft | independent | miss | hit rate | from disk | "
        f"hit rate 1-{window} | hit rate last {window} | TTFT 1st half ms | TTFT 2nd half ms | "
        "recomputed 1st half | recomputed 2nd half | memory evictions | disk evictions | "
        "disk writes | probation writes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summaries:
        share = row["tier_share"]
        ttft = [
            f"{1000 * row[key]:.0f}" if key in row else "-"
            for key in ("ttft_first_half_s", "ttft_second_half_s")
        ]
        ttft += [
            f"{row[key]:.0f}" if key in row else "-"
            for key in ("recomputed_first_half", "recomputed_second_half")
        ]
        lines.append(
            f"| {row['policy']} | "
            + " | ".join(f"{share[tier]:.3f}" for tier in TIERS)
            + f" | {row['hit_rate']:.3f} | {row['disk_read_share']:.3f} | "
            f"{row['hit_rate_first']:.3f} | {row['hit_rate_last']:.3f} | {' | '.join(ttft)} | "
            f"{row['memory_evictions']} | {row['disk_evictions']} | {row['disk_writes']} | "
            f"{row['num_probation_writes']} |"
        )
    title = f"{args.queries} novel queries, Zipf s={args.zipf}, cache of {args.memory_chunks}"
    title += f" + {args.disk_chunks} chunks ({rag.engine.checkpoint.name}, CPU)"
    plot(simulated, timed, window, title, SUSTAINED / "sustained_traffic.png")
    lines += ["", "![rolling hit rate and TTFT](sustained_traffic.png)"]
    payload = {
        "setup": setup,
        "machine": machine(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "queries": queries,
        "summaries": summaries,
        "replayed": simulated,
        "timed": timed,
    }
    write_results("sustained_traffic", payload, "\n".join(lines), directory=SUSTAINED)
    print("\n".join(lines))


class _PrefixCache:
    """Hard-tier entries (one per chunk prefix) with LRU eviction."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def put(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.entries[key] = None
            self.entries.move_to_end(key)
        while self.capacity and len(self.entries) > self.capacity:
            self.entries.popitem(last=False)


def _hard_keys(chunks: Sequence[str]) -> list[str]:
    keys, previous = [], "root"
    for chunk in chunks:
        previous = digest(previous, chunk)
        keys.append(previous)
    return keys


def replay_prefix_hits(contexts: list[list[str]], arm: str, capacity: int) -> float:
    """Share of chunks that are hard hits under ``arm``, in %."""
    cache, index = _PrefixCache(capacity), ContextIndex()
    order = list(range(len(contexts)))
    if arm == "+ scheduling":
        plan = schedule_contexts(contexts)
        order = list(plan.order)
        for request, chunk_order in enumerate(plan.chunk_orders):
            listed = [contexts[request][i] for i in chunk_order]
            index.insert(listed, _hard_keys(listed), planned=True)
    hits = total = 0
    for request in order:
        chunks = contexts[request]
        listed = chunks
        if arm != "retriever order":
            match = index.longest_prefix(chunks, cache.__contains__)
            listed = [chunks[i] for i in match.order]
        keys = _hard_keys(listed)
        run = next((i for i, key in enumerate(keys) if key not in cache), len(keys))
        hits, total = hits + run, total + len(keys)
        cache.put(keys)
        index.insert(listed, keys)
    return 100 * hits / max(total, 1)


def prefix_hits(args: argparse.Namespace) -> None:
    """The ``prefix-hits`` subcommand."""
    rows = []
    for top_k in args.top_k:
        questions, stream = multi_user_workload(
            args.data_dir, args.users, args.questions_per_user, top_k, args.seed
        )
        contexts = [list(questions[item.question_idx].chunks) for item in stream]
        for capacity in args.capacity:
            shares = {arm: replay_prefix_hits(contexts, arm, capacity) for arm in ARMS}
            rows.append({"top_k": top_k, "capacity": capacity, "requests": len(contexts), **shares})
    lines = [
        f"## Hard-tier chunk hits, multi-user workload ({args.users} users x "
        f"{args.questions_per_user} questions, Zipf s = 1.1, seed {args.seed}), replayed "
        "without a model",
        "",
        "| top-k | capacity (chunk prefixes) | requests | " + " | ".join(ARMS) + " |",
        "|---|---|---|" + "---|" * len(ARMS),
    ]
    for row in rows:
        capacity = row["capacity"] or "unbounded"
        shares = " | ".join(f"{row[arm]:.1f}%" for arm in ARMS)
        lines.append(f"| {row['top_k']} | {capacity} | {row['requests']} | {shares} |")
    lines += [
        "",
        "RAGBoost (MultihopRAG, k = 15, SGLang + Qwen3-32B on H100): 8.49% -> 20.56% (ordering) "
        "-> 33.97% (+ scheduling); vLLM + Llama3.3-70B: 10.7% -> 30.8% -> 43.2%.",
    ]
    write_results("prefix_hits", rows, "\n".join(lines), directory=args.output)
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    command = sub.add_parser(
        "sustained",
        help="hit rates and TTFT of novel queries over Zipf-popular chunks, per store policy",
    )
    command.add_argument("--queries", type=int, default=300)
    command.add_argument(
        "--timed-every", type=int, default=25, help="run every n-th query on the model (timed)"
    )
    command.add_argument("--no-model", action="store_true", help="hit rates only, no TTFT")
    command.add_argument(
        "--check-replay",
        action="store_true",
        help="also replay every query on fresh caches and check the model runs took its tiers",
    )
    command.add_argument("--pool", type=int, default=2000, help="corpus passages drawn from")
    command.add_argument("--chunks", type=int, default=4, help="chunks per query")
    command.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent s")
    command.add_argument("--chunk-tokens", type=int, default=48)
    command.add_argument("--memory-chunks", type=int, default=16)
    command.add_argument("--disk-chunks", type=int, default=48)
    command.add_argument("--window", type=int, default=50)
    command.add_argument("--threads", type=int, default=2)
    command.add_argument("--seed", type=int, default=0)
    command.add_argument(
        "--policies", nargs="+", default=list(STORE_POLICIES), choices=list(STORE_POLICIES)
    )
    command.add_argument("--data-dir", type=Path)
    command.set_defaults(fn=sustained_traffic)
    command = sub.add_parser(
        "prefix-hits", help="RAGBoost's prefix-cache hits, replayed without a model"
    )
    command.add_argument("--users", type=int, default=50)
    command.add_argument("--questions-per-user", type=int, default=4)
    command.add_argument("--top-k", type=int, nargs="+", default=[5, 10])
    command.add_argument("--capacity", type=int, nargs="+", default=[0, 200])
    command.add_argument("--seed", type=int, default=0)
    command.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    command.add_argument("--output", type=Path, default=RESULTS / "policies")
    command.set_defaults(fn=prefix_hits)
    run_subcommand(parser)


if __name__ == "__main__":
    main()
