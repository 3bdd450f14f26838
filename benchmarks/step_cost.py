"""What one augmentation step costs, with and without prefilling into the previous step's KV.

Each question's 12 steps (its top-12 chunks from ``depth.py retrieve``: step k finds
chunks 1..k-1 in the hard tier, computes chunk k and the question) run twice in one process,
``augment.reuse_step_kv`` off and on, in alternating order. A step's time is its whole wall time:
tier lookup, fused prefill, lens check and write-back. The fit ``fixed + per_token x processed``
over all steps gives the per-step fixed cost of each variant; the logits of the two are checked
to be equal (float32 store: the rows left in place are the ones the hard tier would load).

    python benchmarks/step_cost.py --model qwen2.5-coder-0.5b --questions 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from common import machine, write_results
from depth import CACHE, MAX_K, hard_tier_pipeline

from adarag import AdaRAG
from adarag.augment.step_cost import StepCostModel
from adarag.evaluation.machine import describe_machine
from adarag.schema import Chunk, GenerationParams

VARIANTS = {"new cache per step": False, "previous step's cache": True}


def steps(rag: AdaRAG, question: str, chunks: list[Chunk]) -> list[tuple[int, float, torch.Tensor]]:
    """(processed tokens, seconds, logits) of every step of one question."""
    layout = rag.layout(question, chunks, GenerationParams(max_new_tokens=16))
    out = []
    started = time.perf_counter()
    for step in rag.augmentation.prefill_steps(layout, 16):  # each yielded after its write-back
        out.append(
            (step.result.num_processed_tokens, time.perf_counter() - started, step.output.logits)
        )
        started = time.perf_counter()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dataset", default="hotpotqa")
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--offset", type=int, default=45, help="questions the depth run left out")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--storage-dtype",
        default="bfloat16",
        help="the store's format (bfloat16, the default: a hard hit loaded from the store is "
        "rounded, the rows left in place are not; float32: both variants compute the same)",
    )
    args = parser.parse_args()
    items = [json.loads(line) for line in (CACHE / f"{args.dataset}.retrieved.jsonl").open()]
    items = items[args.offset : args.offset + args.questions]
    rags = {
        name: hard_tier_pipeline(args.model, args.threads, args.storage_dtype, reuse_step_kv=reuse)
        for name, reuse in VARIANTS.items()
    }
    for rag in rags.values():
        steps(rag, "warm-up?", [Chunk("A short passage."), Chunk("Another one.")])
    timed: dict[str, list[tuple[int, float]]] = {name: [] for name in rags}
    max_diff = 0.0
    for index, item in enumerate(items):
        chunks = [Chunk(c["text"], c["id"], c["score"]) for c in item["chunks"][:MAX_K]]
        order = list(rags) if index % 2 == 0 else list(reversed(rags))
        logits = {}
        for name in order:
            result = steps(rags[name], item["question"], chunks)
            timed[name] += [(tokens, seconds) for tokens, seconds, _ in result]
            logits[name] = [row[2] for row in result]
        for a, b in zip(*logits.values(), strict=True):
            max_diff = max(max_diff, float((a - b).abs().max()))
        print(
            f"[{index}] "
            + "  ".join(
                f"{name}: {sum(s for _, s in timed[name][-MAX_K:]):.2f} s" for name in rags
            ),
            flush=True,
        )
    fits = {
        name: StepCostModel.fit([t for t, _ in rows], [s for _, s in rows])
        for name, rows in timed.items()
    }
    model = Path(rags["new cache per step"].config.engine.model).name
    lines = [
        f"# Augmentation step cost, {model}",
        "",
        f"`python benchmarks/step_cost.py --model {args.model} --questions {args.questions} "
        f"--threads {args.threads} --storage-dtype {args.storage_dtype}`. "
        f"{describe_machine(machine())} {len(items)} {args.dataset} questions x "
        f"{MAX_K} steps per variant, in one process, alternating. Largest logit difference "
        f"between the variants: {max_diff:.2e}.",
        "",
        "| variant | fixed s per step | ms per processed token | mean step s | 12 steps s |",
        "|---|---|---|---|---|",
    ]
    for name, rows in timed.items():
        seconds = [s for _, s in rows]
        lines.append(
            f"| {name} | {fits[name].fixed_s:.3f} | {1e3 * fits[name].per_token_s:.3f} | "
            f"{statistics.fmean(seconds):.3f} | {MAX_K * statistics.fmean(seconds):.2f} |"
        )
    payload = {
        "machine": machine(),
        "storage_dtype": args.storage_dtype,
        "model": model,
        "questions": len(items),
        "max_logit_diff": max_diff,
        "fits": {n: {"fixed_s": f.fixed_s, "per_token_s": f.per_token_s} for n, f in fits.items()},
        "steps": timed,
    }
    write_results(f"step_cost_{model}_{args.storage_dtype}", payload, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
