"""``adarag calibrate``: fit λ, τ and the normalisers of the augmentation confidence."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import asdict
from pathlib import Path

from adarag.augment.agreement import AgreementFit, fit_agreement
from adarag.augment.calibrate import CalibrationFit, fit
from adarag.augment.confidence import ConfidenceParams, LensConfidence
from adarag.augment.step_cost import StepCostModel
from adarag.cli.calibrate_gain import add_gain_arguments, run_gain
from adarag.cli.calibrate_learned import profile_path, run_depth, run_selector, write_profile
from adarag.cli.calibrate_packet import add_packet_arguments, run_packet
from adarag.cli.calibration_questions import read_question_files
from adarag.cli.options import add_model_arguments, build_config, positive_int
from adarag.data import demo_corpus, demo_questions
from adarag.errors import InputError
from adarag.evaluation.plots import plot_reliability, plot_tradeoff
from adarag.evaluation.profiling.calibration import (
    ValidationQuestion,
    agreement_evidence,
    load_records,
    record_questions,
    step_cost_model,
)
from adarag.evaluation.profiling.ladder_fit import TARGETS
from adarag.evaluation.workload import DATASETS, DEFAULT_DATA_DIR
from adarag.pipeline import AdaRAG
from adarag.profiles.model_profile import AgreementCalibration, Calibration
from adarag.retrievers import MemoryRetriever
from adarag.schema import GenerationParams

HELP = (
    "fit a model's calibration: the augmentation confidence (default), the learned selector and "
    "routing ladder (--selector), the depth probe (--depth) and the gain rule's τ (--depth "
    "--gain-records), or the packet tokens (--packet)"
)
MIN_AGREEMENT_QUESTIONS = 20
"""Fewer questions than this give a warning: the agreement rule's τ is then noisy."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the command's options."""
    _add_learned_arguments(parser)
    add_gain_arguments(parser)
    add_packet_arguments(parser)
    _add_confidence_arguments(parser)
    _add_record_arguments(parser)
    add_model_arguments(parser)


def _add_learned_arguments(parser: argparse.ArgumentParser) -> None:
    """``--selector`` and ``--depth``, and the options only they read."""
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--selector",
        action="store_true",
        help="fit the learned selector (selection_policy='learned') on the output-aware "
        "oracle's labels, and the routing ladder (cache.recompute.target_agreement)",
    )
    mode.add_argument(
        "--depth",
        action="store_true",
        help="fit the depth probe (augment.stop_rule='probe') on each step's answer",
    )
    mode.add_argument(
        "--packet",
        action="store_true",
        help="fit the packet's bridge (cache.recompute.packet) by KL self-distillation from "
        "full recomputation's answers, at --ratio",
    )
    learned = parser.add_argument_group("--selector, --depth and --packet")
    learned.add_argument(
        "--dataset",
        nargs="+",
        choices=DATASETS,
        help="benchmark data sets read from --data-dir (default: the bundled calibration "
        "questions)",
    )
    learned.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help="where the QA data sets' dev files are (default: $ADARAG_DATA_DIR, else ./data)",
    )
    learned.add_argument(
        "--shard",
        default="0/1",
        help="i/n: record every n-th question from the i-th (n runs share the work); the fit "
        "runs once every question is recorded",
    )
    learned.add_argument(
        "--ratio",
        type=float,
        default=0.2,
        help="--selector: the oracle's ratio learned; --packet: the reused chunks' ratio the "
        "packet is fitted at (default: 0.2, the independent tier's)",
    )
    learned.add_argument(
        "--kind",
        choices=("logistic", "mlp"),
        default="logistic",
        help="the selector fitted: logistic regression or one hidden layer (default: logistic)",
    )
    learned.add_argument(
        "--target-agreement",
        type=float,
        nargs="+",
        default=list(TARGETS),
        help="target agreements with full recomputation the ladder's thresholds are fitted for",
    )
    ladder = learned.add_mutually_exclusive_group()
    ladder.add_argument("--no-ladder", action="store_true", help="fit the selector only")
    ladder.add_argument(
        "--ladder-only",
        action="store_true",
        help="fit the routing ladder alone, climbing the questions with the profile's fitted "
        "selector (no oracle labels); pass questions it was not fitted on, "
        "e.g. --offset past them",
    )
    learned.add_argument(
        "--probe-features",
        choices=("hidden", "signals", "all"),
        default="all",
        help="--depth: what the probe reads: the residual stream, the step's signals, or both",
    )


def _add_confidence_arguments(parser: argparse.ArgumentParser) -> None:
    """The augmentation confidence's options, and those every mode reads."""
    parser.add_argument(
        "--data",
        type=Path,
        nargs="*",
        default=[],
        help="JSONL files of {question, answers, passages} (e.g. musique_dev.jsonl), each "
        "question's chunks the top --chunks of its own passages; with --selector, --depth or "
        "--packet each file is a data set (default: the bundled questions)",
    )
    parser.add_argument("--offset", type=int, default=0, help="skip this many questions per file")
    parser.add_argument(
        "--questions",
        type=positive_int,
        help="questions per file or data set (default: 20; --selector: every bundled one, or "
        "30 per --dataset)",
    )
    parser.add_argument("--chunks", type=int, default=6, help="k, chunks retrieved per question")
    parser.add_argument(
        "--cost-weight", type=float, default=0.3, help="objective: quality - w * cost ratio"
    )
    parser.add_argument(
        "--risk",
        type=float,
        default=0.05,
        help="ε of the agreement stop rule: tolerated share of early stops whose answer differs "
        "from the static top-k answer",
    )
    parser.add_argument(
        "--min-chunks", type=int, default=2, help="floor of the agreement stop rule"
    )
    parser.add_argument(
        "--max-cost-share",
        type=float,
        default=0.9,
        help="keep τ only if, under it, the held-out questions' steps are predicted to take at "
        "most this share of static top-k's prefill time (a fitted fixed + per-token cost per "
        "step); else the rule costs more than it saves and augmentation stays static",
    )


def _add_record_arguments(parser: argparse.ArgumentParser) -> None:
    """Where records and the profile go, and what is compared."""
    parser.add_argument(
        "--records",
        type=Path,
        help="the augmentation confidence: refit from the *.calibration-records.json of an "
        "earlier run instead of running the model over --data; --selector and --depth: the "
        "directory their labels and chains are kept in between runs (default: under the home)",
    )
    parser.add_argument(
        "--agreement-only",
        action="store_true",
        help="keep the profile's confidence constants (λ, τ, normalisers) and fit only the "
        "agreement rule over them",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=positive_int,
        help="answer tokens compared (default: 24; 16 with --selector)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="profile JSON to write (default: <home>/profiles/<fingerprint>.json, which this "
        "home then reads instead of the packaged profile)",
    )
    parser.add_argument("--plot", type=Path, help="trade-off curve PNG (default: beside it)")


def run(args: argparse.Namespace) -> int:
    """Record every step of each question, fit, save into the model profile, plot."""
    config = build_config(args)
    if args.gain_records is not None and not args.depth:
        raise InputError("--gain-records fits the gain stop rule: pass it with --depth")
    if args.selector or args.depth or args.packet:
        args.max_new_tokens = args.max_new_tokens or 16
        if args.packet:
            return run_packet(args, config)
        if args.gain_records is not None:
            return run_gain(args, config)
        return (run_selector if args.selector else run_depth)(args, config)
    args.max_new_tokens = args.max_new_tokens or 24
    questions = None  # read (and checked) before the model loads
    if args.records is None:
        questions = _questions(args.data, args.offset, args.questions or 20, args.chunks)
    rag = AdaRAG(config)
    output = profile_path(args, rag)
    if questions is None:
        recorded = load_records(args.records)
    else:
        params = GenerationParams(max_new_tokens=args.max_new_tokens)
        recorded = record_questions(rag, questions, params)
    if len(recorded) < MIN_AGREEMENT_QUESTIONS:
        print(
            f"warning: {len(recorded)} calibration questions; the agreement rule wants at least "
            f"{MIN_AGREEMENT_QUESTIONS} (its threshold is noisy below that)"
        )
    result = fit([item.record for item in recorded], args.cost_weight)
    confidence = (
        dataclasses.replace(rag.profile.calibration, agreement=None)
        if args.agreement_only
        else Calibration(
            threshold=round(result.chosen.threshold, 4),
            kl_weight=round(result.chosen.kl_weight, 4),
            kl_scale=round(result.kl_scale, 6),
            entropy_scale=round(result.entropy_scale, 6),
        )
    )
    params_fit = ConfidenceParams(
        confidence.kl_weight, confidence.kl_scale, confidence.entropy_scale
    )
    costs = step_cost_model(recorded)
    evidence = agreement_evidence(recorded, LensConfidence(params_fit), costs)
    agreement = fit_agreement(
        evidence, args.risk, args.min_chunks, max_cost_share=args.max_cost_share
    )
    calibration = dataclasses.replace(confidence, agreement=_stored(agreement))
    write_profile(rag.profile.with_calibration(calibration), output, rag)
    records_path = output.with_name(output.stem + ".calibration-records.json")
    records_path.write_text(json.dumps([asdict(item) for item in recorded]) + "\n")
    plot = plot_tradeoff(result, args.plot or output.with_name(output.stem + ".tradeoff.png"))
    reliability = plot_reliability(
        evidence, agreement.model, output.with_name(output.stem + ".reliability.png")
    )
    _report(result, recorded, calibration, output, plot)
    _report_agreement(args, confidence, costs, agreement, reliability)
    return 0


def _stored(agreement: AgreementFit) -> AgreementCalibration:
    """The fitted agreement rule as the profile keeps it."""
    probability = agreement.model.probability
    return AgreementCalibration(
        agreement.model.feature,
        probability.x,
        probability.y,
        agreement.threshold,
        agreement.risk,
        agreement.min_steps,
        agreement.held_out_risk,
        None if agreement.cost_share is None else round(agreement.cost_share, 4),
    )


def _report_agreement(
    args: argparse.Namespace,
    confidence: Calibration,
    costs: StepCostModel,
    agreement: AgreementFit,
    reliability: Path,
) -> None:
    """What the agreement rule fitted, and what it costs."""
    if args.agreement_only:
        print(
            f"--agreement-only: kept the profile's λ={confidence.kl_weight} "
            f"τ={confidence.threshold}"
        )
    print(
        f"step cost: {costs.fixed_s:.3f} s per prefill + {1e3 * costs.per_token_s:.3f} ms per token"
    )
    print(
        f"agreement rule (ε={agreement.risk:.2f}, min {agreement.min_steps} chunks): "
        f"τ={agreement.threshold}, risk on the fitting half {agreement.fit_risk:.3f}, held out "
        f"{agreement.held_out_risk} with {100 * agreement.held_out_early_share:.0f}% stopping "
        f"early, taking {_share(agreement.cost_share)} of static top-k's prefill time "
        f"(kept when <= {args.max_cost_share}); reliability plot: {reliability}"
    )


def _share(share: float | None) -> str:
    return "-" if share is None else f"{share:.2f}"


def _report(
    result: CalibrationFit, recorded: list, calibration: Calibration, output: Path, plot: Path
) -> None:
    chosen = result.chosen
    depth = int(round(chosen.mean_chunks))
    gold_static = sum(item.gold_f1[-1] for item in recorded) / len(recorded)
    print(
        f"calibrated on {len(recorded)} questions: confidence = λ·KL + (1-λ)·entropy scores with "
        f"λ={calibration.kl_weight}, τ={calibration.threshold}, KL scale "
        f"{calibration.kl_scale:.3f}, entropy scale {calibration.entropy_scale:.3f}"
    )
    print(
        f"chosen λ={chosen.kl_weight:.2f} τ={chosen.threshold:.2f}: mean depth "
        f"{chosen.mean_chunks:.2f} chunks (~{depth}), agreement with the full answer "
        f"{chosen.quality:.3f}, cost {chosen.cost:.2f} of static top-k"
    )
    print(f"gold F1 of static top-k (fused, all chunks): {100 * gold_static:.1f}")
    print(f"trade-off curve: {plot}")


def _questions(
    files: list[Path], offset: int, count: int, num_chunks: int
) -> list[ValidationQuestion]:
    """Top-k chunks per question by BM25 over its own passages (or the bundled corpus)."""
    if not files:
        retriever = MemoryRetriever(demo_corpus())
        return [
            ValidationQuestion(
                str(record["question"]),
                tuple(c.text for c in retriever.retrieve(str(record["question"]), num_chunks)),
                tuple(record["answers"]),  # type: ignore[arg-type]
            )
            for record in demo_questions()[offset : offset + count]
        ]
    return [
        ValidationQuestion(item.question, item.chunks, item.answers)
        for _, item in read_question_files(files, offset, count, num_chunks)
    ]
