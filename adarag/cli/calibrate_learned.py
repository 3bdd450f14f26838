"""``adarag calibrate --selector`` and ``--depth``: a model's learned controllers."""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import tempfile
from pathlib import Path

from adarag.cli.calibration_questions import questions_for
from adarag.config import AdaRagConfig
from adarag.errors import InputError
from adarag.evaluation.profiling.depth_calibration import ProbeCalibration, calibrate_probe
from adarag.evaluation.profiling.depth_probe import (
    exact_steps,
    has_depth_record,
    load_depth_records,
    probe_layers,
    record_depth,
    save_depth_record,
)
from adarag.evaluation.profiling.selector_calibration import (
    MIN_QUESTIONS,
    SelectorCalibration,
    calibrate_ladder,
    calibrate_selector,
)
from adarag.evaluation.workload import BenchQuestion
from adarag.pipeline import AdaRAG
from adarag.profiles import ModelProfile
from adarag.profiles.gain import GainCalibration
from adarag.profiles.learned import LadderCalibration
from adarag.schema import Chunk, GenerationParams

logger = logging.getLogger(__name__)


def profile_path(args: argparse.Namespace, rag: AdaRAG) -> Path:
    """``--output``, else the home's profile of the model (read instead of the packaged one)."""
    home_profile = rag.config.home / "profiles" / f"{rag.engine.fingerprint}.json"
    return args.output or home_profile


def run_selector(args: argparse.Namespace, config: AdaRagConfig) -> int:
    """Fit the selector (and ladder) and write the profile; 0 when done or this shard done."""
    questions = questions_for(args)  # checked before the model loads
    rag = AdaRAG(config)
    output = profile_path(args, rag)
    if len(questions) < MIN_QUESTIONS:
        print(
            f"warning: {len(questions)} calibration questions; the selector and ladder want at "
            f"least {MIN_QUESTIONS} (their thresholds are noisy below that)"
        )
    records = args.records or records_dir(rag, output)
    shard = _shard(args.shard)
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    if args.ladder_only:
        return _run_ladder(args, rag, questions, output, records, shard, params)
    result = calibrate_selector(
        rag,
        questions,
        records,
        params,
        shard=shard,
        ratio=args.ratio,
        kind=args.kind,
        targets=tuple(args.target_agreement),
        ladder=not args.no_ladder,
    )
    if result is None:
        _print_shard_done(shard, records)
        return 0
    profile = rag.profile.with_learned(selector=result.selector, ladder=result.ladder)
    write_profile(profile, output, rag)
    print_selector_report(result, output, records)
    return 0


def _run_ladder(
    args: argparse.Namespace,
    rag: AdaRAG,
    questions: list[tuple[str, BenchQuestion]],
    output: Path,
    records: Path,
    shard: tuple[int, int],
    params: GenerationParams,
) -> int:
    """``--ladder-only``: climb with the profile's selector, fit the ladder, keep the selector.

    Raises:
        InputError: The model's profile has no fitted selector to climb with.
    """
    selector = rag.profile.selector
    if selector is None:
        raise InputError(
            f"--ladder-only: the profile of {rag.profile.model} has no fitted selector; run "
            "`adarag calibrate --selector` without --ladder-only to fit both"
        )
    fitted = calibrate_ladder(
        rag, questions, selector, records, params, shard=shard, targets=tuple(args.target_agreement)
    )
    if fitted is None:
        _print_shard_done(shard, records)
        return 0
    ladder, shape_costs = fitted
    write_profile(rag.profile.with_learned(ladder=ladder), output, rag)
    print(f"routing ladder climbed on {len(questions)} questions with the profile's selector")
    print_ladder_report(ladder, shape_costs)
    return 0


def _print_shard_done(shard: tuple[int, int], records: Path) -> None:
    print(
        f"shard {shard[0]}/{shard[1]} recorded under {records}; run without --shard (or "
        "with each other shard) to fit once every question is recorded"
    )


def write_profile(profile: ModelProfile, output: Path, rag: AdaRAG) -> None:
    """Write ``profile`` to ``output``, saying which profile it stands in for."""
    output.parent.mkdir(parents=True, exist_ok=True)
    existed = output.exists()
    output.write_text(profile.to_json() + "\n")
    home_profile = rag.config.home / "profiles" / f"{rag.engine.fingerprint}.json"
    if output.resolve() == home_profile.resolve():
        print(
            f"profile written to {output} ({'replaced' if existed else 'new'}); this home now "
            f"reads it for {profile.model} instead of the packaged profile: delete it to go back"
        )
    else:
        print(f"profile written to {output}")


def print_selector_report(result: SelectorCalibration, output: Path, records: Path) -> None:
    """A readable summary of the fit."""
    print(
        f"learned selector: {len(result.selector.features)} features, "
        f"{'one hidden layer' if result.selector.hidden_weights else 'logistic'}, fitted on "
        f"{result.num_questions} questions to the output-aware oracle's set at ratio "
        f"{result.ratio:g} (records: {records})"
    )
    print("held out (each fold fitted without it): share of the oracle's set chosen at its budget")
    print("  fold                n   learned  query_deviation   oracle gain: learned / qdev")
    for fold in result.folds:
        print(
            f"  {fold.fold:<16} {fold.num_questions:>4}   {fold.recall:6.1%}   "
            f"{fold.baseline_recall:13.1%}        {fold.gain_share:6.1%} / "
            f"{fold.baseline_gain_share:6.1%}"
        )
    if result.ladder is not None:
        print_ladder_report(result.ladder, result.shape_costs)


def print_ladder_report(
    ladder: LadderCalibration, shape_costs: tuple[tuple[str, float, float], ...]
) -> None:
    """The ladder's shapes and the thresholds kept per target agreement."""
    print("routing ladder shapes (held out at target 0.85: exact agreement, cost vs full):")
    for shape, agreement, cost in shape_costs:
        print(f"  {shape:<22} {agreement:6.1%}   {cost:5.2f}")
    rungs = " -> ".join(f"{r:g}" for r in (ladder.base_ratio, *ladder.rungs))
    print(f"kept: {rungs}; set cache.recompute.target_agreement to one of:")
    for target, thresholds, (agreement, cost) in zip(
        ladder.targets, ladder.thresholds, ladder.held_out, strict=True
    ):
        shown = ", ".join(f"{t:.3f}" for t in thresholds)
        print(
            f"  {target:.2f}: climb below P = {shown}; held out {agreement:.1%} exact agreement "
            f"at {cost:.2f} of full recomputation's tokens"
        )


def records_dir(rag: AdaRAG, output: Path) -> Path:
    """The home's folder of the records a calibration of ``output`` keeps between runs."""
    digest = hashlib.sha256(str(output.resolve()).encode()).hexdigest()[:8]
    return rag.config.home / "calibration" / f"{rag.engine.fingerprint}-{digest}"


def _shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError as err:
        raise InputError(f"--shard {text!r}: expected i/n, e.g. 0/2") from err
    if not 0 <= index < count:
        raise InputError(f"--shard {text!r}: need 0 <= i < n")
    return index, count


DEPTH_K = 10
"""Chunks retrieved per bundled calibration question (the depths a probe learns over).

Above the default ``retrieval.top_k`` of 6 with room to spare; the two deepest steps of 12, the
longest prompts, would take a fifth of the run.
"""


def run_depth(
    args: argparse.Namespace, config: AdaRagConfig, gain: GainCalibration | None = None
) -> int:
    """Record every step of the calibration questions, fit the depth probe, write the profile.

    ``gain`` (the gain rule fitted from ``--gain-records``) is written with the probe.
    """
    shard = _shard(args.shard)
    if args.dataset and args.records is None:
        raise InputError(
            "--depth --dataset fits on depth records: pass --records with the directory "
            "`python benchmarks/depth.py run --split calibration` wrote them to"
        )
    rag = AdaRAG(exact_steps(config))
    output = profile_path(args, rag)
    depth_records = args.records or records_dir(rag, output) / "depth"
    if not args.dataset:
        complete = _record_bundled_depth(rag, depth_records, args, shard)
        if not complete:
            print(
                f"shard {shard[0]}/{shard[1]} recorded under {depth_records}; run without --shard "
                "(or with each other shard) to fit once every question is recorded"
            )
            return 0
    records = load_depth_records(depth_records, args.dataset)
    if not records:
        raise InputError(
            f"{depth_records}: no depth records; record them with `python benchmarks/"
            "depth.py run --split calibration` or run `adarag calibrate --depth` without "
            "--dataset (the bundled questions)"
        )
    if len(records) < MIN_QUESTIONS:
        print(
            f"warning: {len(records)} calibration questions; the depth probe wants at least "
            f"{MIN_QUESTIONS} (its threshold is noisy below that)"
        )
    result = calibrate_probe(records, args.probe_features)
    profile = rag.profile.with_learned(depth_probe=result.probe)
    if gain is not None:
        profile = profile.with_learned(gain=gain)
    write_profile(profile, output, rag)
    print_depth_report(result, depth_records)
    return 0


def _record_bundled_depth(
    rag: AdaRAG, records_dir: Path, args: argparse.Namespace, shard: tuple[int, int]
) -> bool:
    """Record the bundled questions over a Chroma base of all their chunks; all recorded?"""
    from adarag.config import RetrievalConfig
    from adarag.retrievers import KnowledgeBase

    questions = questions_for(args)
    pool = list(dict.fromkeys(chunk for _, item in questions for chunk in item.chunks))
    layers = probe_layers(rag.engine.spec.num_layers)
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    index, count = shard
    todo = [
        (number, dataset, item)
        for number, (dataset, item) in enumerate(questions)
        if number % count == index and not has_depth_record(records_dir, dataset, item.qid)
    ]
    if todo:  # else nothing to embed
        # each process embeds the pool into a Chroma of its own (a Chroma directory is one
        # process's), so shards run side by side
        with (
            tempfile.TemporaryDirectory(prefix="adarag-depth-") as chroma,
            KnowledgeBase(
                RetrievalConfig(collection="calibration", chroma_directory=Path(chroma))
            ) as kb,
        ):
            kb.add_chunks([Chunk(text) for text in pool], source="calibration")
            for number, dataset, item in todo:
                chunks = kb.retrieve(item.question, DEPTH_K)
                record, _ = record_depth(
                    rag, dataset, item.qid, item.question, chunks, item.answers, params, layers
                )
                save_depth_record(records_dir, record)
                logger.info(
                    "recorded depth of %s %s (%d/%d)", dataset, item.qid, number + 1, len(questions)
                )
    return all(has_depth_record(records_dir, d, item.qid) for d, item in questions)


def print_depth_report(result: ProbeCalibration, records_dir: Path) -> None:
    """A readable summary of the probe's fit."""
    probe = result.probe
    print(
        f"depth probe: {len(probe.model.features)} features (residual stream after layers "
        f"{', '.join(map(str, probe.layers))}, lens signals, retrieval scores), fitted on "
        f"{result.num_questions} questions (records: {records_dir})"
    )
    print("AUROC of 'no later depth answers better', each question's fold held out:")
    for family, value in result.family_auroc:
        print(f"  {family:<8} " + ("- (one class)" if math.isnan(value) else f"{value:.3f}"))
    chosen = result.chosen
    print(
        f"stop rule: P >= {probe.threshold:.2f} from {probe.min_steps} chunk(s), L2 "
        f"{result.penalty:g}; held out: gold F1 {chosen.f1:.1f} at {chosen.depth:.2f} chunks "
        f"({chosen.tokens:.0f} prompt tokens), "
        f"{chosen.gain:+.1f} against fixed top-k at the same tokens (the oracle depth: "
        f"{result.oracle.gain:+.1f})"
    )
    for fold, count, outcome in result.per_fold:
        print(
            f"  {fold:<16} {count:>4} questions: {outcome.gain:+.1f} F1 at {outcome.depth:.2f} "
            "chunks"
        )
    print("turn it on with augment.stop_rule = 'probe'")
