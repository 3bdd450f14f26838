"""Aggregating benchmark records into per-policy summaries, a markdown table and ratios."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from adarag.evaluation.harness import QueryRecord
from adarag.evaluation.metrics import exact_match, token_f1


@dataclass(frozen=True)
class Latency:
    """Mean, median and 95th percentile of TTFT in seconds."""

    mean: float
    p50: float
    p95: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Latency | None:
        """Latency of a non-empty list, else None."""
        if not values:
            return None
        ordered = sorted(values)
        p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
        return cls(statistics.fmean(values), statistics.median(values), p95)


@dataclass(frozen=True)
class PolicySummary:
    """One policy over one stream."""

    policy: str
    num_queries: int
    ttft: Latency
    ttft_cold: Latency | None
    ttft_warm: Latency | None
    f1: float
    exact_match: float
    agreement_f1: float | None
    recomputed_ratio: float
    mean_processed_tokens: float
    mean_prompt_tokens: float
    mean_chunks_used: float
    tier_hits: dict[str, int]
    peak_store_bytes: int
    confidence_share: float
    static_agreement: float | None = None
    stopped_wrong: float | None = None


def summarize(
    records: Sequence[QueryRecord], static_twins: Mapping[str, str] | None = None
) -> list[PolicySummary]:
    """Per-policy summaries; agreement is token F1 with the ``full`` policy's answer.

    With ``static_twins`` (augmenting policy -> the policy answering from the same top-k),
    an augmenting policy also gets its exact agreement with its twin's answers and its
    *stopped-wrong* rate: the share of its early stops (fewer chunks than top-k) whose answer
    differs from the twin's.
    """
    reference = {r.qid: r.answer for r in records if r.policy == "full"}
    summaries = []
    for policy in dict.fromkeys(r.policy for r in records):
        rows = [r for r in records if r.policy == policy]
        twin = (static_twins or {}).get(policy)
        static_agreement, stopped_wrong = _against_static(rows, records, twin)
        hits: Counter[str] = Counter()
        for row in rows:
            hits.update(row.tier_hits)
        agreement = [token_f1(r.answer, reference[r.qid]) for r in rows if r.qid in reference]
        summaries.append(
            PolicySummary(
                policy=policy,
                num_queries=len(rows),
                ttft=Latency.of([r.ttft_s for r in rows]),  # type: ignore[arg-type]
                ttft_cold=Latency.of([r.ttft_s for r in rows if not r.is_repeat]),
                ttft_warm=Latency.of([r.ttft_s for r in rows if r.is_repeat]),
                f1=100 * statistics.fmean(r.f1 for r in rows),
                exact_match=100 * statistics.fmean(r.exact_match for r in rows),
                agreement_f1=100 * statistics.fmean(agreement) if agreement else None,
                recomputed_ratio=sum(r.num_recomputed_tokens for r in rows)
                / max(sum(r.num_prompt_tokens for r in rows), 1),
                mean_processed_tokens=statistics.fmean(r.num_processed_tokens for r in rows),
                mean_prompt_tokens=statistics.fmean(r.num_prompt_tokens for r in rows),
                mean_chunks_used=statistics.fmean(r.num_chunks_used for r in rows),
                tier_hits=dict(hits),
                peak_store_bytes=max(r.store_memory_bytes for r in rows),
                confidence_share=sum(r.confidence_s for r in rows)
                / max(sum(r.prefill_s for r in rows), 1e-9),
                static_agreement=static_agreement,
                stopped_wrong=stopped_wrong,
            )
        )
    return summaries


def _against_static(
    rows: Sequence[QueryRecord], records: Sequence[QueryRecord], twin: str | None
) -> tuple[float | None, float | None]:
    """(% exact agreement with the twin's answers, % of early stops that differ), or Nones."""
    answers = {r.qid: r.answer for r in records if r.policy == twin}
    paired = [r for r in rows if r.qid in answers]
    if not paired:
        return None, None
    agree = [exact_match(r.answer, answers[r.qid]) for r in paired]
    early = [a for r, a in zip(paired, agree, strict=True) if r.num_chunks_used < r.top_k]
    wrong = 100 * (1 - statistics.fmean(early)) if early else None
    return 100 * statistics.fmean(agree), wrong


def by_question_type(
    records: Sequence[QueryRecord], policy: str, static_twin: str
) -> list[tuple[str, int, float, float, float, float]]:
    """Per question type of ``policy``, against its static twin.

    Rows: (type, queries, share using >= 2 chunks %, mean chunks, F1, the twin's F1).
    """
    rows = [r for r in records if r.policy == policy and r.qtype]
    twin_f1 = {r.qid: r.f1 for r in records if r.policy == static_twin}
    table = []
    for qtype in sorted({r.qtype for r in rows if r.qtype}):
        group = [r for r in rows if r.qtype == qtype]
        table.append(
            (
                qtype,
                len(group),
                100 * statistics.fmean(float(r.num_chunks_used >= 2) for r in group),
                statistics.fmean(r.num_chunks_used for r in group),
                100 * statistics.fmean(r.f1 for r in group),
                100 * statistics.fmean(twin_f1.get(r.qid, 0.0) for r in group),
            )
        )
    return table


def markdown_table(summaries: Sequence[PolicySummary]) -> str:
    """The per-policy table."""
    lines = [
        "| policy | TTFT mean (s) | p50 | p95 | cold mean | warm mean | F1 | EM | agreement F1 "
        "| recomputed | tokens processed | chunks used | tier hits (hard/soft/indep/miss) "
        "| peak cache (MB) | agrees with static top-k % | stopped wrong % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        hits = "/".join(str(s.tier_hits.get(t, 0)) for t in ("hard", "soft", "independent", "miss"))
        for tier in ("alternative", "variant", "fused"):  # tiers of FusionRAG and Cache-Craft
            if s.tier_hits.get(tier):
                hits += f" +{tier} {s.tier_hits[tier]}"
        agreement = "-" if s.agreement_f1 is None else f"{s.agreement_f1:.1f}"
        cold = "-" if s.ttft_cold is None else f"{s.ttft_cold.mean:.2f}"
        warm = "-" if s.ttft_warm is None else f"{s.ttft_warm.mean:.2f}"
        lines.append(
            f"| {s.policy} | {s.ttft.mean:.2f} | {s.ttft.p50:.2f} | {s.ttft.p95:.2f} | {cold} "
            f"| {warm} | {s.f1:.1f} | {s.exact_match:.1f} | {agreement} "
            f"| {s.recomputed_ratio:.1%} | {s.mean_processed_tokens:.0f} "
            f"| {s.mean_chunks_used:.2f} | {hits} | {s.peak_store_bytes / 2**20:.0f} "
            f"| {_percent(s.static_agreement)} | {_percent(s.stopped_wrong)} |"
        )
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def speedups(summaries: Sequence[PolicySummary], of: str = "adacache") -> dict[str, float]:
    """Mean-TTFT ratio of every other policy to ``of`` (above 1: ``of`` is faster)."""
    by_name = {s.policy: s for s in summaries}
    if of not in by_name:
        return {}
    return {name: s.ttft.mean / by_name[of].ttft.mean for name, s in by_name.items() if name != of}
