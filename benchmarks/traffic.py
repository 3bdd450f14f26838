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
from pathlib import Path

from common import DEFAULT_DATA_DIR, RESULTS, run_subcommand
from runs.traffic.prefix_hits import prefix_hits
from runs.traffic.sustained import STORE_POLICIES, sustained_traffic


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
