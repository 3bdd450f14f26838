"""Fidelity: fused KV against full recomputation, by rule, lever, ratio and cache tier.

``run``: selection rules, levers and ratios against full recomputation. For each model and data
set, every question's prompt is prefilled in full (the reference) and fused from its chunks'
independent KV at each ratio under each rule (``random``, ``oracle`` and ``output_oracle`` are
controls), then decoded greedily. Every question's rows are appended to
``<rows>/<model>/<dataset><tag>.rows.jsonl`` as soon as it is measured, so a stopped run resumes
where it stopped (rows already there are not measured again) and several runs can share the
questions (``--shard i/n``). ``<rows>`` is ``--output``'s path under the benchmarks' cache
(``$ADARAG_BENCH_CACHE``, else ``~/.cache/adarag-bench``; ``--output`` itself when it lies
outside ``benchmarks/results``). The report, rebuilt from all rows each time (or alone with
``--report-only``): ``<output>/<model><tag>.md`` with 95% bootstrap intervals on every figure,
the paired gold-F1 difference against full recomputation, and each rule's paired difference in
exact agreement against ``--baseline``; beside the rows, ``<dataset><tag>.json`` (summaries) and
``<dataset><tag>_agreement.png``.

Rules are named selections; ``--rule name:key=value,...`` adds one (e.g.
``sinks:selection_policy=kv_deviation,chunk_start_tokens=4``; the learned selector, windows of 4
and the routing ladder at a target: ``learned:selection_policy=learned``,
``learned+w4:selection_policy=learned,span_tokens=4``,
``ladder0.85:selection_policy=learned,target_agreement=0.85``, read from ``--profile`` or the
model's own profile). ``--fused n`` reuses FusionRAG's
fused entries instead of the independent KV: each chunk computed after its ``n`` most similar
passages of the data set's knowledge base (BM25 with the chunk's text; 2Wiki's corpus, HotpotQA's
and MuSiQue's pooled passages), rows named ``<rule>+fused<n>``; ``--fusion-gate g`` keeps a
chunk's independent KV unless ``g`` of its neighbours are in the prompt
(``<rule>+fused<n>in<g>``).

``tables``: the tables of the fidelity results from the rows (``--rows``, default the cache's
``fidelity`` folder: ``<model>/`` the report split, ``calibration/<model>/`` the calibration
split): the lever ablation, the report split per data set, the levers against their rule;
printed as markdown, no model runs.

``tiers``: deviation from full prefill of KV taken from each cache tier, at several
recomputation ratios. For each musique question, prompt ``P = [c1..c6]``. Chunks 3-6 take their
KV from one tier at a time (chunks 1-2 are exact in every variant, so rows compare like with
like):

- hard: their KV from ``P`` itself (exact prefix);
- soft: ``c_i``'s KV from a real earlier prompt ``[c1, d, c_{i-1}, c_i]`` -- the same effective
  prefix (predecessor, and the sink chunk c1 of the model's profile) but another full prefix and
  other positions; the benchmark checks that the soft keys match;
- independent: ``c_i`` computed alone after the system prefix.

Reported over chunks 3-6's rows: relative L2 of K and of V over all layers, and KL(full || fused)
of the last-token logits.

    python benchmarks/fidelity.py run --model qwen2.5-coder-0.5b --questions 40 --offset 40
    python benchmarks/fidelity.py tables
    python benchmarks/fidelity.py tiers --questions 8
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from common import (
    DEFAULT_DATA_DIR,
    RESULTS,
    load_jsonl,
    machine,
    parse_rule,
    rows_dir,
    run_subcommand,
    write_results,
)

from adarag.config import DEFAULT_MODEL, FusionConfig, RecomputeConfig
from adarag.engine.provision import DEFAULT_PACKAGED_MODEL, PACKAGED_MODELS
from adarag.evaluation import corpora
from adarag.evaluation.fidelity import (
    FidelityRow,
    FidelitySummary,
    Target,
    append_rows,
    paired_rules,
    read_rows,
    smallest_ratio_meeting,
    summarize,
)
from adarag.evaluation.machine import describe_machine
from adarag.evaluation.plots import pyplot
from adarag.evaluation.workload import DATASETS, FIDELITY_CHUNKS, load_questions
from adarag.retrievers.chunking import passage_text
from adarag.retrievers.memory import MemoryRetriever
from adarag.schema import Chunk

RATIOS = (0.0, 0.1, 0.2, 0.3, 0.5, 1.0)
BUILT_IN_RULES: dict[str, dict[str, Any]] = {
    "cross_attention": {"selection_policy": "cross_attention"},
    "kv_deviation": {"selection_policy": "kv_deviation"},
    "query_attention": {"selection_policy": "query_attention"},
    "random": {"selection_policy": "random"},
    "oracle": {"selection_policy": "oracle"},
    "output_oracle": {"selection_policy": "output_oracle"},
}
MODELS = ("Qwen2.5-Coder-0.5B-Instruct", "SmolLM2-135M-Instruct")
TABLE_RATIOS = (0.1, 0.2, 0.3)
PAIRS = (  # (lever, the rule it is measured against), on the questions both ran
    ("qdev+fused5", "qdev"),
    ("qdev+fused5in1", "qdev"),
    ("query_deviation+fused5", "query_deviation"),
)
EXTRA_RATIOS = (0.0, 0.3, 0.5)  # besides the configured α and β


def run(args: argparse.Namespace) -> None:
    """The ``run`` subcommand: measure the missing rows, then the report from every row."""
    rules = {name: RecomputeConfig(**BUILT_IN_RULES[name]) for name in args.rules}
    rules |= dict(parse_rule(text) for text in args.rule)
    model = model_name(args.model)
    rows = rows_dir(args.output) / model
    if not args.report_only:
        _measure(args, rules, rows)
    _report(args, model, rows)


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default")
    parser.add_argument("--dataset", nargs="+", default=list(DATASETS), choices=DATASETS)
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--offset", type=int, default=40, help="skip this many questions")
    parser.add_argument("--shard", default="0/1", help="i/n: every n-th question from the i-th")
    parser.add_argument("--ratios", type=float, nargs="+", default=list(RATIOS))
    parser.add_argument("--rules", nargs="*", default=["kv_deviation"])
    parser.add_argument("--rule", action="append", default=[], help="name:key=value,...")
    parser.add_argument(
        "--baseline", default="kv_deviation", help="rule the others are paired with"
    )
    parser.add_argument(
        "--rule-ratios",
        action="append",
        default=[],
        metavar="NAME=R1,R2",
        help="measure rule NAME at these of --ratios only (e.g. ladder0.85=0.2)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--output", type=Path, default=RESULTS / "fidelity")
    parser.add_argument("--tag", default="", help="suffix of the output names")
    parser.add_argument(
        "--fused",
        type=int,
        metavar="N",
        help="reuse fused entries (each chunk after its N most similar passages)",
    )
    parser.add_argument(
        "--fusion-gate",
        type=int,
        default=0,
        metavar="G",
        help="with --fused: a chunk reuses its fused entry only when G of its neighbours are "
        "in the prompt (rows named <rule>+fused<N>in<G>)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="a model profile JSON whose learned selector and routing ladder the 'learned' and "
        "target_agreement rules read (default: the model's own profile)",
    )
    parser.add_argument("--report-only", action="store_true", help="rebuild the report from rows")
    parser.add_argument(
        "--storage",
        nargs="+",
        default=["float32"],
        choices=["float32", "float16", "bfloat16", "int8"],
        help="storage formats the reused KV passes through (rules named <rule>@<format>)",
    )
    parser.set_defaults(fn=run)


def model_name(model: str) -> str:
    """The checkpoint's directory name, without loading it (the report needs no model)."""
    name = DEFAULT_PACKAGED_MODEL if model == DEFAULT_MODEL else model
    packaged = PACKAGED_MODELS.get(name)
    return packaged.directory if packaged is not None else Path(name).name


def _measure(args: argparse.Namespace, rules: dict[str, RecomputeConfig], out: Path) -> None:
    """Every missing row of every question, appended to ``out/<dataset><tag>.rows.jsonl``."""
    from adarag import AdaRAG
    from adarag.evaluation.fidelity import FidelityRun
    from adarag.profiles import ModelProfile
    from adarag.schema import GenerationParams

    engine: dict[str, Any] = {"model": args.model}
    if args.threads:
        engine["num_threads"] = args.threads
    rag = AdaRAG(engine=engine)
    model = rag.engine.checkpoint.name
    assert model == out.name, f"model {model} writes under {out}"
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    fusion = None
    if args.fused:
        fusion = FusionConfig(num_neighbors=args.fused, min_neighbors_in_prompt=args.fusion_gate)
    index, count = (int(part) for part in args.shard.split("/"))
    profile = None
    if args.profile is not None:
        profile = ModelProfile.from_json(args.profile.read_text(), str(args.profile))
    for dataset in args.dataset:
        knowledge_base = _knowledge_base(dataset, args.data_dir) if args.fused else None
        run = FidelityRun(
            rag, rules, args.ratios, params, args.storage, knowledge_base, fusion, profile
        )
        only = _rule_ratios(args.rule_ratios)
        skipped = {
            (run.rule_name(rule, storage), ratio)
            for storage in args.storage
            for rule, ratios in only.items()
            for ratio in run.ratios
            if ratio not in ratios
        }
        names = [run.rule_name(rule, storage) for storage in args.storage for rule in rules]
        wanted = {(name, ratio) for name in names for ratio in run.ratios} - skipped
        path = out / f"{dataset}{args.tag}.rows.jsonl"
        questions = load_questions(
            dataset, args.data_dir, args.questions, FIDELITY_CHUNKS[dataset], args.offset
        )
        started = time.perf_counter()
        measured: dict[str, set[tuple[str, float]]] = {}
        for row in read_rows(path):  # read once; this run's own rows are added as it goes
            measured.setdefault(row.qid, set()).add((row.rule, row.ratio))
        for number, item in enumerate(questions):
            if number % count != index:
                continue
            done = measured.get(item.qid, set()) | skipped
            if wanted <= done:
                continue
            append_rows(path, run.question(dataset, item, done))
            print(
                f"{model} {dataset} #{args.offset + number} ({time.perf_counter() - started:.0f} s)"
            )


def _rule_ratios(specs: list[str]) -> dict[str, set[float]]:
    """``NAME=R1,R2`` specs as rule name -> the ratios it is measured at."""
    out = {}
    for spec in specs:
        name, _, ratios = spec.partition("=")
        out[name] = {float(ratio) for ratio in ratios.split(",") if ratio}
    return out


def _knowledge_base(dataset: str, data_dir: Path) -> MemoryRetriever:
    """Where fused entries find their neighbours, passages written as prompts hold them."""
    if dataset.startswith("2wikimqa"):
        return MemoryRetriever(corpora.corpus_chunks("2wikimqa", data_dir))
    texts = {
        passage_text(passage["text"], passage.get("title"))
        for row in corpora.questions(dataset, data_dir)
        for passage in row["passages"]
    }
    return MemoryRetriever([Chunk(text) for text in sorted(texts)])


def _report(args: argparse.Namespace, model: str, out: Path) -> None:
    """``<model><tag>.md``: the pooled table, the paired differences, one table per data set.

    Each data set's summaries (``<dataset><tag>.json``) and plot go beside its rows in ``out``.
    """
    measured_on = machine()
    sections, pooled = [], []
    for dataset in args.dataset:
        stem = out / f"{dataset}{args.tag}"
        rows = read_rows(stem.with_suffix(".rows.jsonl"))
        if not rows:
            continue
        pooled += rows
        count = len({row.qid for row in rows})
        title = (
            f"{model}, {dataset}: {count} questions from #{args.offset}, "
            f"{FIDELITY_CHUNKS[dataset]} chunks, {args.max_new_tokens} new tokens (greedy)"
        )
        summaries = summarize(rows)
        payload = {
            "title": title,
            "machine": measured_on,
            "summaries": [asdict(s) for s in summaries],
        }
        write_results(stem.name, payload, None, directory=out)
        _plot(summaries, title, stem.with_name(stem.name + "_agreement.png"))
        sections.append(_section(title, summaries, model))
    if not pooled:
        return
    count = len({(row.dataset, row.qid) for row in pooled})
    title = f"{model}, {len(sections)} data sets pooled ({count} questions)"
    parts = [_section(title, summarize(pooled), model), _paired(pooled, args.baseline), *sections]
    header = [
        f"# Fidelity: {model}",
        "",
        describe_machine(measured_on),
        "",
        "Every figure is a mean over questions with its 95% bootstrap interval in brackets. "
        "'gold F1 - full' is the paired difference against full recomputation of the same "
        "prompts. Exact agreement compares the whole greedy answer (up to the new-token budget) "
        "with full recomputation's.",
        "",
    ]
    write_results(f"{model}{args.tag}", None, "\n".join(header + parts), directory=args.output)


def _paired(rows: list[FidelityRow], baseline: str) -> str:
    """Each rule against ``baseline`` at each ratio: paired differences in exact agreement."""
    rules = list(dict.fromkeys(row.rule for row in rows))
    ratios = sorted({row.ratio for row in rows if 0.0 < row.ratio < 1.0})
    lines = [
        f"## Paired against {baseline} (exact agreement, points; 95% interval; p)",
        "",
        "| rule | " + " | ".join(f"{ratio:.2f}" for ratio in ratios) + " |",
        "|---|" + "---|" * len(ratios),
    ]
    for rule in rules:
        if rule == baseline:
            continue
        cells = []
        for ratio in ratios:
            found = paired_rules(rows, rule, baseline, ratio, "exact_agreement")
            cells.append("-" if found is None else f"{found} p={found.p_value:.2f}")
        lines.append(f"| {rule} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _section(title: str, summaries: list[FidelitySummary], model: str) -> str:
    target = Target(min_first_token_agreement=90.0) if "SmolLM2" in model else Target()
    lines = [
        f"## {title}",
        "",
        "| rule | ratio | recomputed | n | exact agree % | first-token agree % | first-token KL "
        "| gold F1 | gold F1 - full | TTFT s (full) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {s.rule} | {s.ratio:.2f} | {100 * s.recomputed_share:.0f}% | {s.num_questions} "
            f"| {s.exact_interval} | {s.first_token_interval} | {s.first_token_kl:.3f} "
            f"| {s.gold_f1_interval} | {s.gold_f1_vs_full} "
            f"| {s.ttft_s:.2f} ({s.full_ttft_s:.2f}) |"
        )
    lines += ["", f"Smallest ratio meeting the target ({_describe(target)}):", ""]
    for rule in dict.fromkeys(s.rule for s in summaries):
        hit = smallest_ratio_meeting(summaries, rule, target)
        if hit is None:
            lines.append(f"- {rule}: none of the ratios")
        else:
            speedup = hit.full_ttft_s / hit.ttft_s
            lines.append(f"- {rule}: {hit.ratio:.2f} (TTFT {hit.ttft_s:.2f} s, {speedup:.2f}x)")
    return "\n".join(lines) + "\n"


def _describe(target: Target) -> str:
    if target.min_first_token_agreement is not None:
        return f"first-token agreement >= {target.min_first_token_agreement:.0f}%"
    return (
        f"exact agreement >= {target.min_exact_agreement:.0f}% and gold F1 >= "
        f"{100 * target.min_gold_f1_share:.0f}% of full recomputation's"
    )


def _plot(summaries: list[FidelitySummary], title: str, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    panels = (
        ("exact agreement with full (%)", "exact_agreement"),
        ("first-token KL", "first_token_kl"),
    )
    for axis, (label, field) in zip(axes, panels, strict=True):
        for rule in dict.fromkeys(s.rule for s in summaries):
            points = sorted((s.ratio, getattr(s, field)) for s in summaries if s.rule == rule)
            style = ":" if "oracle" in rule or rule == "random" else "-"
            axis.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", label=rule)
        axis.set_xlabel("recomputed share of each chunk")
        axis.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rows_under(folder: Path) -> list[FidelityRow]:
    """Every row of every data set under ``folder``."""
    return [row for path in sorted(folder.glob("*.rows.jsonl")) for row in read_rows(path)]


def common_questions(rows: list[FidelityRow], rules: list[str]) -> list[FidelityRow]:
    """The rows of the questions every rule in ``rules`` was measured on (paired tables)."""
    keys = [{(r.dataset, r.qid) for r in rows if r.rule == rule} for rule in rules]
    shared = set.intersection(*keys) if keys else set()
    return [r for r in rows if (r.dataset, r.qid) in shared]


def by_dataset(rows: list[FidelityRow]) -> Iterator[tuple[str, list[FidelityRow]]]:
    """Each data set's rows, in order of appearance, then all of them as ``pooled``."""
    for dataset in dict.fromkeys(row.dataset for row in rows):
        yield dataset, [r for r in rows if r.dataset == dataset]
    yield "pooled", rows


def ablation(model: str, rows: list[FidelityRow]) -> str:
    """Exact agreement [95% interval] per rule and ratio, pooled over the common questions."""
    rules = list(dict.fromkeys(row.rule for row in rows))
    rows = common_questions(rows, rules)
    summaries = {(s.rule, s.ratio): s for s in summarize(rows)}
    lines = [
        f"| {model} | n | "
        + " | ".join(f"exact agree @{r}" for r in TABLE_RATIOS)
        + " | KL @0.2 |",
        "|---|---|" + "---|" * (len(TABLE_RATIOS) + 1),
    ]
    for rule in rules:
        cells = [
            str(summaries[(rule, r)].exact_interval) if (rule, r) in summaries else "-"
            for r in TABLE_RATIOS
        ]
        at = summaries.get((rule, 0.2))
        count = at.num_questions if at else 0
        kl = f"{at.first_token_kl:.3f}" if at else "-"
        lines.append(f"| {rule} | {count} | " + " | ".join(cells) + f" | {kl} |")
    return "\n".join(lines)


def report_table(model: str, rows: list[FidelityRow]) -> str:
    """Per data set at 0.2: exact and first-token agreement, gold F1 against full."""
    lines = [
        f"| {model} | rule | n | exact agree | first-token agree | gold F1 (full) "
        "| gold F1 - full | paired vs kv_deviation |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for dataset, subset in by_dataset(rows):
        for s in summarize(subset):
            if s.ratio != 0.2:
                continue
            paired = paired_rules(subset, s.rule, "kv_deviation", 0.2, "exact_agreement")
            versus = "-" if s.rule == "kv_deviation" or paired is None else str(paired)
            lines.append(
                f"| {dataset} | {s.rule} | {s.num_questions} | {s.exact_interval} "
                f"| {s.first_token_interval} | {s.gold_f1:.1f} ({s.reference_gold_f1:.1f}) "
                f"| {s.gold_f1_vs_full} | {versus} |"
            )
    return "\n".join(lines)


def paired_table(model: str, rows: list[FidelityRow]) -> str:
    """Each lever of :data:`PAIRS` against its rule, per data set and pooled, per ratio."""
    lines = [
        f"| {model} | lever vs rule | ratio | n | exact agree: lever / rule | paired "
        "| first-token agree: lever / rule | gold F1: lever / rule (full) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for lever, rule in PAIRS:
        both = [r for r in common_questions(rows, [lever, rule]) if r.rule in (lever, rule)]
        for dataset, subset in by_dataset(both):
            summaries = {(s.rule, s.ratio): s for s in summarize(subset)}
            for ratio in TABLE_RATIOS:
                new, old = summaries.get((lever, ratio)), summaries.get((rule, ratio))
                if new is None or old is None:
                    continue
                versus = paired_rules(subset, lever, rule, ratio, "exact_agreement")
                lines.append(
                    f"| {dataset} | {lever} vs {rule} | {ratio} | {new.num_questions} "
                    f"| {new.exact_interval} / {old.exact_agreement:.0f} | {versus} "
                    f"| {new.first_token_agreement:.0f} / {old.first_token_agreement:.0f} "
                    f"| {new.gold_f1:.1f} / {old.gold_f1:.1f} ({new.reference_gold_f1:.1f}) |"
                )
    return "\n".join(lines) if len(lines) > 2 else ""


def tables(args: argparse.Namespace) -> None:
    """The ``tables`` subcommand: print the tables of the rows under ``--rows``."""
    for model in MODELS:
        calibration = rows_under(args.rows / "calibration" / model)
        if calibration:
            print(f"### Calibration, {model}\n\n{ablation(model, calibration)}\n")
        held_out = rows_under(args.rows / model)
        if held_out:
            print(f"### Report split, {model}\n\n{report_table(model, held_out)}\n")
        for split, rows in (("calibration", calibration), ("report split", held_out)):
            if table := paired_table(model, rows):
                print(f"### Levers against their rule, {split}, {model}\n\n{table}\n")


def kl_divergence(reference: torch.Tensor, other: torch.Tensor) -> float:
    """KL(reference || other) of two logit vectors, in nats."""
    log_p, log_q = torch.log_softmax(reference, -1), torch.log_softmax(other, -1)
    return float((log_p.exp() * (log_p - log_q)).sum())


def tiers(args: argparse.Namespace) -> None:
    """The ``tiers`` subcommand: each tier's deviation from full prefill, per ratio."""
    from adarag import AdaRAG
    from adarag.engine.batch import SegmentSource

    rag = AdaRAG()
    engine, cache = rag.engine, rag.cache
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
        chunks = [p["text"] for p in row["passages"][:6]]
        distractor = rows[(q_idx + 1) % len(rows)]["passages"][7]["text"]
        layout = rag.prompts.layout(row["question"], chunks)
        cu = layout.cu_segments
        full = engine.prefill(layout)
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
            soft[i] = engine.prefill(earlier).kv.segment(ecu[4], ecu[5])
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
                fused = engine.prefill(layout, sources)
                dk = (fused.kv.k[:, rows_slice] - full.kv.k[:, rows_slice]).norm()
                dv = (fused.kv.v[:, rows_slice] - full.kv.v[:, rows_slice]).norm()
                rel_k = float(dk / full.kv.k[:, rows_slice].norm())
                rel_v = float(dv / full.kv.v[:, rows_slice].norm())
                results[tier][ratio].append(
                    (rel_k, rel_v, kl_divergence(full.logits, fused.logits))
                )
        print(f"{row['id']} done")

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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_arguments(sub.add_parser("run", help="rules, levers and ratios against full"))
    command = sub.add_parser("tables", help="the fidelity tables, from the rows")
    command.add_argument("--rows", type=Path, default=rows_dir(RESULTS / "fidelity"))
    command.set_defaults(fn=tables)
    command = sub.add_parser("tiers", help="each cache tier's deviation from full prefill")
    command.add_argument("--questions", type=int, default=8)
    command.add_argument("--data-dir", type=Path)
    command.set_defaults(fn=tiers)
    run_subcommand(parser)


if __name__ == "__main__":
    main()
