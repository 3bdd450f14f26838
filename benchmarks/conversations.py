"""Conversations: two- and three-turn chats built from 2WikiMultihopQA, and what follow-ups cost.

The conversations: "Where was the director of film Blood Street born?" becomes the first question
"Who is the director of film Blood Street?" and the follow-up "Where was this person born?",
whose gold passage is the person's (the gold title that is not the film's) and whose answer is
the original question's. Questions about "X's father" (mother, husband, ...) are split the same
way.

``turn-reuse``: tokens computed and TTFT per turn of a 3-turn conversation, earlier turns reused
or not. Each conversation asks the first question, the follow-up and the original question, over
the same passages (the two gold passages and two others, warmed as ingest warms them).
``prompt.enable_turn_reuse`` on: each earlier turn is a cached segment, so a turn computes the
turn it adds and its question; off: the earlier turns sit in the query suffix and are recomputed
every turn. Each mode has a KV store of its own.

``standalone``: the standalone question for a follow-up, concatenating the questions vs
condensing with the model. The model answers the first question from the top-k passages of the
6,119-passage corpus (MiniLM cosine search), then the follow-up ("Where was this person born?")
is retrieved for with each ``chat.standalone_question`` method ("concatenate": the questions;
"turns": the questions and the first answer; "condense": the model's rewrite) and answered with
the first turn as history. Reported per method: recall of the follow-up's gold passage in the
top 4 and top 10, answer F1 / EM against the original question's answers, and the seconds spent
making the retrieval text (the condensing call). "The follow-up alone" is retrieval without the
conversation, for reference (recall only).

    python benchmarks/conversations.py turn-reuse --model default --conversations 5
    python benchmarks/conversations.py standalone --model default --questions 20
    python benchmarks/conversations.py standalone \
        --replay benchmarks/results/conversations/standalone_question_<model>.json
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from common import RESULTS, load_jsonl, machine, run_subcommand, timed, write_results
from common import summary as latency_summary

from adarag import AdaRAG, Chunk
from adarag.evaluation.machine import describe_machine
from adarag.evaluation.metrics import best_exact_match, best_f1
from adarag.pipeline import retrieval_query
from adarag.retrievers.chunking import passage_text
from adarag.retrievers.embedding import SentenceEmbedder
from adarag.schema import GenerationParams

_ROLE = re.compile(
    r"the (director|performer|composer) of (film|song) (.+?)"
    r"(?= born| die| work| study| detained|\?)",
    re.IGNORECASE,
)
_RELATIVE = re.compile(r"([A-Z][^?]*?)'s (father|mother|husband|wife|son|daughter|child)\b")
_REFERENCE = "this person"
OUTPUT = RESULTS / "conversations"
MODES = {"turns recomputed (before)": False, "turns reused (after)": True}
METHODS = ("follow-up alone", "concatenate", "turns", "condense")
TOP_K = 4


@dataclass(frozen=True)
class FollowUp:
    """A first question, a follow-up referring to its answer, and the follow-up's gold."""

    first: str
    follow_up: str
    original: str
    gold_title: str
    gold_titles: tuple[str, ...]
    answers: tuple[str, ...]


def _plain(title: str) -> str:
    return re.sub(r"\s*\(.*?\)\s*", " ", title).strip().lower()


def build_followups(rows: list[dict], limit: int) -> list[FollowUp]:
    """Up to ``limit`` follow-ups from compositional questions with two gold titles."""
    found = []
    for row in rows:
        titles = row.get("gold_titles") or []
        if row.get("type") != "compositional" or len(titles) != 2:
            continue
        question = row["question"]
        role = _ROLE.search(question)
        relative = _RELATIVE.search(question)
        if role is not None:
            subject = role.group(3)
            first = f"Who is the {role.group(1).lower()} of {role.group(2).lower()} {subject}?"
            follow_up = question[: role.start()] + _REFERENCE + question[role.end() :]
        elif relative is not None:
            subject = relative.group(1)
            first = f"Who is {subject}'s {relative.group(2)}?"
            follow_up = question[: relative.start()] + _REFERENCE + question[relative.end() :]
        else:
            continue
        others = [t for t in titles if _plain(t) != _plain(subject)]
        if len(others) != 1:
            continue
        found.append(
            FollowUp(
                first,
                follow_up[0].upper() + follow_up[1:],
                question,
                others[0],
                tuple(titles),
                tuple(row["answers"]),
            )
        )
        if len(found) == limit:
            break
    return found


class DenseIndex:
    """Cosine search over the corpus with the knowledge base's embedder (cached on disk)."""

    def __init__(self, corpus: list[dict], cache: Path) -> None:
        self.chunks = [
            Chunk(
                passage_text(row["text"], row["title"]),
                chunk_id=str(row["id"]),
                metadata={"title": row["title"]},
            )
            for row in corpus
        ]
        self.embedder = SentenceEmbedder()
        if cache.is_file():
            self.matrix = np.load(cache)
        else:
            self.matrix = np.asarray(
                self.embedder.embed_documents([c.text for c in self.chunks]), dtype=np.float32
            )
            cache.parent.mkdir(parents=True, exist_ok=True)
            np.save(cache, self.matrix)
        assert self.matrix.shape[0] == len(self.chunks), "stale embedding cache; delete it"

    def search(self, query: str, top_k: int) -> list[Chunk]:
        """The ``top_k`` most similar passages, best first."""
        scores = self.matrix @ np.asarray(self.embedder.embed_query(query), dtype=np.float32)
        order = np.argsort(-scores)[:top_k]
        return [self.chunks[idx] for idx in order]


def turn_reuse(args: argparse.Namespace) -> None:
    """The ``turn-reuse`` subcommand."""

    corpus = {row["title"]: row for row in load_jsonl("2wikimqa_corpus.jsonl", args.data_dir)}
    followups = build_followups(load_jsonl("2wikimqa_dev.jsonl", args.data_dir), 100)
    followups = [f for f in followups if all(t in corpus for t in f.gold_titles)]
    followups = followups[: args.conversations]
    fillers = list(corpus.values())[:2]
    params = GenerationParams(max_new_tokens=24, stop=("\n",))
    shutil.rmtree(args.work_dir, ignore_errors=True)
    base = AdaRAG(engine={"model": args.model}, augment={"enabled": False})
    results: dict[str, list[list[dict]]] = {}
    for mode, enabled in MODES.items():
        rag = base.with_config(
            prompt={"enable_turn_reuse": enabled},
            cache={"store": {"directory": str(args.work_dir / str(enabled))}},
        )
        conversations = []
        for item in followups:
            rows = [corpus[title] for title in item.gold_titles] + fillers
            chunks = [Chunk(passage_text(row["text"], row["title"])) for row in rows]
            rag.warm(chunks)
            history: list[tuple[str, str]] = []
            turns = []
            for question in (item.first, item.follow_up, item.original):
                answer = rag.query(question, chunks=chunks, params=params, history=history)
                step = answer.trace.steps[-1]
                turns.append(
                    {
                        "prompt_tokens": answer.trace.num_prompt_tokens,
                        "computed_tokens": step.num_recomputed_tokens,
                        "ttft_s": answer.trace.ttft_s,
                        "answer": answer.text,
                    }
                )
                history.append((question, answer.text))
            conversations.append(turns)
        results[mode] = conversations

    host = machine()
    model = base.engine.checkpoint.name
    lines = [
        f"# Earlier turns reused: {model}",
        "",
        f"{len(followups)} three-turn conversations over 4 warmed passages each, greedy, 24 new "
        f"tokens; medians per turn. Machine: {host['cpu']}, {host['cores']} cores, shared with "
        "other jobs (times are indicative).",
        "",
        "| mode | turn | prompt tokens | tokens computed | TTFT s |",
        "|---|---|---|---|---|",
    ]
    summary: dict[str, list[dict[str, float]]] = {}
    for mode, conversations in results.items():
        summary[mode] = []
        for turn_idx in range(3):
            turns = [conversation[turn_idx] for conversation in conversations]
            medians = {
                key: statistics.median(turn[key] for turn in turns)
                for key in ("prompt_tokens", "computed_tokens", "ttft_s")
            }
            summary[mode].append(medians)
            lines.append(
                f"| {mode} | {turn_idx + 1} | {medians['prompt_tokens']:.0f} | "
                f"{medians['computed_tokens']:.0f} | {medians['ttft_s']:.3f} |"
            )
    same = sum(
        before[-1]["answer"] == after[-1]["answer"]
        for before, after in zip(*results.values(), strict=True)
    )
    lines += ["", f"Turn-3 answers equal in both modes: {same} of {len(followups)}."]
    payload = {"model": model, "machine": host, "summary": summary, "conversations": results}
    write_results(f"turn_reuse_{model}", payload, "\n".join(lines), directory=OUTPUT)
    print("\n".join(lines))


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
        rows.append(row)
        print(f"{len(rows)}/{len(followups)} {row['methods']['condense']['query']!r}", flush=True)
    _report(rag.engine.checkpoint.name, machine(), rows, "")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    command = sub.add_parser("turn-reuse", help="tokens and TTFT per turn, earlier turns reused")
    command.add_argument("--model", default="default")
    command.add_argument("--conversations", type=int, default=5)
    command.add_argument("--data-dir", type=Path, default=None)
    command.add_argument("--work-dir", type=Path, default=Path("/tmp/adarag-turn-reuse"))
    command.set_defaults(fn=turn_reuse)
    command = sub.add_parser("standalone", help="the standalone question of a follow-up")
    command.add_argument("--model", default="default")
    command.add_argument("--questions", type=int, default=20)
    command.add_argument("--data-dir", type=Path, default=None)
    command.add_argument("--work-dir", type=Path, default=Path("/tmp/adarag-standalone-question"))
    command.add_argument(
        "--replay",
        type=Path,
        help="an earlier run's .json: no model runs; its first answers and condensed questions "
        "are reused, every method's retrieval is measured again, and methods it lacks are "
        "measured for retrieval only (their answer F1 is left blank)",
    )
    command.set_defaults(fn=standalone_question)
    run_subcommand(parser)


if __name__ == "__main__":
    main()
