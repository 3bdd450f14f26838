"""``augmentation_cost.py step-cache``: each step's first token with and without the step cache."""

from __future__ import annotations

import argparse
import json

from common import CACHE, machine, write_results

from adarag.evaluation.machine import describe_machine
from adarag.schema import Chunk
from runs.augmentation_cost import OUTPUT
from runs.augmentation_cost.steps import steps
from runs.depth.run import hard_tier_pipeline
from runs.depth.splits import MAX_K

STEP_CACHE_VARIANTS = {
    "float32 store (exact)": ("float32", False),
    "bfloat16 store, new cache per step": ("bfloat16", False),
    "bfloat16 store, previous step's cache": ("bfloat16", True),
}


def step_cache(args: argparse.Namespace) -> None:
    """The ``step-cache`` subcommand: first tokens against a float32 store's."""
    items = [json.loads(line) for line in (CACHE / "hotpotqa.retrieved.jsonl").open()]
    items = items[args.offset : args.offset + args.questions]
    rags = {
        name: hard_tier_pipeline(args.model, 2, dtype, reuse_step_kv=reuse)
        for name, (dtype, reuse) in STEP_CACHE_VARIANTS.items()
    }
    logits: dict[str, list] = {name: [] for name in rags}
    for item in items:
        chunks = [Chunk(c["text"], c["id"], c["score"]) for c in item["chunks"][:MAX_K]]
        for name, rag in rags.items():
            logits[name] += [row[2] for row in steps(rag, item["question"], chunks)]
    exact = logits["float32 store (exact)"]
    lines = [
        f"# First tokens with and without the step cache, {args.model}",
        "",
        f"`python benchmarks/augmentation_cost.py step-cache --model {args.model}`. "
        f"{describe_machine(machine())} {len(items)} HotpotQA questions x {MAX_K} steps.",
        "",
        "| variant | first token equal to the exact one | max logit difference |",
        "|---|---|---|",
    ]
    rows = {}
    for name, values in logits.items():
        same = sum(int(a.argmax() == b.argmax()) for a, b in zip(values, exact, strict=True))
        diff = max(float((a - b).abs().max()) for a, b in zip(values, exact, strict=True))
        rows[name] = {"same_first_token": same, "steps": len(exact), "max_logit_diff": diff}
        lines.append(f"| {name} | {same}/{len(exact)} | {diff:.3g} |")
    payload = {"machine": machine(), "model": args.model, "variants": rows}
    write_results(f"step_cache_agreement_{args.model}", payload, "\n".join(lines), directory=OUTPUT)
    print("\n".join(lines))
