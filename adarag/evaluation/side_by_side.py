"""Every registered policy side by side on one workload, against the ``full`` policy's answers.

For each workload every policy of :data:`adarag.policies.POLICIES` answers the same query stream
with a fresh cache that starts from the same ingest (each chunk's independent KV). Per policy
(:class:`PolicyRow`): TTFT (mean, p95), tokens recomputed per query, the share of prompt tokens
reused, hits per tier (share of the chunks), gold F1, and agreement with the ``full`` policy's
answer to the same query (exact, token F1, first-token KL). ``adarag bench --workload`` writes
``<workload>_<model>.{md,json,png}``.

Workloads: ``musique`` and ``2wikimqa-gold`` (single-shot QA, every question once, in a seeded
order), ``multi-turn`` (chains of 2Wiki questions about shared entities, turns interleaved across
conversations) and ``multi-user`` (users' 2Wiki questions over Zipf-popular shared passages), see
:mod:`adarag.evaluation.sessions`.
"""

from __future__ import annotations

import json
import statistics
import typing
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from adarag.evaluation.fidelity import first_token_kl
from adarag.evaluation.harness import BenchRunner, QueryRecord
from adarag.evaluation.machine import describe_machine
from adarag.evaluation.metrics import normalize_answer, token_f1
from adarag.evaluation.papers import paper_lines
from adarag.evaluation.plots import ttft_scatter
from adarag.evaluation.report import Latency
from adarag.evaluation.sessions import multi_turn_workload, multi_user_workload
from adarag.evaluation.workload import BenchQuestion, StreamItem, load_questions, query_stream
from adarag.schema import Tier

WORKLOADS = ("musique", "2wikimqa-gold", "multi-turn", "multi-user")
TIERS = typing.get_args(Tier)  # hard, soft, alternative, variant, fused, independent, miss


@dataclass(frozen=True)
class PolicyRow:
    """One policy over one workload (shares in %, agreement with ``full``)."""

    policy: str
    num_queries: int
    ttft_mean_s: float
    ttft_p95_s: float
    recomputed_tokens: float
    prompt_tokens: float
    reused_token_share: float
    tier_share: dict[str, float]
    gold_f1: float
    exact_agreement: float
    f1_agreement: float
    first_token_kl: float | None


def load_workload(
    name: str, data_dir: Path, num_queries: int, top_k: int, seed: int
) -> tuple[list[BenchQuestion], list[StreamItem]]:
    """The questions and query stream of workload ``name`` (about ``num_queries`` queries)."""
    if name == "multi-turn":
        return multi_turn_workload(data_dir, max(1, num_queries // 2), top_k, seed)
    if name == "multi-user":
        users = max(1, num_queries // 3)
        return multi_user_workload(data_dir, users, 3, top_k, seed)
    questions = load_questions(name, data_dir, num_queries, top_k)
    return questions, query_stream(len(questions), len(questions), 1.1, seed)


def policy_row(
    name: str, records: list[QueryRecord], full: list[QueryRecord], runner: BenchRunner
) -> PolicyRow:
    """Policy ``name``'s row from its records, against ``full``'s (first-token logits kept)."""
    reference = {record.position: record for record in full}
    tiers: Counter[str] = Counter()
    for record in records:
        tiers.update(record.tier_hits)
    num_chunks = max(sum(tiers.values()), 1)
    ttft = Latency.of([r.ttft_s for r in records])
    assert ttft is not None, f"{name} answered no query"
    logits, full_logits = runner.logits[name], runner.logits["full"]
    kls = [
        first_token_kl(full_logits[r.position], logits[r.position])
        for r in records
        if r.position in logits and r.position in full_logits
    ]
    prompt_tokens = sum(r.num_prompt_tokens for r in records)
    recomputed_tokens = sum(r.num_recomputed_tokens for r in records)
    return PolicyRow(
        policy=name,
        num_queries=len(records),
        ttft_mean_s=ttft.mean,
        ttft_p95_s=ttft.p95,
        recomputed_tokens=statistics.fmean(r.num_recomputed_tokens for r in records),
        prompt_tokens=statistics.fmean(r.num_prompt_tokens for r in records),
        reused_token_share=100 * (1 - recomputed_tokens / max(prompt_tokens, 1)),
        tier_share={tier: 100 * tiers[tier] / num_chunks for tier in TIERS},
        gold_f1=100 * statistics.fmean(r.f1 for r in records),
        exact_agreement=100
        * statistics.fmean(
            float(normalize_answer(r.answer) == normalize_answer(reference[r.position].answer))
            for r in records
        ),
        f1_agreement=100
        * statistics.fmean(token_f1(r.answer, reference[r.position].answer) for r in records),
        first_token_kl=statistics.fmean(kls) if kls else None,
    )


def write_workload_report(
    stem: Path,
    title: str,
    rows: list[PolicyRow],
    records: dict[str, list[QueryRecord]],
    measured_on: dict[str, Any],
) -> None:
    """``<stem>.json`` (rows and every record), ``<stem>.md`` and ``<stem>.png``.

    ``stem`` is ``<output>/<workload>_<model>``.
    """
    payload = {
        "title": title,
        "machine": measured_on,
        "rows": [asdict(row) for row in rows],
        "records": {name: [asdict(r) for r in recs] for name, recs in records.items()},
    }
    stem.parent.mkdir(parents=True, exist_ok=True)
    (stem.parent / f"{stem.name}.json").write_text(json.dumps(payload, indent=1) + "\n")
    _write_tables(stem, title, rows, measured_on)


def rewrite_workload_report(path: Path) -> None:
    """The ``.md`` and ``.png`` of an earlier run again, from its ``.json`` at ``path``."""
    payload = json.loads(path.read_text())
    rows = [PolicyRow(**row) for row in payload["rows"]]
    _write_tables(path.with_suffix(""), payload["title"], rows, payload["machine"])


def _write_tables(
    stem: Path, title: str, rows: list[PolicyRow], measured_on: dict[str, Any]
) -> None:
    workload = stem.name.split("_", 1)[0]
    lines = [f"## {title}", "", describe_machine(measured_on), "", *_table(rows)]
    lines += paper_lines(workload, {row.policy: row for row in rows})
    lines += [
        "",
        "Agreement compares each query's answer with the `full` policy's answer to the same "
        "query; reused tokens are the prompt tokens not recomputed (system prefix included). "
        "The papers' settings differ from these (models of 4-70B parameters on GPUs, prompts "
        "of 8-27K tokens); benchmarks/results/policies/README.md discusses the differences.",
    ]
    (stem.parent / f"{stem.name}.md").write_text("\n".join(lines) + "\n")
    _plot(rows, title, stem.parent / f"{stem.name}.png")


def _table(rows: list[PolicyRow]) -> list[str]:
    lines = [
        "| policy | TTFT mean s | TTFT p95 s | recomputed tok/query | prompt tok | reused tok % "
        "| hard % | soft % | altern. % | variant % | fused % | indep. % | miss % | gold F1 "
        "| exact agr. % | F1 agr. % | 1st-token KL |",
        "|---|" + "---|" * 16,
    ]
    for row in rows:
        kl = "-" if row.first_token_kl is None else f"{row.first_token_kl:.3f}"
        shares = " | ".join(f"{row.tier_share[tier]:.0f}" for tier in TIERS)
        lines.append(
            f"| {row.policy} | {row.ttft_mean_s:.3f} | {row.ttft_p95_s:.3f} "
            f"| {row.recomputed_tokens:.0f} | {row.prompt_tokens:.0f} "
            f"| {row.reused_token_share:.1f} | {shares} | {row.gold_f1:.1f} "
            f"| {row.exact_agreement:.0f} | {row.f1_agreement:.1f} | {kl} |"
        )
    return lines


def _plot(rows: list[PolicyRow], title: str, path: Path) -> None:
    points = [(row.policy, row.ttft_mean_s) for row in rows]
    panels: list[tuple[str, typing.Sequence[float | None]]] = [
        ("gold F1", [row.gold_f1 for row in rows]),
        ("F1 agreement with full (%)", [row.f1_agreement for row in rows]),
        ("recomputed tokens per query", [row.recomputed_tokens for row in rows]),
    ]
    ttft_scatter(points, panels, title, path)
