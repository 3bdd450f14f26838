"""``adarag calibrate --packet``: fit a model's packet tokens, written beside its profile."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from adarag.cli.calibrate_learned import profile_path, records_dir, write_profile
from adarag.cli.calibration_questions import questions_for
from adarag.config import AdaRagConfig
from adarag.errors import InputError
from adarag.evaluation.profiling.packet_fit import PacketShape, fit_packet
from adarag.pipeline import AdaRAG
from adarag.schema import GenerationParams

MIN_QUESTIONS = 20
"""Fewer calibration questions than this give a warning: the packet then fits them, not the task."""


def add_packet_arguments(parser: argparse.ArgumentParser) -> None:
    """The options only ``--packet`` reads."""
    group = parser.add_argument_group("--packet")
    group.add_argument(
        "--packet-variant",
        choices=("replace", "bridge", "trailer", "both"),
        default="replace",
        help="replace (the default: a bridge in place of the query template's opening tokens, "
        "at most --packet-tokens, starting as their embeddings, so the unfitted packet is the "
        "prompt as it was), bridge (packet tokens inserted between the context and the "
        "question, computed with the query), trailer (packet tokens ending every chunk, stored "
        "with its KV: re-warm after fitting one), or both (bridge and trailer)",
    )
    group.add_argument(
        "--packet-tokens", type=int, default=8, help="rows of each part (default: 8)"
    )
    group.add_argument(
        "--epochs", type=int, default=4, help="passes over the fitting questions (default: 4)"
    )
    group.add_argument(
        "--learning-rate",
        type=float,
        default=0.01,
        help="Adam's step relative to the bridge's starting RMS (default: 0.01)",
    )


def run_packet(args: argparse.Namespace, config: AdaRagConfig) -> int:
    """Fit the bridge on the calibration questions and write it with the profile."""
    if not 1 <= args.packet_tokens <= 64:
        raise InputError(f"--packet-tokens {args.packet_tokens}: use 1 to 64 rows")
    if args.epochs < 1:
        raise InputError(f"--epochs {args.epochs}: use at least one pass")
    questions = questions_for(args)  # checked before the model loads
    if config.engine.backend != "torch":
        raise InputError("--packet fits on adarag's torch engine; pass --backend torch")
    rag = AdaRAG(config.model_copy(update={"cache": _without_packet(config)}))
    output = profile_path(args, rag)
    if len(questions) < MIN_QUESTIONS:
        print(
            f"warning: {len(questions)} calibration questions; the packet wants at least "
            f"{MIN_QUESTIONS} (it fits the questions, not the task, below that)"
        )
    records = args.records or records_dir(rag, output) / f"packet-{args.packet_variant}"
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    rows = args.packet_tokens
    if args.packet_variant == "replace":
        opening = template_opening(rag, params)[:rows]
        shape = PacketShape(bridge=len(opening), trailer=0, replaces=opening)
    else:
        shape = PacketShape(
            bridge=rows if args.packet_variant in ("bridge", "both") else 0,
            trailer=rows if args.packet_variant in ("trailer", "both") else 0,
        )
    fitted = fit_packet(
        rag,
        questions,
        records,
        params,
        ratio=args.ratio,
        shape=shape,
        epochs=args.epochs,
        learning_rate=args.learning_rate,
    )
    record = fitted.record
    output.parent.mkdir(parents=True, exist_ok=True)
    (output.parent / record.file).write_bytes(fitted.data)
    profile = replace(rag.profile, packet=record, packet_bytes=fitted.data)
    write_profile(profile, output, rag)
    curve = " -> ".join(f"{x:.4f}" for x in record.loss_curve)
    print(
        f"packet: bridge {record.bridge_tokens} and trailer {record.trailer_tokens} tokens, "
        f"fitted on {record.num_questions} questions at ratio {record.ratio:g} in "
        f"{fitted.seconds / 60:.1f} min; mean KL to full recomputation (no packet, starting "
        f"rows, each pass): {curve}"
    )
    if record.trailer_tokens:
        print("the trailer is stored with each chunk: entries warmed before are computed again")
    if record.held_out_kl is not None:
        before, after = record.held_out_kl
        print(f"held out: mean KL {before:.4f} without the packet, {after:.4f} with it")
    print(f"packet file: {Path(output.parent / record.file)}")
    return 0


def template_opening(rag: AdaRAG, params: GenerationParams) -> tuple[int, ...]:
    """The ids every query suffix opens with before the question (the prompt template's).

    Raises:
        InputError: The template puts the question first (nothing for a bridge to replace).
    """
    first, second = (rag.layout(q, ["."], params).query_ids for q in ("x", "?"))
    length = next(
        (i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b),
        min(len(first), len(second)),
    )
    if length == 0:
        raise InputError(
            "the prompt template opens the query with the question itself: there are no "
            "template tokens for --packet-variant replace to stand in for; use bridge"
        )
    return tuple(first[:length])


def _without_packet(config: AdaRagConfig) -> object:
    """The cache settings with the profile's current packet off (the fit brings its own)."""
    recompute = config.cache.recompute.model_copy(update={"packet": "off"})
    return config.cache.model_copy(update={"recompute": recompute})
