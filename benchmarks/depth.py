"""Adaptive depth against every fixed top-k, over real retrieval (Chroma, no gold forced in).

Three stages, each resumable:

``retrieve``: each data set's knowledge base (``adarag.evaluation.corpora``) is embedded into an
on-disk Chroma (all-MiniLM-L6-v2) once, and every question's top-12 chunks are written with their
scores to ``<cache>/<dataset>.retrieved.jsonl`` (``<cache>``: ``$ADARAG_BENCH_CACHE``, else
``~/.cache/adarag-bench``).

``run``: per question, every augmentation step k = 1..12 (``record_depth``: step k
reuses steps 1..k-1's exact KV from the hard tier and computes chunk k and the question; no other
tier, float32 store, so step k's answer is the full-recomputation answer of static top-k) with
its answer, gold F1, lens confidence, first-token margin, answer stability and wall time; plus
full prefills of the top-12 prompt and of one more depth (cycling over 1..11), every third
question, for the static TTFT fit. One JSON line per question in
``<cache>/depth/<model>/<dataset>.jsonl``; the depth probe's features of every step (the residual
stream at three layers, the lens signals, the retrieval scores) go to
``<cache>/depth-probe/<model>/<dataset>/``.

``--split calibration`` retrieves and runs other questions of each set, none of the report's:
the depth probe is fitted on them (``adarag calibrate --depth --dataset 2wikimqa hotpotqa
musique --records <cache>/depth-probe-calibration/<model>``); their JSON lines go to
``<cache>/depth-calibration/``.

``report``: fixed top-k for k = 1..12, the adaptive rules and the per-question oracle depth, from
the recorded questions. Per model, the rules' parameters are chosen on the calibration questions
of all three sets pooled (the first ``--calibration`` of each), by the largest gold-F1 gain over
fixed top-k at the same mean prompt tokens; every figure in the tables is on the remaining
(report) questions. Tables (``summary.md``, ``summary.json``) and plots in
``results/adaptive-augmentation/depth/``.

    python benchmarks/depth.py retrieve
    python benchmarks/depth.py run --model qwen2.5-coder-0.5b --dataset hotpotqa
    python benchmarks/depth.py report
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from common import CACHE, DEFAULT_DATA_DIR, RESULTS, write_results

import adarag.profiles
from adarag.augment.probe import SIGNALS
from adarag.evaluation.corpora import (
    RETRIEVAL_DATASETS,
    corpus_chunks,
    gold_titles,
    is_gold,
    questions,
)
from adarag.evaluation.depth import (
    DepthQuestion,
    Outcome,
    Prices,
    Rule,
    auroc,
    choose,
    fixed,
    fixed_at_tokens,
    oracle,
    prior,
    signal,
    signal_auroc,
    stable,
    stops_at,
)
from adarag.evaluation.intervals import bootstrap_interval, paired_difference
from adarag.evaluation.machine import describe_machine, machine
from adarag.evaluation.metrics import best_exact_match, best_f1
from adarag.evaluation.plots import pyplot
from adarag.evaluation.profiling.depth_probe import (
    DepthRecord,
    first_confident,
    load_depth_records,
    step_probabilities,
)
from adarag.profiles import ModelProfile
from adarag.profiles.learned import DepthProbe
from adarag.schema import Chunk, GenerationParams

if TYPE_CHECKING:
    from adarag import AdaRAG

MAX_K = 12
OUTPUT = RESULTS / "adaptive-augmentation" / "depth"
STATIC_EVERY = 3  # time full prefills for every third question (the static fit needs a few)
# questions per data set: the first CALIBRATION choose the rules' thresholds, the rest report
OFFSETS = {"2wikimqa": 100, "hotpotqa": 100, "musique": 40}
REPORTED = 45  # questions from each offset: 5 calibrate the hand-made rules, 40 report
ROWS = {"report": CACHE / "depth", "calibration": CACHE / "depth-calibration"}
PROBE_RECORDS = {"report": CACHE / "depth-probe", "calibration": CACHE / "depth-probe-calibration"}
DEFAULT_K = 6
PACKAGED_PROFILES = Path(adarag.profiles.__file__).parent
GAPS = (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.12, 0.15)
TAUS = [round(float(tau), 2) for tau in np.linspace(0.05, 0.95, 19)]
FAMILIES: dict[str, list[Rule]] = {
    "score-gap prior (static)": [prior(gap) for gap in GAPS],
    "lens confidence": [signal("confidence", tau, floor) for tau in TAUS for floor in (1, 2, 3, 4)],
    "first-token margin": [signal("margin", tau, floor) for tau in TAUS for floor in (1, 2, 3, 4)],
    "answer stability": [stable(floor, stride) for floor in (2, 3, 4, 5) for stride in (1, 2, 3)],
    "gap prior, then margin": [signal("margin", tau, 1, gap) for tau in TAUS for gap in GAPS],
    "gap prior, then stability": [
        stable(floor, stride, gap) for floor in (2, 3, 4) for stride in (1, 2) for gap in GAPS
    ],
}


def split_rows(rows: list[dict], dataset: str, split: str, count: int) -> list[dict]:
    """The questions of ``split``: the report's (from the offset), or ``count`` others."""
    start = OFFSETS[dataset]
    if split == "report":
        return rows[start : start + count]
    others = rows[:start] + rows[start + REPORTED :]
    return others[:count]


def retrieved_path(dataset: str, split: str) -> Path:
    """Where a split's top-12 per question are written."""
    infix = "" if split == "report" else ".calibration"
    return CACHE / f"{dataset}{infix}.retrieved.jsonl"


def retrieve(args: argparse.Namespace) -> None:
    """Embed each corpus into Chroma (once) and write every question's top-12."""
    from adarag.config import RetrievalConfig
    from adarag.retrievers import KnowledgeBase

    for dataset in args.datasets:
        path = retrieved_path(dataset, args.split)
        if path.exists():
            print(f"{path} exists")
            continue
        config = RetrievalConfig(collection=f"depth-{dataset}", chroma_directory=CACHE / "chroma")
        with KnowledgeBase(config) as kb:
            chunks = corpus_chunks(dataset, args.data_dir)
            if kb.count() < len(chunks):
                started = time.perf_counter()
                kb.add_chunks(chunks, source=dataset)
                print(
                    f"{dataset}: {len(chunks)} chunks embedded in "
                    f"{time.perf_counter() - started:.0f} s"
                )
            rows = questions(dataset, args.data_dir)
            selected = split_rows(rows, dataset, args.split, args.questions)
            lines = []
            for row in selected:
                found = kb.retrieve(row["question"], MAX_K)
                titles = gold_titles(dataset, row)
                lines.append(
                    json.dumps(
                        {
                            "qid": str(row["id"]),
                            "question": row["question"],
                            "answers": row["answers"],
                            "type": row.get("type"),
                            "num_gold": len(titles),
                            "chunks": [
                                {
                                    "id": c.chunk_id,
                                    "text": c.text,
                                    "score": c.score,
                                    "gold": is_gold(c, titles, row["answers"]),
                                }
                                for c in found
                            ],
                        }
                    )
                )
        path.write_text("\n".join(lines) + "\n")
        print(f"{dataset}: {len(lines)} questions retrieved -> {path}")


def hard_tier_pipeline(
    model: str, threads: int, storage_dtype: str = "float32", **levers: object
) -> AdaRAG:
    """A pipeline of ``model`` whose only tier is the hard one, its store in memory.

    Step k's answer is then static top-k's with a float32 store (``exact_steps``).
    """
    from adarag import AdaRAG, AdaRagConfig
    from adarag.evaluation.profiling.depth_probe import exact_steps

    config = AdaRagConfig.build(engine={"model": model, "num_threads": threads})
    return AdaRAG(exact_steps(config, storage_dtype, **levers))


def run(args: argparse.Namespace) -> None:
    """Every step of every question (resuming after the questions already written)."""
    from adarag.evaluation.profiling.calibration import answer_each_step
    from adarag.evaluation.profiling.depth_probe import (
        has_depth_record,
        probe_layers,
        record_depth,
        save_depth_record,
    )

    out = ROWS[args.split] / args.model_dir / f"{args.dataset}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    done = (
        {json.loads(line)["qid"] for line in out.read_text().splitlines()}
        if out.exists()
        else set()
    )
    items = [json.loads(line) for line in retrieved_path(args.dataset, args.split).open()]
    items = items[: args.questions]
    rag = hard_tier_pipeline(args.model, args.threads)
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    layers = probe_layers(rag.engine.spec.num_layers)
    probes = PROBE_RECORDS[args.split] / args.model_dir
    answer_each_step(rag, rag.layout("warm-up?", ["A short passage."], params), params)
    index, count = (int(part) for part in args.shard.split("/"))
    for index_in_set, item in enumerate(items):
        if index_in_set % count != index:
            continue
        probed = has_depth_record(probes, args.dataset, item["qid"])
        if item["qid"] in done and probed:
            continue
        chunks = [Chunk(c["text"], c["id"], c["score"]) for c in item["chunks"]]
        started = time.perf_counter()
        record, steps = record_depth(
            rag,
            args.dataset,
            item["qid"],
            item["question"],
            chunks,
            item["answers"],
            params,
            layers,
        )
        wall_s = time.perf_counter() - started
        save_depth_record(probes, record)
        if item["qid"] in done:  # the JSON line is there already (the same greedy answers)
            continue
        tokens = [
            rag.layout(item["question"], chunks[:k], params).num_tokens for k in range(1, MAX_K + 1)
        ]
        static = []
        timed_depths = (MAX_K, 1 + (index_in_set // STATIC_EVERY) % (MAX_K - 1))
        for k in timed_depths if index_in_set % STATIC_EVERY == 0 else ():
            layout = rag.layout(item["question"], chunks[:k], params)
            begun = time.perf_counter()
            rag.engine.prefill(layout, max_new_tokens=params.max_new_tokens)
            static.append(
                {"k": k, "tokens": layout.num_tokens, "seconds": time.perf_counter() - begun}
            )
        row = {
            "qid": item["qid"],
            "index": index_in_set,
            "type": item["type"],
            "scores": [c["score"] for c in item["chunks"]],
            "gold": [c["gold"] for c in item["chunks"]],
            "num_gold": item["num_gold"],
            "prompt_tokens": tokens,
            "wall_s": wall_s,
            "static": static,
            "steps": [
                {
                    "processed": trace.num_processed_tokens,
                    "step_s": trace.prefill_s + trace.confidence_s,
                    "confidence": trace.confidence,
                    "margin": trace.margin,
                    "stable": trace.is_stable,
                    "answer": answer,
                    "f1": best_f1(answer, item["answers"]),
                    "em": best_exact_match(answer, item["answers"]),
                }
                for trace, answer in steps
            ],
        }
        with out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        f1s = " ".join(f"{100 * s['f1']:.0f}" for s in row["steps"])
        print(f"[{index_in_set}] {wall_s:.1f} s  F1 by k: {f1s}", flush=True)


def report(args: argparse.Namespace) -> None:
    """Tables and plots from every recorded question."""
    write_report(ROWS["report"], OUTPUT, args.calibration, PROBE_RECORDS["report"])


def load(model_dir: Path) -> dict[str, list[dict]]:
    """Each set's recorded questions (rows as written by ``run``)."""
    return {
        path.stem: [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for path in sorted(model_dir.glob("*.jsonl"))
    }


@functools.cache
def packaged_probe(model: str) -> DepthProbe | None:
    """The depth probe of the model's packaged profile, if any."""
    path = PACKAGED_PROFILES / f"{model}.json"
    if not path.exists():
        return None
    return ModelProfile.from_json(path.read_text(), str(path)).depth_probe


def probed(
    model: str, dataset: str, qids: Sequence[str], records: Path
) -> tuple[DepthProbe, list[DepthRecord]] | None:
    """The model's packaged depth probe and its records of ``qids``, if it has both."""
    probe = packaged_probe(model)
    found = {r.qid: r for r in load_depth_records(records / model, [dataset])} if probe else {}
    if probe is None or not set(qids) <= set(found):
        return None
    return probe, [found[qid] for qid in qids]


def probe_rule(probe: DepthProbe, records: Sequence[DepthRecord]) -> Rule:
    """The ``probe`` stop rule replayed on ``records``."""
    stops = {
        r.qid: first_confident(step_probabilities(probe.model, r), probe.threshold, probe.min_steps)
        for r in records
    }
    name = f"depth probe P ≥ {probe.threshold:.2f} from {probe.min_steps} (`calibrate --depth`)"
    return stops_at(stops, probe.min_steps, name)


def _feature_row(dataset: str, probe: DepthProbe, records: Sequence[DepthRecord]) -> str:
    """AUROC of the probe and of each of its signals for its label, over every step."""
    labels = np.concatenate([r.labels() for r in records])
    scores = [np.concatenate([step_probabilities(probe.model, r) for r in records])]
    scores += [np.concatenate([r.signals[:, i] for r in records]) for i in range(len(SIGNALS))]
    values = [auroc(list(map(float, x)), list(labels > 0.5)) for x in scores]
    cells = " | ".join("-" if value is None else f"{value:.2f}" for value in values)
    return f"| {dataset} | {len(labels)} | {100 * labels.mean():.0f}% | {cells} |"


def write_report(rows: Path, output: Path, calibration: int, probe_records: Path) -> None:
    """``output/summary.md``, ``output/summary.json`` and one plot per model, from ``rows``.

    ``rows`` holds one folder of recorded questions per model. A model whose packaged profile
    holds a depth probe, with probe records of every report question under
    ``probe_records/<model>``, gets the probe's row too.
    """
    lines = [
        "# Adaptive depth against fixed top-k over real retrieval",
        "",
        "Each question's top-12 chunks come from an embedded Chroma knowledge base "
        "(all-MiniLM-L6-v2) over its data set's corpus, no gold passage forced in; step k's "
        "answer is the full-recomputation answer of static top-k (greedy, 16 new tokens). "
        "Gold F1 in points with 95% bootstrap intervals. TTFT is priced from each model's "
        "timed full prefills and steps (fits below; `adarag/evaluation/depth.py`), measured "
        "with one torch thread per process and up to four processes sharing the 2 cores, so "
        "compare TTFT within a model only. Rule parameters are chosen on the first "
        f"{calibration} questions of each set (pooled); every row below is on the others. "
        f"Report: `python benchmarks/depth.py report` ({describe_machine(machine())})",
        "",
    ]
    summary: dict[str, Any] = {}
    for model_dir in sorted(p for p in rows.iterdir() if p.is_dir()):
        sets = load(model_dir)
        if not sets:
            continue
        everything = [DepthQuestion.from_record(row) for rows in sets.values() for row in rows]
        prices = Prices.fit(everything)
        tuning = [
            DepthQuestion.from_record(row)
            for rows in sets.values()
            for row in rows
            if row["index"] < calibration
        ]
        chosen = {name: choose(rules, tuning, prices, MAX_K) for name, rules in FAMILIES.items()}
        lines += _model_header(model_dir.name, prices, len(tuning))
        summary[model_dir.name] = {"prices": _prices(prices), "sets": {}}
        panels = {}
        signals: list[str] = []
        features: list[str] = []
        for dataset, rows in sets.items():
            held = [row for row in rows if row["index"] >= calibration]
            if not held:
                continue
            questions = [DepthQuestion.from_record(row) for row in held]
            fixed_outcomes = [Outcome.of(fixed(k), questions, prices) for k in range(1, MAX_K + 1)]
            found = probed(model_dir.name, dataset, [q.qid for q in questions], probe_records)
            extra = [probe_rule(*found)] if found else []
            rules = [*chosen.values(), *extra, oracle()]
            outcomes = [Outcome.of(rule, questions, prices) for rule in rules]
            lines += _fixed_table(dataset, held, fixed_outcomes)
            lines += _rule_table(outcomes, fixed_outcomes)
            summary[model_dir.name]["sets"][dataset] = _set_summary(fixed_outcomes, outcomes)
            panels[dataset] = (fixed_outcomes, outcomes)
            signals.append(_signal_row(dataset, questions))
            if found:
                features.append(_feature_row(dataset, *found))
        lines += [
            "How well each step's signal ranks the steps whose answer reaches gold F1 0.5 "
            "(AUROC over every step of the report questions; 0.5 is chance):",
            "",
            "| set | steps | answers with F1 >= 0.5 | lens confidence | first-token margin |",
            "|---|---|---|---|---|",
            *signals,
            "",
        ]
        if features:
            lines += [
                "How well the depth probe and each of its signals rank the steps no later step "
                "answers better than (its label; AUROC over every step of the report questions, "
                "0.5 is chance, below 0.5 ranks them last):",
                "",
                f"| set | steps | label true | probe | {' | '.join(SIGNALS)} |",
                "|---|---|---|---|" + "---|" * len(SIGNALS),
                *features,
                "",
            ]
        plot = _plot(model_dir.name, panels, output / f"{model_dir.name}_pareto.png")
        lines += [f"![F1 against prompt tokens]({plot.name})", ""]
    write_results("summary", summary, "\n".join(lines), directory=output)


def _model_header(model: str, prices: Prices, num_tuning: int) -> list[str]:
    a, b, c = prices.static
    return [
        f"## {model}",
        "",
        f"Full prefill of n tokens: {a:.3f} s + {1e3 * b:.3f} ms x n + {1e6 * c:.4f} us x n^2. "
        f"Augmentation step: {prices.step.fixed_s:.3f} s fixed + "
        f"{1e3 * prices.step.per_token_s:.3f} ms per processed token. "
        f"Rules chosen on {num_tuning} calibration questions.",
        "",
    ]


def _fixed_table(dataset: str, rows: Sequence[dict], outcomes: Sequence[Outcome]) -> list[str]:
    lines = [
        f"### {dataset}: fixed top-k ({len(rows)} questions)",
        "",
        "| k | gold F1 [95% CI] | mean prompt tokens | TTFT s | a gold chunk in top-k |",
        "|---|---|---|---|---|",
    ]
    for k, outcome in enumerate(outcomes, 1):
        recall = 100 * np.mean([any(row["gold"][:k]) for row in rows])
        lines.append(
            f"| {k} | {bootstrap_interval(outcome.f1)} | {outcome.mean_tokens:.0f} | "
            f"{np.mean(outcome.seconds):.2f} | {recall:.0f}% |"
        )
    return [*lines, ""]


def _rule_table(outcomes: Sequence[Outcome], fixed_outcomes: Sequence[Outcome]) -> list[str]:
    default = float(np.mean(fixed_outcomes[DEFAULT_K - 1].seconds))
    best = max(fixed_outcomes, key=lambda o: o.mean_f1)
    lines = [
        f"Best fixed depth: top-{fixed_outcomes.index(best) + 1}, F1 {best.mean_f1:.1f}.",
        "",
        "| rule (chosen on calibration) | gold F1 [95% CI] | mean depth (range) | mean prompt "
        "tokens | TTFT s | F1 - fixed top-k at equal tokens [95% CI] | TTFT / static "
        f"top-{DEFAULT_K} |",
        "|---|---|---|---|---|---|---|",
    ]
    for outcome in outcomes:
        equal = fixed_at_tokens(fixed_outcomes, outcome.mean_tokens)
        gain = paired_difference(outcome.f1, equal)
        seconds = float(np.mean(outcome.seconds))
        lines.append(
            f"| {outcome.rule.name} | {bootstrap_interval(outcome.f1)} | "
            f"{np.mean(outcome.depth):.2f} ({min(outcome.depth)}-{max(outcome.depth)}) | "
            f"{outcome.mean_tokens:.0f} | {seconds:.2f} | {gain} | {seconds / default:.2f} |"
        )
    return [*lines, ""]


def _signal_row(dataset: str, questions: Sequence[DepthQuestion]) -> str:
    steps = [step for q in questions for step in q.steps]
    good = 100 * np.mean([step.f1 >= 0.5 for step in steps])
    cells = [signal_auroc(questions, name) for name in ("confidence", "margin")]
    shown = " | ".join("-" if cell is None else f"{cell:.2f}" for cell in cells)
    return f"| {dataset} | {len(steps)} | {good:.0f}% | {shown} |"


def _set_summary(fixed_outcomes: Sequence[Outcome], outcomes: Sequence[Outcome]) -> dict:
    def row(outcome: Outcome) -> dict:
        interval = bootstrap_interval(outcome.f1)
        equal = fixed_at_tokens(fixed_outcomes, outcome.mean_tokens)
        gain = paired_difference(outcome.f1, equal).difference
        return {
            "rule": outcome.rule.name,
            "f1": [interval.mean, interval.low, interval.high],
            "mean_depth": float(np.mean(outcome.depth)),
            "mean_tokens": outcome.mean_tokens,
            "ttft_s": float(np.mean(outcome.seconds)),
            "gain_over_fixed": [gain.mean, gain.low, gain.high],
        }

    return {
        "questions": len(fixed_outcomes[0].f1),
        "fixed": [row(o) for o in fixed_outcomes],
        "rules": [row(o) for o in outcomes],
    }


def _prices(prices: Prices) -> dict:
    return {
        "static": list(prices.static),
        "step_fixed_s": prices.step.fixed_s,
        "step_per_token_s": prices.step.per_token_s,
    }


def _plot(model: str, panels: dict, path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (dataset, (fixed_outcomes, outcomes)) in zip(axes[0], panels.items(), strict=True):
        intervals = [bootstrap_interval(o.f1) for o in fixed_outcomes]
        x = [o.mean_tokens for o in fixed_outcomes]
        y = [i.mean for i in intervals]
        err = [[i.mean - i.low for i in intervals], [i.high - i.mean for i in intervals]]
        ax.errorbar(x, y, yerr=err, fmt="-o", color="grey", label="fixed top-k", capsize=2)
        for k, (tx, ty) in enumerate(zip(x, y, strict=True), 1):
            ax.annotate(str(k), (tx, ty), fontsize=7, xytext=(2, 3), textcoords="offset points")
        for outcome in outcomes:
            ax.plot(
                outcome.mean_tokens,
                outcome.mean_f1,
                "*" if "oracle" in outcome.rule.name else "s",
                label=outcome.rule.name,
                markersize=8,
            )
        ax.set_title(f"{model}: {dataset}")
        ax.set_xlabel("mean prompt tokens")
        ax.set_ylabel("gold F1")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    stage = sub.add_parser("retrieve")
    stage.add_argument("--datasets", nargs="+", default=list(RETRIEVAL_DATASETS))
    stage.add_argument("--questions", type=int, default=60)
    stage.add_argument("--split", choices=("report", "calibration"), default="report")
    stage.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    stage.set_defaults(fn=retrieve)
    stage = sub.add_parser("run")
    stage.add_argument("--model", default="smollm2-135m")
    stage.add_argument("--dataset", choices=RETRIEVAL_DATASETS, required=True)
    stage.add_argument("--questions", type=int, default=60)
    stage.add_argument("--threads", type=int, default=1)
    stage.add_argument("--max-new-tokens", type=int, default=16)
    stage.add_argument("--split", choices=("report", "calibration"), default="report")
    stage.add_argument("--shard", default="0/1", help="i/n: every n-th question from the i-th")
    stage.set_defaults(fn=run)
    stage = sub.add_parser("report")
    stage.add_argument(
        "--calibration",
        type=int,
        default=5,
        help="the first N questions of each set choose the rules' thresholds",
    )
    stage.set_defaults(fn=report)
    args = parser.parse_args()
    if args.stage == "run":
        args.model_dir = {
            "smollm2-135m": "SmolLM2-135M-Instruct",
            "qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B-Instruct",
        }.get(args.model, Path(args.model).name)
    args.fn(args)


if __name__ == "__main__":
    main()
