"""``engine.py ttft``: prefill TTFT and decode time per token, ours, transformers and vLLM-CPU."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from common import ChildWorker, machine, musique_prompts, parse_rule, summary, timed, write_results
from transformers import AutoModelForCausalLM

from adarag import AdaRAG
from adarag.config import RecomputeConfig
from adarag.engine.core import Engine
from adarag.engine.prefill_request import LearnedControls, PrefillRequest
from adarag.engine.routing import RoutingLadder
from adarag.evaluation.reuse import reuse_sources
from adarag.kv import ChunkKV
from adarag.pipeline.learned import learned_controls
from adarag.profiles import ModelProfile
from adarag.schema import PromptLayout
from runs.engine import OUTPUT
from runs.engine.vllm_workers import vllm_ttft_worker


@dataclass(frozen=True)
class Selections:
    """The fused variants' selections, by the suffix of their names (``""``: the configured one).

    Attributes:
        rules: The selection of each suffix (None: the configured selection).
        ladders: The routing ladder of each ``--ladder-rungs`` suffix.
        controls: The profile's learned controls (token scorer, packet) of each suffix with a
            selection.
    """

    rules: dict[str, RecomputeConfig | None]
    ladders: dict[str, RoutingLadder | None]
    controls: dict[str, LearnedControls]


def ours_decode(engine: Engine, layout, num_tokens: int) -> Callable[[], float]:  # type: ignore[no-untyped-def]
    """Seconds per greedy step of our runner after a prefill of ``layout``."""
    prefill = engine.prefill(PrefillRequest(layout, max_new_tokens=num_tokens + 1))

    def run() -> float:
        kv, token = prefill.kv, int(prefill.logits.argmax())
        kv.length = layout.num_tokens
        started = time.perf_counter()
        for _ in range(num_tokens):
            token = int(engine.runner.decode(token, kv).argmax())
        return (time.perf_counter() - started) / num_tokens

    return run


def hf_decode(hf_model, token_ids: torch.Tensor, num_tokens: int) -> Callable[[], float]:  # type: ignore[no-untyped-def]
    """Seconds per greedy step of transformers with its KV cache after the prompt."""

    def run() -> float:
        out = hf_model(token_ids, use_cache=True, logits_to_keep=1)
        past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        started = time.perf_counter()
        for _ in range(num_tokens):
            out = hf_model(token, past_key_values=past, use_cache=True)
            past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return (time.perf_counter() - started) / num_tokens

    return run


def ttft(args: argparse.Namespace) -> None:
    """The ``ttft`` subcommand."""
    rules, ladders = _rules(args)
    load_before = os.getloadavg()
    rag = AdaRAG(engine={"dtype": args.dtype, "model": args.model})
    engine = rag.engine
    profile = rag.profile
    if args.profile is not None:
        profile = ModelProfile.read(args.profile.parent, args.profile.name)
    controls = {
        rule: learned_controls(selection, profile)
        for rule, selection in rules.items()
        if selection is not None
    }
    hf_model = AutoModelForCausalLM.from_pretrained(
        engine.checkpoint.path, dtype=getattr(torch, args.dtype)
    ).eval()
    vllm = None
    if args.vllm:
        vllm_engine = {
            "backend": "vllm",
            "model": args.model,
            "dtype": args.dtype,
            "vllm_kv_cache_bytes": int(args.kv_cache_gib * 2**30),
        }
        # vLLM's TTFT of a full prefill and its seconds per decoding step (EOS ignored)
        vllm = ChildWorker(vllm_ttft_worker, vllm_engine, args.decode_tokens)
    selections = Selections(rules, ladders, controls)
    times, decode, num_tokens = _measure(args, rag, hf_model, vllm, selections)
    if vllm is not None:
        vllm.close()
    load_after = os.getloadavg()
    _report(args, engine, times, decode, num_tokens, (load_before, load_after))


def _rules(
    args: argparse.Namespace,
) -> tuple[dict[str, RecomputeConfig | None], dict[str, RoutingLadder | None]]:
    """The selection and routing ladder of each fused variant, by the suffix of its name."""
    rules: dict[str, RecomputeConfig | None] = {"": None}
    if args.rules or args.rule:
        rules = {}
        for spec in args.rules:
            policy, _, budget = spec.partition(":")
            rules[f" {spec}"] = RecomputeConfig(selection_policy=policy, budget=budget or "global")
        for text in args.rule:
            name, named = parse_rule(text)
            rules[f" {name}"] = named

    ladders: dict[str, RoutingLadder | None] = {"": None}
    if args.ladder_rungs:
        learned = RecomputeConfig(selection_policy="learned")
        rungs = tuple(args.ladder_rungs)
        rules[" ladder kept"] = learned
        ladders[" ladder kept"] = RoutingLadder.fixed(rungs, climb=False)
        for depth in range(1, len(rungs) + 1):
            name = f" ladder to {rungs[depth - 1]:g}"
            rules[name] = learned
            ladders[name] = RoutingLadder.fixed(rungs[:depth], climb=True)
    return rules, ladders


def _measure(
    args: argparse.Namespace,
    rag: AdaRAG,
    hf_model: torch.nn.Module,
    vllm: ChildWorker | None,
    selections: Selections,
) -> tuple[dict[str, list[float]], dict[str, list[float]], list[int]]:
    """Every variant's prefill seconds and every decoder's seconds per token, per question."""
    engine = rag.engine
    fused_names = [f"fused@{r}{rule}" for r in args.ratios for rule in selections.rules]
    times: dict[str, list[float]] = {"hf": [], "full": [], **{name: [] for name in fused_names}}
    decode: dict[str, list[float]] = {"hf": [], "ours": []}
    if vllm is not None:
        times["vllm_full"], decode["vllm"] = [], []
    num_tokens = []
    prompts = musique_prompts(rag, args.data_dir, args.questions, args.passages)
    for row, layout, system_kv, chunk_kvs in prompts:
        num_tokens.append(layout.num_tokens)
        token_ids = torch.tensor([layout.token_ids])
        variants = {
            "hf": lambda token_ids=token_ids: hf_model(token_ids, logits_to_keep=1).logits.argmax(),
            "full": lambda layout=layout: engine.prefill(PrefillRequest(layout)).logits.argmax(),
        }
        variants |= _fused_variants(engine, layout, system_kv, chunk_kvs, args.ratios, selections)
        decoders = {
            "ours": ours_decode(engine, layout, args.decode_tokens),
            "hf": hf_decode(hf_model, token_ids, args.decode_tokens),
        }
        with torch.inference_mode():
            variants["full"]()  # warm-up
            if vllm is not None:
                vllm(list(layout.token_ids))
            for _ in range(args.repeats):
                for name, run in variants.items():
                    times[name].append(timed(run)[0])
                if vllm is not None:
                    first, per_token = vllm(list(layout.token_ids))
                    times["vllm_full"].append(first)
                    decode["vllm"].append(per_token)
                for name, run in decoders.items():
                    decode[name].append(run())
        recent = {name: statistics.median(v[-args.repeats :]) for name, v in times.items()}
        print(
            f"{row['id']}: {layout.num_tokens} tokens, "
            + ", ".join(f"{name} {s:.2f} s" for name, s in recent.items() if "fused" not in name)
        )
    return times, decode, num_tokens


def _fused_variants(
    engine: Engine,
    layout: PromptLayout,
    system_kv: ChunkKV,
    chunk_kvs: list[ChunkKV],
    ratios: list[float],
    selections: Selections,
) -> dict[str, Callable[[], Any]]:
    """One fused prefill of ``layout`` per ratio and selection, named ``fused@<ratio><rule>``."""
    variants = {}
    for ratio in ratios:
        sources = reuse_sources(system_kv, chunk_kvs, ratio)
        for rule, selection in selections.rules.items():
            learned = selections.controls.get(rule, LearnedControls())
            # a rule carrying the packet prefills its prompt with the bridge, timed with it
            bridged = learned.bridged(layout, sources, engine.spec.vocab_size)
            ladder = selections.ladders.get(rule)
            variants[f"fused@{ratio}{rule}"] = functools.partial(
                _first_token, engine, bridged, sources, selection, learned, ladder
            )
    return variants


def _first_token(
    engine: Engine,
    layout: PromptLayout,
    sources: list,
    selection: RecomputeConfig | None,
    learned: LearnedControls,
    ladder: RoutingLadder | None,
) -> Any:
    """One fused prefill's first token."""
    controls = dataclasses.replace(learned, ladder=ladder)
    return engine.prefill(
        PrefillRequest(layout, sources, selection=selection, controls=controls)
    ).logits.argmax()


def _report(
    args: argparse.Namespace,
    engine: Engine,
    times: dict[str, list[float]],
    decode: dict[str, list[float]],
    num_tokens: list[int],
    load_average: tuple[tuple[float, float, float], tuple[float, float, float]],
) -> None:
    """``results/engine/<output>.{md,json}``: the prefill and decode tables, every time."""
    load_before, load_after = load_average
    stats = {name: summary(values) for name, values in times.items()}
    decode_stats = {name: summary(values) for name, values in decode.items()}
    full_mean = stats["full"]["mean"]
    info = machine()
    reference = "vllm_full" if "vllm_full" in stats else "full"
    lines = [
        f"Engine speed ({engine.checkpoint.name}, {args.dtype}), {len(num_tokens)} musique "
        "questions x "
        f"{args.passages} passages "
        f"(mean {statistics.fmean(num_tokens):.0f} tokens), {args.repeats} interleaved runs each"
        f"; selection: {', '.join(args.rules + args.rule) or 'the default'}.",
        f"Machine: {info['cpu']}, {info['cores']} cores, {info['torch_threads']} torch threads, "
        f"torch {torch.__version__}; load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after.",
        "",
        "| prefill variant | mean TTFT (s) | p50 (s) | p95 (s) | speed-up vs our full prefill "
        f"| speed-up vs {reference} |",
        "|---|---|---|---|---|---|",
    ]
    for name, stat in stats.items():
        lines.append(
            f"| {name} | {stat['mean']:.2f} | {stat['p50']:.2f} | {stat['p95']:.2f} | "
            f"{full_mean / stat['mean']:.2f}x | {stats[reference]['mean'] / stat['mean']:.2f}x |"
        )
    lines += [
        "",
        f"| decoder ({args.decode_tokens} greedy steps after the prompt) | ms per token | "
        "tokens/s | p95 ms |",
        "|---|---|---|---|",
    ]
    for name, stat in decode_stats.items():
        lines.append(
            f"| {name} | {1e3 * stat['mean']:.1f} | {1 / stat['mean']:.1f} | "
            f"{1e3 * stat['p95']:.1f} |"
        )
    table = "\n".join(lines)
    print(table)
    payload = {
        "machine": info,
        "args": {key: str(value) for key, value in vars(args).items()},
        "load_average": {"before": load_before, "after": load_after},
        "num_tokens": num_tokens,
        "times": times,
        "decode_s_per_token": decode,
        "stats": stats,
        "decode_stats": decode_stats,
    }
    write_results(args.output, payload, table, directory=OUTPUT)
