"""``conversations.py turn-reuse``: tokens computed and TTFT per turn, earlier turns reused."""

from __future__ import annotations

import argparse
import shutil
import statistics

from common import load_jsonl, machine, write_results

from adarag import AdaRAG, Chunk
from adarag.retrievers.chunking import passage_text
from adarag.schema import GenerationParams
from runs.conversations import OUTPUT
from runs.conversations.followups import FollowUp, build_followups

MODES = {"turns recomputed (before)": False, "turns reused (after)": True}


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
        results[mode] = [_conversation(rag, item, corpus, fillers, params) for item in followups]
    _write_table(base, followups, results)


def _conversation(
    rag: AdaRAG,
    item: FollowUp,
    corpus: dict[str, dict],
    fillers: list[dict],
    params: GenerationParams,
) -> list[dict]:
    """The three turns of one conversation over its warmed passages: tokens, TTFT, answer."""
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
    return turns


def _write_table(
    base: AdaRAG, followups: list[FollowUp], results: dict[str, list[list[dict]]]
) -> None:
    """``results/conversations/turn_reuse_<model>.{md,json}``: medians per mode and turn."""
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
