"""``selection.py routing``: each question's entropy over the reused KV, and the routing report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import RESULTS, pipeline_for, write_results

from adarag.engine.prefill_request import PrefillRequest
from adarag.evaluation.fidelity import FidelityRow, summarize
from adarag.evaluation.intervals import paired_difference
from adarag.evaluation.reuse import independent_chunks, reuse_sources
from runs.fidelity.rows import by_dataset, model_name
from runs.selection.routing_split import (
    GRID,
    SPLITS,
    Split,
    folder,
    load_split,
    read_entropies,
    routed_name,
    split_questions,
)


def routing(args: argparse.Namespace) -> None:
    """The ``routing`` subcommand: measure missing entropies (``--measure``), then the report."""
    model = model_name(args.model)
    if args.measure:
        _measure_entropies(args, model)
    _report_routing(args, model)


def _measure_entropies(args: argparse.Namespace, model: str) -> None:
    from adarag.kernels import lens_signals_from_logits
    from adarag.schema import GenerationParams

    rag = pipeline_for(args.model, args.threads)
    engine = rag.engine
    params = GenerationParams(max_new_tokens=16)
    for split in args.split:
        done = read_entropies(split, model)
        for dataset in args.dataset:
            path = folder(split, model) / f"{dataset}.entropy.jsonl"
            for item in split_questions(args, split, model, dataset):
                if (dataset, item.qid) in done:
                    continue
                layout = rag.layout(item.question, item.chunks, params)
                system_kv, chunk_kvs = independent_chunks(engine, layout)
                reused = engine.prefill(
                    PrefillRequest(layout, reuse_sources(system_kv, chunk_kvs, 0.0))
                )
                entropy = float(lens_signals_from_logits(reused.logits[None])[1])
                record = {"dataset": dataset, "qid": item.qid, "entropy": entropy}
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a") as handle:
                    handle.write(json.dumps(record) + "\n")
                print(f"{model} {split} {dataset} {item.qid}: {entropy:.3f}")


def _report_routing(args: argparse.Namespace, model: str) -> None:
    """``results/fidelity/<output>_<model>.md``: the threshold, calibration and report tables."""
    splits = {split: load_split(args, split, model) for split in SPLITS}
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
