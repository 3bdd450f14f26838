"""First tokens of every augmentation step with and without the previous step's KV cache.

With the default bfloat16 store a hard hit loaded from the store is rounded, while the rows the
previous step's cache keeps are not. Each step's logits (8 HotpotQA questions x 12 steps, as
``step_cost.py`` runs them) are compared with the exact ones of a float32 store.

    python benchmarks/step_cache_agreement.py --model qwen2.5-coder-0.5b
"""

from __future__ import annotations

import argparse
import json

from common import write_results
from depth import CACHE, MAX_K, hard_tier_pipeline
from step_cost import steps

from adarag.evaluation.machine import describe_machine, machine
from adarag.schema import Chunk

VARIANTS = {
    "float32 store (exact)": ("float32", False),
    "bfloat16 store, new cache per step": ("bfloat16", False),
    "bfloat16 store, previous step's cache": ("bfloat16", True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--offset", type=int, default=45, help="questions the depth run left out")
    args = parser.parse_args()
    items = [json.loads(line) for line in (CACHE / "hotpotqa.retrieved.jsonl").open()]
    items = items[args.offset : args.offset + args.questions]
    rags = {
        name: hard_tier_pipeline(args.model, 2, dtype, reuse_step_kv=reuse)
        for name, (dtype, reuse) in VARIANTS.items()
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
        f"`python benchmarks/step_cache_agreement.py --model {args.model}`. "
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
    write_results(f"step_cache_agreement_{args.model}", payload, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
