"""Which tokens or requests to recompute: a screen of selection signals, and uncertainty routing.

``signals``: which signal could close the gap to the output-aware oracle? A cheap screen of
selection scores. The fidelity benchmark decodes every rule for real, which costs minutes per
question on the quality model. This screen asks a cheaper question of many candidate scores at
once: with the positions a score picks at each ratio made exact (the full prefill's K/V in every
layer, the rest as cached), does the model still predict full recomputation's answer? For each
question it runs the full prefill (its greedy answer is the reference), the reused prefill
(ratio 0), and then, per score and ratio, one teacher-forced pass of the query and the reference
answer over the mixed context (``AnswerLoss``). A row holds the answer's loss, whether every
answer token stays the argmax ("answer kept", a proxy for exact agreement) and whether the first
one does.

Exact K/V stand in for recomputation (what a recomputed token would get if its context were
exact), so the screen ranks scores and does not replace the fidelity benchmark. The
``output_oracle`` is left out: it optimizes this very loss, so it scores near 100% here.

Scores (``a``: attention the query suffix pays a position over the cached KV, summed over query
tokens and the layers named, head-mean; ``dV_l``: squared deviation of the cached V from the
full prefill's at layer ``l``, which the engine computes exactly at its check layer ``l``):

- practical (what the engine can know before recomputing): ``kv_deviation`` (dV_1),
  ``query_attention`` (a, every layer), ``query_deviation`` (a x dV_1, the default),
  ``qdev_deep_layers`` (a from the upper half of the layers x dV_1), ``qdev_last_token``
  (a of the query's last token x dV_1), ``qdev_linear`` (a x sqrt(dV_1)), ``qdev_check_2`` /
  ``qdev_check_3`` (a x dV_2 / dV_3: a deeper check layer, one / two more full layers),
  ``qdev_draft`` (a of a draft answer, 8 greedy tokens over the cached KV, x dV_1: the lookahead
  queries of pseudo-query KV selection);
- controls (need the full prefill): ``all_layer_deviation`` (each layer's a x sqrt(dV_l),
  summed: every layer's true deviation), ``answer_attention`` (a of the reference answer's own
  tokens x dV_1: what the draft approximates).

Rows are appended per question to ``<rows>/<model>.rows.jsonl`` (``<rows>``: ``--output``'s path
under the benchmarks' cache, ``$ADARAG_BENCH_CACHE``, else ``~/.cache/adarag-bench``; a stopped
run resumes); the report ``<output>/<model>.md`` has each score's figures with 95% bootstrap
intervals and its paired difference against ``query_deviation``.

``routing``: uncertainty routing on the fidelity questions, who is routed up and what it keeps.
``experimental.recompute.uncertain_entropy = H`` runs the query suffix over the reused KV before the
fused prefill and, when the entropy of its next-token distribution is above ``H`` nats,
recomputes the request at ``uncertain_ratio`` (1.0: a full prefill) instead of its own ratio.
A routed request is exactly a request at the higher ratio (the engine's tests show the same
positions, and ratio 1.0 equals full prefill), so its quality comes from the fidelity rows
already measured (``fidelity.py run``): this subcommand only measures each question's entropy
over the reused KV (``--measure``: the ratio-0 prefill's next-token distribution, what the query
pass computes), written per question to ``<model>/<dataset>.entropy.jsonl`` beside the fidelity
rows, so a run resumes.

The report chooses ``H`` on the calibration split (the largest threshold on a 0.05 grid whose
routed policy keeps ``--target`` % exact agreement with full recomputation, pooled) and applies
it to the report split, per data set and pooled, with 95% bootstrap intervals; the routed
policy's rows are named ``<rule>+routed<H>``. Its cost is the share of requests routed up;
``--speed`` reads an ``engine.py ttft`` result with variants ``kept`` (routing on, not routed),
``routed`` (routed up) and ``full`` and turns the share into a mean TTFT speed-up.

    python benchmarks/selection.py signals --model qwen2.5-coder-0.5b --questions 8 --offset 0
    python benchmarks/selection.py routing --model qwen2.5-coder-0.5b --measure
    python benchmarks/selection.py routing --model qwen2.5-coder-0.5b \
        --speed benchmarks/results/engine/engine_ttft_routing_qwen.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812
from common import DEFAULT_DATA_DIR, RESULTS, rows_dir, run_subcommand, write_results
from runs.fidelity.rows import by_dataset, model_name

from adarag.engine.selection import num_to_recompute
from adarag.evaluation.fidelity import FidelityRow, contains_gold, read_rows, summarize
from adarag.evaluation.intervals import bootstrap_interval, paired_difference
from adarag.evaluation.machine import describe_machine, machine
from adarag.evaluation.metrics import best_exact_match
from adarag.evaluation.output_oracle import AnswerLoss
from adarag.evaluation.reuse import independent_chunks, reuse_sources
from adarag.evaluation.workload import DATASETS, FIDELITY_CHUNKS, load_questions

RATIOS = (0.1, 0.2, 0.3)
DRAFT_TOKENS = 8
BASELINE = "query_deviation"
SPLITS = {  # split -> (folder of its fidelity rows, offset, rule of its query_deviation rows)
    "calibration": ("calibration", 0, "qdev"),
    "report": ("", 40, "query_deviation"),
}
QUESTIONS = {"calibration": 8, "report": 40}
SMOLLM2_REPORT_QUESTIONS = 60
GRID = 0.05


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
    full = engine.prefill(layout, None, max_new_tokens=max_new_tokens)
    answer = list(engine.decode_tokens(layout, full, params)) or [int(full.logits.argmax())]
    system_kv, chunk_kvs = independent_chunks(engine, layout)
    reused = engine.prefill(layout, reuse_sources(system_kv, chunk_kvs, 0.0))
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
    from adarag import AdaRAG

    engine: dict = {"model": args.model}
    if args.threads:
        engine["num_threads"] = args.threads
    rag = AdaRAG(engine=engine)
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


def routing(args: argparse.Namespace) -> None:
    """The ``routing`` subcommand: measure missing entropies (``--measure``), then the report."""
    model = model_name(args.model)
    if args.measure:
        _measure_entropies(args, model)
    _report_routing(args, model)


def folder(split: str, model: str) -> Path:
    """Where a split's fidelity rows (and entropies) of ``model`` are."""
    return rows_dir(RESULTS / "fidelity") / SPLITS[split][0] / model


def read_entropies(split: str, model: str) -> dict[tuple[str, str], float]:
    """(dataset, qid) -> entropy over the reused KV, for every question measured."""
    found = {}
    for path in sorted(folder(split, model).glob("*.entropy.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                found[(record["dataset"], record["qid"])] = record["entropy"]
    return found


def _questions(args: argparse.Namespace, split: str, model: str, dataset: str) -> list:
    """The split's questions of ``dataset`` (the fidelity runs' counts and offsets)."""
    count = QUESTIONS[split]
    if split == "report" and "SmolLM2" in model:
        count = SMOLLM2_REPORT_QUESTIONS
    chunks = FIDELITY_CHUNKS[dataset]
    return load_questions(dataset, args.data_dir, count, chunks, SPLITS[split][1])


def _measure_entropies(args: argparse.Namespace, model: str) -> None:
    from adarag import AdaRAG
    from adarag.kernels import lens_signals_from_logits
    from adarag.schema import GenerationParams

    engine: dict = {"model": args.model}
    if args.threads:
        engine["num_threads"] = args.threads
    rag = AdaRAG(engine=engine)
    engine = rag.engine
    params = GenerationParams(max_new_tokens=16)
    for split in args.split:
        done = read_entropies(split, model)
        for dataset in args.dataset:
            path = folder(split, model) / f"{dataset}.entropy.jsonl"
            for item in _questions(args, split, model, dataset):
                if (dataset, item.qid) in done:
                    continue
                layout = rag.layout(item.question, item.chunks, params)
                system_kv, chunk_kvs = independent_chunks(engine, layout)
                reused = engine.prefill(layout, reuse_sources(system_kv, chunk_kvs, 0.0))
                entropy = float(lens_signals_from_logits(reused.logits[None])[1])
                record = {"dataset": dataset, "qid": item.qid, "entropy": entropy}
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a") as handle:
                    handle.write(json.dumps(record) + "\n")
                print(f"{model} {split} {dataset} {item.qid}: {entropy:.3f}")


@dataclass(frozen=True)
class Split:
    """One split's fidelity rows, entropies over the reused KV and gold answers.

    Attributes:
        rows: Every fidelity row of the split (every rule and ratio).
        entropies: (dataset, qid) -> next-token entropy over the reused KV, in nats.
        answers: (dataset, qid) -> the gold answers.
        rule: The name of the split's ``query_deviation`` rows.
    """

    rows: list[FidelityRow]
    entropies: dict[tuple[str, str], float]
    answers: dict[tuple[str, str], list[str]]
    rule: str

    def alone(self, ratio: float) -> list[FidelityRow]:
        """The rule's rows at ``ratio`` on the questions whose entropy was measured."""
        return [
            r
            for r in self.rows
            if r.rule == self.rule and r.ratio == ratio and (r.dataset, r.qid) in self.entropies
        ]

    def routed(self, ratio: float, threshold: float) -> list[FidelityRow]:
        """The routed policy's rows: the rule at ``ratio``, or full recomputation when uncertain."""
        name = routed_name(self.rule, threshold)
        policy = []
        for row in self.alone(ratio):
            key = (row.dataset, row.qid)
            if self.entropies[key] <= threshold:
                policy.append(replace(row, rule=name))
                continue
            golds = self.answers[key]
            policy.append(
                replace(
                    row,
                    rule=name,
                    answer=row.reference,
                    exact_agreement=1.0,
                    f1_agreement=1.0,
                    first_token_agreement=1.0,
                    first_token_kl=0.0,
                    gold_em=best_exact_match(row.reference, golds),
                    gold_f1=row.reference_gold_f1,
                    gold_contains=contains_gold(row.reference, golds),
                    ttft_s=row.full_ttft_s,
                    num_recomputed_tokens=row.num_prompt_tokens,
                )
            )
        return policy

    def threshold(self, ratio: float, target: float) -> float | None:
        """The largest threshold on the grid whose routed rows keep ``target`` % exact agreement."""
        best = None
        for step in range(1, int(max(self.entropies.values(), default=0.0) / GRID) + 2):
            threshold = round(step * GRID, 4)
            found = summarize(self.routed(ratio, threshold), intervals=False)
            if found and found[0].exact_agreement >= target:
                best = threshold
        return best


def routed_name(rule: str, threshold: float) -> str:
    """The name of the routed policy's rows (and of the routed rule decoded for real)."""
    return f"{rule}+routed{threshold:g}"


def _split(args: argparse.Namespace, split: str, model: str) -> Split:
    rows = [
        row
        for path in sorted(folder(split, model).glob("*.rows.jsonl"))
        for row in read_rows(path)
        if row.dataset in args.dataset
    ]
    answers = {
        (dataset, item.qid): list(item.answers)
        for dataset in args.dataset
        for item in _questions(args, split, model, dataset)
    }
    return Split(rows, read_entropies(split, model), answers, SPLITS[split][2])


def _report_routing(args: argparse.Namespace, model: str) -> None:
    """``results/fidelity/<output>_<model>.md``: the threshold, calibration and report tables."""
    splits = {split: _split(args, split, model) for split in SPLITS}
    threshold = splits["calibration"].threshold(args.ratio, args.target)
    if threshold is None:
        print(f"{model}: no threshold keeps {args.target}% on the calibration split")
        return
    lines = [
        f"# Uncertainty routing: {model}",
        "",
        f"Requests at ratio {args.ratio} under `query_deviation`; a request whose next-token "
        f"entropy over the reused KV is above H is recomputed in full. H = {threshold:g} nats, "
        f"the largest threshold (grid {GRID}) keeping {args.target:g}% exact agreement with full "
        "recomputation on the calibration split, pooled. Means with 95% bootstrap intervals; "
        "'paired' is the routed policy minus the rule alone on the same questions; 'same share "
        "routed at random' is the exact agreement expected from routing as many requests up "
        "without reading the entropy (the control).",
        "",
    ]
    speed = _speeds(args.speed) if args.speed else None
    for name, split in splits.items():
        ratios = (0.1, 0.2, 0.3) if name == "calibration" else (args.ratio,)
        lines += [
            f"## {name.capitalize()} split",
            "",
            "| data set | ratio | n | routed % | exact agree: rule | exact agree: routed "
            "| paired | same share routed at random | first-token agree: routed "
            "| gold F1 - full: routed | mean TTFT speed-up |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for ratio in ratios:
            policy, alone = split.routed(ratio, threshold), split.alone(ratio)
            timed = speed if ratio == args.ratio else None  # the ratio engine_ttft timed
            for dataset, subset in by_dataset(policy) if policy else ():
                same_set = [r for r in alone if dataset in ("pooled", r.dataset)]
                lines.append(_line(dataset, ratio, subset, same_set, timed))
        lines += [
            "",
            f"AUC of the entropy for the rule's disagreements at {args.ratio} (1.0: every "
            "disagreeing question above every agreeing one; 0.5: chance): "
            f"{_auc(split.alone(args.ratio), split.entropies):.2f}.",
            "",
            *_decoded_for_real(split, args.ratio, threshold),
        ]
    text = "\n".join(lines)
    print(text)
    write_results(f"{args.output}_{model}", None, text, directory=RESULTS / "fidelity")


def _auc(rows: list[FidelityRow], entropies: dict[tuple[str, str], float]) -> float:
    """P(a disagreeing question's entropy > an agreeing one's), ties counting half."""
    measured = [r for r in rows if (r.dataset, r.qid) in entropies]
    wrong = [entropies[(r.dataset, r.qid)] for r in measured if not r.exact_agreement]
    right = [entropies[(r.dataset, r.qid)] for r in measured if r.exact_agreement]
    if not wrong or not right:
        return float("nan")
    wins = sum((w > a) + 0.5 * (w == a) for w in wrong for a in right)
    return wins / (len(wrong) * len(right))


def _decoded_for_real(split: Split, ratio: float, threshold: float) -> list[str]:
    """How often the rows the routed rule decoded for real equal the policy built here."""
    built = {(r.dataset, r.qid): r for r in split.routed(ratio, threshold)}
    name = routed_name(split.rule, threshold)
    real = [r for r in split.rows if r.rule == name and r.ratio == ratio]
    if not real:
        return []
    same = sum(
        r.answer == built[(r.dataset, r.qid)].answer for r in real if (r.dataset, r.qid) in built
    )
    uncertain = [r for r in real if split.entropies.get((r.dataset, r.qid), 0.0) > threshold]
    # a request routed up recomputes every token but the system prefix's
    recomputed = sum(r.num_recomputed_tokens > 0.8 * r.num_prompt_tokens for r in uncertain)
    return [
        f"Decoded for real (`fidelity.py run --rule '{name}:selection_policy="
        f"query_deviation,uncertain_entropy={threshold:g}'`): {len(real)} questions, "
        f"{len(uncertain)} above H, of which {recomputed} recomputed more than 80% of the prompt; "
        f"the answer equals the policy built above on {same} of {len(real)}.",
        "",
    ]


def _line(
    dataset: str,
    ratio: float,
    policy: list[FidelityRow],
    alone: list[FidelityRow],
    speed: dict[str, float] | None,
) -> str:
    routed_share = sum(r.num_recomputed_tokens == r.num_prompt_tokens for r in policy) / len(policy)
    found = summarize(policy)[0]
    base = summarize(alone)[0]
    paired = paired_difference(
        [100 * r.exact_agreement for r in policy], [100 * r.exact_agreement for r in alone]
    )
    # routing the same share of requests up at random: a routed one agrees, the rest as before
    at_random = base.exact_agreement + routed_share * (100.0 - base.exact_agreement)
    ttft = "-"
    if speed is not None:
        mean = (1 - routed_share) * speed["kept"] + routed_share * speed["routed"]
        ttft = f"{speed['full'] / mean:.2f}x"
    return (
        f"| {dataset} | {ratio} | {found.num_questions} | {100 * routed_share:.1f} "
        f"| {base.exact_interval} | {found.exact_interval} | {paired} | {at_random:.1f} "
        f"| {found.first_token_interval} | {found.gold_f1_vs_full} | {ttft} |"
    )


def _speeds(path: Path) -> dict[str, float]:
    """Mean TTFT of ``full``, the ``kept`` and the ``routed`` variants of an engine_ttft run."""
    stats = json.loads(path.read_text())["stats"]
    found = {"full": stats["full"]["mean"]}
    for name, stat in stats.items():
        for variant in ("kept", "routed"):
            if name.endswith(f" {variant}"):
                found[variant] = stat["mean"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    command = sub.add_parser("signals", help="a screen of selection scores against the answer")
    command.add_argument("--model", default="qwen2.5-coder-0.5b")
    command.add_argument("--dataset", nargs="+", default=list(DATASETS), choices=DATASETS)
    command.add_argument("--questions", type=int, default=8)
    command.add_argument("--offset", type=int, default=0, help="skip this many questions")
    command.add_argument("--max-new-tokens", type=int, default=16)
    command.add_argument("--threads", type=int)
    command.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    command.add_argument("--output", type=Path, default=RESULTS / "fidelity" / "signals")
    command.add_argument("--report-only", action="store_true")
    command.set_defaults(fn=signals)
    command = sub.add_parser("routing", help="uncertainty routing replayed on the fidelity rows")
    command.add_argument("--model", default="default")
    command.add_argument("--dataset", nargs="+", default=list(DATASETS), choices=DATASETS)
    command.add_argument("--measure", action="store_true", help="measure missing entropies")
    command.add_argument("--split", nargs="+", default=list(SPLITS), choices=list(SPLITS))
    command.add_argument("--ratio", type=float, default=0.2, help="the requests' own ratio")
    command.add_argument("--target", type=float, default=85.0, help="calibration's exact agree %")
    command.add_argument("--threads", type=int)
    command.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    command.add_argument("--speed", type=Path, help="an `engine.py ttft` result (.json)")
    command.add_argument(
        "--output", default="uncertainty_routing", help="results/fidelity/<output>_<model>.md"
    )
    command.set_defaults(fn=routing)
    run_subcommand(parser)


if __name__ == "__main__":
    main()
