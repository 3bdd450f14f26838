"""``selection.py signals``: selection scores screened against full recomputation's answer."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812
from common import pipeline_for, rows_dir, write_results

from adarag.engine.prefill_request import PrefillRequest
from adarag.engine.selection import num_to_recompute
from adarag.evaluation.intervals import bootstrap_interval, paired_difference
from adarag.evaluation.machine import describe_machine, machine
from adarag.evaluation.output_oracle import AnswerLoss
from adarag.evaluation.reuse import independent_chunks, reuse_sources
from adarag.evaluation.workload import FIDELITY_CHUNKS, load_questions
from runs.fidelity.rows import model_name

RATIOS = (0.1, 0.2, 0.3)
DRAFT_TOKENS = 8
BASELINE = "query_deviation"


class Signals:
    """What the scores read, for one prompt."""

    def __init__(self, loss: AnswerLoss, draft: AnswerLoss) -> None:
        query_rows = slice(0, loss.num_query)
        answer_rows = slice(loss.num_query - 1, None)  # the rows that predict answer tokens
        with torch.no_grad():
            attention: list[torch.Tensor] = []
            loss.logits(torch.zeros(loss.context), attention)
            self.query = torch.stack([a[query_rows] for a in attention]).sum(dim=1)  # [L, ctx]
            self.last_token = torch.stack([a[loss.num_query - 1] for a in attention]).sum(dim=0)
            self.answer = torch.stack([a[answer_rows] for a in attention]).sum(dim=(0, 1))
            attention = []
            draft.logits(torch.zeros(draft.context), attention)
            self.draft = torch.stack([a[answer_rows] for a in attention]).sum(dim=(0, 1))
        self.deviation = loss.delta_v.pow(2).sum(dim=(2, 3))  # [L, ctx]
        self.num_layers = self.deviation.shape[0]


SCORES: dict[str, Callable[[Signals], torch.Tensor]] = {
    "kv_deviation": lambda s: s.deviation[1],
    "query_attention": lambda s: s.query.sum(0),
    "query_deviation": lambda s: s.query.sum(0) * s.deviation[1],
    "qdev_deep_layers": lambda s: s.query[s.num_layers // 2 :].sum(0) * s.deviation[1],
    "qdev_last_token": lambda s: s.last_token * s.deviation[1],
    "qdev_linear": lambda s: s.query.sum(0) * s.deviation[1].sqrt(),
    "qdev_check_2": lambda s: s.query.sum(0) * s.deviation[2],
    "qdev_check_3": lambda s: s.query.sum(0) * s.deviation[3],
    "qdev_draft": lambda s: s.draft * s.deviation[1],
    "all_layer_deviation": lambda s: (
        s.query * (s.deviation / s.deviation.mean(dim=1, keepdim=True).clamp(min=1e-12)).sqrt()
    ).sum(0),
    "answer_attention": lambda s: s.answer * s.deviation[1],
}
"""Score name -> [context] scores (higher is made exact first)."""


def draft_answer(loss: AnswerLoss) -> list[int]:
    """``DRAFT_TOKENS`` greedy tokens over the cached context (what ratio 0 would answer)."""
    draft: list[int] = []
    with torch.no_grad():
        for _ in range(DRAFT_TOKENS):
            step = loss.with_answer([*draft, 0])  # the placeholder's row predicts the next token
            draft.append(int(step.logits(torch.zeros(loss.context))[-1].argmax()))
    return draft


def measure_signals(rag, dataset: str, item, max_new_tokens: int) -> list[dict]:
    """Every score at every ratio on one question."""
    from adarag.schema import GenerationParams

    engine = rag.engine
    params = GenerationParams(max_new_tokens=max_new_tokens)
    layout = rag.layout(item.question, item.chunks, params)
    full = engine.prefill(PrefillRequest(layout, None, max_new_tokens=max_new_tokens))
    answer = list(engine.decode_tokens(layout, full, params)) or [int(full.logits.argmax())]
    system_kv, chunk_kvs = independent_chunks(engine, layout)
    reused = engine.prefill(PrefillRequest(layout, reuse_sources(system_kv, chunk_kvs, 0.0)))
    loss = AnswerLoss(engine, layout, reused.kv, full.kv, answer)
    signals = Signals(loss, loss.with_answer(draft_answer(loss)))
    first_chunk = layout.cu_segments[1]
    rows = []
    for name, score_of in SCORES.items():
        scores = score_of(signals).clone()
        scores[:first_chunk] = -torch.inf  # the system prefix is reused as is
        order = torch.sort(-scores, stable=True).indices
        for ratio in RATIOS:
            budget = sum(num_to_recompute(len(ids), ratio) for ids in layout.chunk_ids)
            mix = torch.zeros(loss.context)
            mix[order[:budget]] = 1.0
            with torch.no_grad():
                logits = loss.logits(mix)
            predicted = logits.argmax(dim=-1)
            rows.append(
                {
                    "dataset": dataset,
                    "qid": item.qid,
                    "score": name,
                    "ratio": ratio,
                    "answer_loss": float(F.cross_entropy(logits, loss.targets)),
                    "answer_kept": float(bool((predicted == loss.targets).all())),
                    "first_token_kept": float(predicted[0] == loss.targets[0]),
                    "num_prompt_tokens": layout.num_tokens,
                }
            )
    return rows


def signal_table(rows: list[dict], title: str) -> str:
    """The table: each score at each ratio, with intervals and the paired difference."""
    lines = [
        f"## {title}",
        "",
        f"| score | ratio | n | answer kept % | first token kept % | answer loss | "
        f"answer kept - {BASELINE} (paired) |",
        "|---|---|---|---|---|---|---|",
    ]
    by_key: dict[tuple[str, float], dict[tuple[str, str], dict]] = {}
    for row in rows:
        by_key.setdefault((row["score"], row["ratio"]), {})[(row["dataset"], row["qid"])] = row
    for name in SCORES:
        for ratio in RATIOS:
            group = by_key.get((name, ratio))
            if not group:
                continue
            kept = [100 * row["answer_kept"] for row in group.values()]
            first = [100 * row["first_token_kept"] for row in group.values()]
            nll = [row["answer_loss"] for row in group.values()]
            base = by_key.get((BASELINE, ratio), {})
            paired = [
                (100 * row["answer_kept"], 100 * base[key]["answer_kept"])
                for key, row in group.items()
                if key in base
            ]
            diff = "" if name == BASELINE else _paired_difference(paired)
            lines.append(
                f"| {name} | {ratio:.1f} | {len(kept)} | {_interval(kept)} | "
                f"{_interval(first)} | {sum(nll) / len(nll):.3f} | {diff} |"
            )
    return "\n".join(lines)


def _interval(values: list[float]) -> str:
    return str(bootstrap_interval(values))


def _paired_difference(pairs: list[tuple[float, float]]) -> str:
    difference = paired_difference([a for a, _ in pairs], [b for _, b in pairs])
    return f"{difference} (p = {difference.p_value:.2f})"


def signals(args: argparse.Namespace) -> None:
    """The ``signals`` subcommand: measure the missing questions, then the report."""
    model = model_name(args.model)
    path = rows_dir(args.output) / f"{model}.rows.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    if not args.report_only:
        rows += _measure_signals(args, model, path, {(row["dataset"], row["qid"]) for row in rows})
    count = len({(row["dataset"], row["qid"]) for row in rows})
    title = f"{model}: {count} questions from #{args.offset} of {', '.join(args.dataset)}"
    header = [
        f"# Selection signals: {model}",
        "",
        describe_machine(machine()),
        "",
        "Each score's chosen positions made exact (the full prefill's K/V in every layer), the "
        "rest as cached; the query and full recomputation's greedy answer teacher-forced over "
        "that context. 'answer kept': every answer token is still the argmax (a proxy for exact "
        "agreement). Means over questions with 95% bootstrap intervals; the last column is "
        f"the paired difference in 'answer kept' against `{BASELINE}`.",
        "",
    ]
    write_results(
        model, None, "\n".join([*header, signal_table(rows, title)]), directory=args.output
    )


def _measure_signals(args: argparse.Namespace, model: str, path: Path, done: set) -> list[dict]:

    rag = pipeline_for(args.model, args.threads)
    assert rag.engine.checkpoint.name == model, f"model {model} writes under {path}"
    measured = []
    started = time.perf_counter()
    for dataset in args.dataset:
        questions = load_questions(
            dataset, args.data_dir, args.questions, FIDELITY_CHUNKS[dataset], args.offset
        )
        for item in questions:
            if (dataset, item.qid) in done:
                continue
            rows = measure_signals(rag, dataset, item, args.max_new_tokens)
            with path.open("a") as out:
                out.writelines(json.dumps(row) + "\n" for row in rows)
            measured += rows
            print(f"{model} {dataset} {item.qid} ({time.perf_counter() - started:.0f} s)")
    return measured
