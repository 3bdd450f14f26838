"""The report of ``traffic.py sustained``: tier shares, hit rates and TTFT per policy; a plot."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from common import RESULTS, machine, write_results

from adarag import AdaRAG

SUSTAINED = RESULTS / "sustained-traffic"
TIERS = ("hard", "soft", "independent", "miss")


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


def write_report(
    args: argparse.Namespace,
    rag: AdaRAG,
    chunks: list[str],
    queries: list[list[int]],
    chunk_bytes: int,
    simulated: dict[str, dict],
    timed: dict[str, dict],
    summaries: list[dict],
) -> None:
    """``results/sustained-traffic/sustained_traffic.{md,json,png}``."""
    window = args.window
    setup = _setup(args, rag, chunks, queries, chunk_bytes)
    lines = [
        "# Reuse under sustained traffic",
        "",
        setup + ".",
        "",
        f"Machine: {machine()}",
        "",
        *_table(args, summaries),
    ]
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


def _setup(
    args: argparse.Namespace,
    rag: AdaRAG,
    chunks: list[str],
    queries: list[list[int]],
    chunk_bytes: int,
) -> str:
    """The run's setup in words: the workload, the store's caps, the model, what was timed."""
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
    return setup


def _table(args: argparse.Namespace, summaries: list[dict]) -> list[str]:
    """The table of every policy's shares, hit rates, TTFT and store counts, with its legend."""
    window = args.window
    half = args.queries // 2
    lines = [
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
    return lines
