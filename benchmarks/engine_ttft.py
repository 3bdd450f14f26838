"""TTFT of adarag's engine: full prefill vs HF transformers, and fused prefill at several ratios.

On musique passages (6 per question, ~3.7K tokens), with the real model. Each chunk's independent
KV is precomputed (untimed, as the ingest path does); the system prefix KV is an exact hit. All
variants of one question run back to back, interleaved, so machine noise hits them alike.

    python benchmarks/engine_ttft.py --questions 5
    python benchmarks/engine_ttft.py --questions 2 --rules cross_attention:per_chunk \
        kv_deviation:global --output engine_ttft_rules

``--rules`` times the fused variants under each ``selection_policy:budget`` (default: the
configured selection).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from common import load_jsonl, machine, summary, timed, write_results
from transformers import AutoModelForCausalLM

from adarag import AdaRAG
from adarag.config import RecomputeConfig
from adarag.evaluation.reuse import independent_chunks, reuse_sources

RATIOS = (0.0, 0.05, 0.15, 0.3, 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=5)
    parser.add_argument("--passages", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per variant")
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--rules", nargs="+", default=[], help="selection_policy:budget ...")
    parser.add_argument("--output", default="engine_ttft", help="results/<output>.{md,json}")
    args = parser.parse_args()
    rules: dict[str, RecomputeConfig | None] = {"": None}
    if args.rules:
        rules = {}
        for spec in args.rules:
            policy, _, budget = spec.partition(":")
            rules[f" {spec}"] = RecomputeConfig(selection_policy=policy, budget=budget or "global")

    rag = AdaRAG()
    generator = rag.generator
    hf_model = AutoModelForCausalLM.from_pretrained(generator.checkpoint.path, dtype=torch.float32)
    hf_model.eval()
    rows = load_jsonl("musique_dev.jsonl", args.data_dir, args.questions)
    fused_names = [f"fused@{r}{rule}" for r in RATIOS for rule in rules]
    times: dict[str, list[float]] = {"hf": [], "full": [], **{name: [] for name in fused_names}}
    num_tokens = []
    for row in rows:
        passages = [p["text"] for p in row["passages"][: args.passages]]
        layout = rag.prompts.layout(row["question"], passages)
        num_tokens.append(layout.num_tokens)
        system_kv, chunk_kvs = independent_chunks(generator, layout)
        token_ids = torch.tensor([layout.token_ids])
        variants = {
            "hf": lambda token_ids=token_ids: hf_model(token_ids).logits[0, -1].argmax(),
            "full": lambda layout=layout: generator.prefill(layout).logits.argmax(),
        }
        for ratio in RATIOS:
            sources = reuse_sources(system_kv, chunk_kvs, ratio)
            for rule, selection in rules.items():
                variants[f"fused@{ratio}{rule}"] = (
                    lambda layout=layout, sources=sources, selection=selection: generator.prefill(
                        layout, sources, selection=selection
                    ).logits.argmax()
                )
        with torch.inference_mode():
            variants["full"]()  # warm-up
            for _ in range(args.repeats):
                for name, run in variants.items():
                    times[name].append(timed(run)[0])
        recent_full = statistics.median(times["full"][-args.repeats :])
        print(f"{row['id']}: {layout.num_tokens} tokens, full {recent_full:.2f} s")

    stats = {name: summary(values) for name, values in times.items()}
    full_mean = stats["full"]["mean"]
    lines = [
        f"Engine TTFT, {len(rows)} musique questions x {args.passages} passages "
        f"(mean {statistics.fmean(num_tokens):.0f} tokens), {args.repeats} interleaved runs each"
        f"; selection: {', '.join(args.rules) or 'the default'}.",
        f"Machine: {machine()['cpu']}, {machine()['cores']} cores, torch {torch.__version__}.",
        "",
        "| variant | mean TTFT (s) | p50 (s) | p95 (s) | speed-up vs our full prefill |",
        "|---|---|---|---|---|",
    ]
    for name, stat in stats.items():
        lines.append(
            f"| {name} | {stat['mean']:.2f} | {stat['p50']:.2f} | {stat['p95']:.2f} | "
            f"{full_mean / stat['mean']:.2f}x |"
        )
    table = "\n".join(lines)
    print(table)
    write_results(
        args.output,
        {"machine": machine(), "num_tokens": num_tokens, "times": times, "stats": stats},
        table,
    )


if __name__ == "__main__":
    main()
