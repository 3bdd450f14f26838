"""``fidelity.py tiers``: deviation from full prefill of KV taken from each cache tier."""

from __future__ import annotations

import argparse
import statistics
from typing import TYPE_CHECKING

import torch
from common import RESULTS, load_jsonl, machine, write_results

from adarag.engine.prefill_request import PrefillRequest

if TYPE_CHECKING:
    from adarag import AdaRAG
    from adarag.config import CacheConfig

EXTRA_RATIOS = (0.0, 0.3, 0.5)  # besides the configured α and β


def kl_divergence(reference: torch.Tensor, other: torch.Tensor) -> float:
    """KL(reference || other) of two logit vectors, in nats."""
    log_p, log_q = torch.log_softmax(reference, -1), torch.log_softmax(other, -1)
    return float((log_p.exp() * (log_p - log_q)).sum())


def tiers(args: argparse.Namespace) -> None:
    """The ``tiers`` subcommand: each tier's deviation from full prefill, per ratio."""
    from adarag import AdaRAG

    rag = AdaRAG()
    config = rag.config.cache
    ratios = sorted(
        {*EXTRA_RATIOS, config.soft.recompute_ratio, config.independent.recompute_ratio}
    )
    rows = load_jsonl("musique_dev.jsonl", args.data_dir)
    results: dict[str, dict[float, list[tuple[float, float, float]]]] = {
        tier: {r: [] for r in ratios} for tier in ("hard", "soft", "independent")
    }
    for q_idx in range(args.questions):
        row = rows[q_idx]
        distractor = rows[(q_idx + 1) % len(rows)]["passages"][7]["text"]
        _measure_question(rag, row, distractor, ratios, results)
        print(f"{row['id']} done")
    _report(args, config, results)


def _measure_question(
    rag: AdaRAG,
    row: dict,
    distractor: str,
    ratios: list[float],
    results: dict[str, dict[float, list[tuple[float, float, float]]]],
) -> None:
    """Chunks 3-6's deviation from full prefill with their KV from each tier, into ``results``."""
    from adarag.engine.batch import SegmentSource

    engine, cache = rag.engine, rag.cache
    chunks = [p["text"] for p in row["passages"][:6]]
    layout = rag.prompts.layout(row["question"], chunks)
    cu = layout.cu_segments
    full = engine.prefill(PrefillRequest(layout))
    exact = [full.kv.segment(cu[i + 1], cu[i + 2]) for i in range(6)]
    system_kv = full.kv.segment(0, cu[1])
    keys = cache.keys(layout.chunk_ids)
    soft, independent = {}, {}
    for i in range(2, 6):
        earlier = rag.prompts.layout(
            row["question"], [chunks[0], distractor, chunks[i - 1], chunks[i]]
        )
        earlier_keys = cache.keys(earlier.chunk_ids)
        assert earlier_keys.soft[3] == keys.soft[i], "earlier prompt must share the soft key"
        assert earlier_keys.hard[3] != keys.hard[i]
        ecu = earlier.cu_segments
        soft[i] = engine.prefill(PrefillRequest(earlier)).kv.segment(ecu[4], ecu[5])
        independent[i] = engine.compute_chunk(layout.system_ids, layout.chunk_ids[i], system_kv)
    rows_slice = slice(cu[3], cu[7])
    variants = {
        "hard": dict(enumerate(exact)).get,
        "soft": soft.get,
        "independent": independent.get,
    }
    for tier, source_of in variants.items():
        for ratio in ratios if tier != "hard" else (0.0,):
            sources = [
                SegmentSource(system_kv),
                SegmentSource(exact[0]),
                SegmentSource(exact[1]),
            ]
            sources += [SegmentSource(source_of(i), ratio) for i in range(2, 6)]
            sources.append(SegmentSource())
            fused = engine.prefill(PrefillRequest(layout, sources))
            dk = (fused.kv.k[:, rows_slice] - full.kv.k[:, rows_slice]).norm()
            dv = (fused.kv.v[:, rows_slice] - full.kv.v[:, rows_slice]).norm()
            rel_k = float(dk / full.kv.k[:, rows_slice].norm())
            rel_v = float(dv / full.kv.v[:, rows_slice].norm())
            results[tier][ratio].append((rel_k, rel_v, kl_divergence(full.logits, fused.logits)))


def _report(
    args: argparse.Namespace,
    config: CacheConfig,
    results: dict[str, dict[float, list[tuple[float, float, float]]]],
) -> None:
    """``results/tiers/tier_deviation.{md,json}``: the mean deviations per tier and ratio."""
    lines = [
        f"Deviation from full prefill, chunks 3-6 of {args.questions} musique prompts "
        f"(6 passages each), real model; configured α = {config.soft.recompute_ratio}, "
        f"β = {config.independent.recompute_ratio}; selection policy "
        f"{config.recompute.selection_policy}.",
        f"Machine: {machine()['cpu']}, {machine()['cores']} cores.",
        "",
        "| tier | recompute ratio | rel. L2 of K | rel. L2 of V | KL of last-token logits |",
        "|---|---|---|---|---|",
    ]
    summary = {}
    for tier, by_ratio in results.items():
        for ratio, values in by_ratio.items():
            if not values:
                continue
            means = [statistics.fmean(v[i] for v in values) for i in range(3)]
            summary[f"{tier}@{ratio}"] = dict(zip(("rel_k", "rel_v", "kl"), means, strict=True))
            lines.append(f"| {tier} | {ratio} | {means[0]:.4f} | {means[1]:.4f} | {means[2]:.4f} |")
    table = "\n".join(lines)
    print(table)
    payload = {"machine": machine(), "summary": summary}
    write_results("tier_deviation", payload, table, directory=RESULTS / "tiers")
