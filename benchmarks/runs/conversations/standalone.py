"""``conversations.py standalone``: the standalone question of a follow-up, method by method."""

from __future__ import annotations

import argparse
import json
import logging
import statistics
from typing import Any

from common import load_jsonl, machine, timed, write_results
from common import summary as latency_summary

from adarag import AdaRAG
from adarag.evaluation.machine import describe_machine
from adarag.evaluation.metrics import best_exact_match, best_f1
from adarag.pipeline import retrieval_query
from adarag.schema import GenerationParams
from runs.conversations import OUTPUT
from runs.conversations.dense_index import DenseIndex
from runs.conversations.followups import FollowUp, build_followups

METHODS = ("follow-up alone", "concatenate", "turns", "condense")
TOP_K = 4


def _replayed(row: dict[str, Any], index: DenseIndex) -> dict[str, Any]:
    """``row`` of an earlier run with every method's retrieval measured again (no model)."""
    history = [(row["first"], row["first_answer"])]
    queries = {
        "follow-up alone": row["follow_up"],
        "concatenate": retrieval_query(row["follow_up"], history),
        "turns": retrieval_query(row["follow_up"], history, with_answers=True),
        "condense": row["methods"]["condense"]["query"],
    }
    methods = {}
    for method, query in queries.items():
        titles = [chunk.metadata["title"] for chunk in index.search(query, 10)]
        recorded = row["methods"].get(method, {"standalone_s": 0.0})
        methods[method] = {
            **recorded,
            "query": query,
            "recall_at_4": row["gold_title"] in titles[:TOP_K],
            "recall_at_10": row["gold_title"] in titles,
        }
    return {**row, "methods": methods}


def _report(model: str, host: dict[str, Any], rows: list[dict[str, Any]], note: str) -> None:
    """Write the summary table and the JSON of ``rows``."""
    summary = {}
    for method in METHODS:
        per = [row["methods"][method] for row in rows]
        standalone_s = latency_summary([p["standalone_s"] for p in per])
        summary[method] = {
            "recall_at_4": statistics.fmean(float(p["recall_at_4"]) for p in per),
            "recall_at_10": statistics.fmean(float(p["recall_at_10"]) for p in per),
            "f1": statistics.fmean(p["f1"] for p in per) if "f1" in per[0] else None,
            "em": statistics.fmean(p["em"] for p in per) if "em" in per[0] else None,
            "standalone_s_mean": standalone_s["mean"],
            "standalone_s_p50": standalone_s["p50"],
        }
    lines = [
        f"# Standalone question for follow-ups: {model}",
        "",
        f"{len(rows)} two-turn conversations from 2WikiMultihopQA compositional questions "
        "(benchmarks/conversations.py); retrieval: MiniLM cosine over the 6,119-passage corpus; "
        f"answers from the top {TOP_K} with the first turn as history, greedy, 24 tokens. "
        + describe_machine(host)
        + note,
        "",
        "| method | gold passage in top 4 | in top 10 | answer F1 | EM "
        "| making the query, mean s | p50 s |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, s in summary.items():
        lines.append(
            f"| {method} | {s['recall_at_4']:.0%} | {s['recall_at_10']:.0%} | "
            f"{_figure(s['f1'], '.3f')} | {_figure(s['em'], '.2f')} | "
            f"{s['standalone_s_mean']:.2f} | {s['standalone_s_p50']:.2f} |"
        )
    lines += ["", "Condensed questions (first 6):", ""]
    lines += [
        f"- {row['follow_up']!r} after {row['first']!r} (answered {row['first_answer']!r}) -> "
        f"{row['methods']['condense']['query']!r}"
        for row in rows[:6]
    ]
    payload = {"model": model, "machine": host, "top_k": TOP_K, "summary": summary, "rows": rows}
    write_results(f"standalone_question_{model}", payload, "\n".join(lines), directory=OUTPUT)
    print("\n".join(lines))


def _figure(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def standalone_question(args: argparse.Namespace) -> None:
    """The ``standalone`` subcommand."""
    logging.basicConfig(level=logging.WARNING)

    index = DenseIndex(
        load_jsonl("2wikimqa_corpus.jsonl", args.data_dir), args.work_dir / "corpus.npy"
    )
    if args.replay is not None:
        earlier = json.loads(args.replay.read_text())
        rows = [_replayed(row, index) for row in earlier["rows"]]
        model, host = earlier["model"], earlier["machine"]
        note = (
            f" Replayed from the run of {host['date']}: its first answers and condensed "
            "questions reused, each method's retrieval measured again; methods without answer "
            "F1 were measured for retrieval only."
        )
        _report(model, host, rows, note)
        return
    followups = build_followups(load_jsonl("2wikimqa_dev.jsonl", args.data_dir), args.questions)
    rag = AdaRAG(
        engine={"model": args.model},
        augment={"enabled": False},
        cache={"store": {"directory": str(args.work_dir / "kv")}},
    )
    params = GenerationParams(max_new_tokens=24, stop=("\n",))
    pipelines = {
        method: rag.with_config(chat={"standalone_question": method}) for method in METHODS[1:]
    }
    rows = []
    for item in followups:
        row = _followup_row(rag, pipelines, index, item, params)
        rows.append(row)
        print(f"{len(rows)}/{len(followups)} {row['methods']['condense']['query']!r}", flush=True)
    _report(rag.engine.checkpoint.name, machine(), rows, "")


def _followup_row(
    rag: AdaRAG,
    pipelines: dict[str, AdaRAG],
    index: DenseIndex,
    item: FollowUp,
    params: GenerationParams,
) -> dict[str, Any]:
    """One conversation: the first answer, then each method's retrieval and answer."""
    first = rag.query(item.first, chunks=index.search(item.first, TOP_K), params=params)
    history = [(item.first, first.text)]
    row = {
        "first": item.first,
        "first_answer": first.text,
        "follow_up": item.follow_up,
        "gold_title": item.gold_title,
        "answers": list(item.answers),
        "methods": {},
    }
    for method in METHODS:
        if method == "follow-up alone":
            seconds, query = 0.0, item.follow_up
            pipeline = pipelines["concatenate"]
        else:
            pipeline = pipelines[method]
            seconds, query = timed(
                lambda p=pipeline, h=history, q=item.follow_up: p.standalone_question(q, h)
            )
        found = index.search(query, 10)
        titles = [chunk.metadata["title"] for chunk in found]
        if method == "follow-up alone":  # for its recall only
            row["methods"][method] = {
                "query": query,
                "standalone_s": seconds,
                "recall_at_4": item.gold_title in titles[:TOP_K],
                "recall_at_10": item.gold_title in titles,
            }
            continue
        answer = pipeline.query(
            item.follow_up, chunks=found[:TOP_K], params=params, history=history
        )
        row["methods"][method] = {
            "query": query,
            "standalone_s": seconds,
            "recall_at_4": item.gold_title in titles[:TOP_K],
            "recall_at_10": item.gold_title in titles,
            "answer": answer.text,
            "f1": best_f1(answer.text, item.answers),
            "em": best_exact_match(answer.text, item.answers),
        }
    return row
