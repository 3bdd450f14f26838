"""Tokens computed and TTFT per turn of a 3-turn conversation, earlier turns reused or not.

Each conversation (``followups.py``) asks the first question, the follow-up and the original
question, over the same passages (the two gold passages and two others, warmed as ingest warms
them). ``prompt.enable_turn_reuse`` on: each earlier turn is a cached segment, so a turn computes
the turn it adds and its question; off: the earlier turns sit in the query suffix and are
recomputed every turn. Each mode has a KV store of its own.

    python benchmarks/turn_reuse.py --model default --conversations 5
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import load_jsonl, machine, write_results  # noqa: E402
from followups import build_followups  # noqa: E402

from adarag import AdaRAG, Chunk  # noqa: E402
from adarag.retrievers.chunking import passage_text  # noqa: E402
from adarag.schema import GenerationParams  # noqa: E402

MODES = {"turns recomputed (before)": False, "turns reused (after)": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="default")
    parser.add_argument("--conversations", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/adarag-turn-reuse"))
    args = parser.parse_args()

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
    write_results(f"turn_reuse_{model}", payload, "\n".join(lines))
    print("\n".join(lines))  # noqa: T201


if __name__ == "__main__":
    main()
