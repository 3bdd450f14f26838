"""What adaptive augmentation costs: the confidence check, and one step with and without reuse.

``confidence``: the augmentation confidence check against the prefill of the same step. Each
question's top-6 passages (BM25 among its own, as ``adarag bench`` ranks them) have their
independent KV precomputed (as ingest does); then the pipeline answers with adaptive augmentation,
so every step is a real one: earlier chunks from the hard tier, the new one from the independent
tier. The prefill projects the last l layers' hidden states through the LM head in the GEMM that
yields the decoding logits, so the check costs

- the extra rows of that GEMM: the head over l rows minus over one row, timed on the real model's
  hidden states (median of many runs; the same for every step), plus
- the reduction to KL and entropy (``StepTrace.confidence_s``, timed in every step).

For comparison, the separate logit-lens pass over the hidden states (what a check costs when the
prefill does not provide the logits) is timed too.

``steps``: what one augmentation step costs, with and without prefilling into the previous step's
KV. Each question's 12 steps (its top-12 chunks from ``depth.py retrieve``: step k finds chunks
1..k-1 in the hard tier, computes chunk k and the question) run twice in one process,
``experimental.augment.reuse_step_kv`` off and on, in alternating order. A step's time is its
whole wall time: tier lookup, fused prefill, lens check and write-back. The fit ``fixed +
per_token x processed`` over all steps gives the per-step fixed cost of each variant; the
logits of the two are checked to be equal (float32 store: the rows left in place are the ones
the hard tier would load).

``step-cache``: first tokens of every augmentation step with and without the previous step's KV
cache. With the default bfloat16 store a hard hit loaded from the store is rounded, while the rows
the previous step's cache keeps are not. Each step's logits (8 HotpotQA questions x 12 steps, as
``steps`` runs them) are compared with the exact ones of a float32 store.

    python benchmarks/augmentation_cost.py confidence --questions 20
    python benchmarks/augmentation_cost.py steps --model qwen2.5-coder-0.5b --questions 8
    python benchmarks/augmentation_cost.py step-cache --model qwen2.5-coder-0.5b
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import DEFAULT_DATA_DIR, run_subcommand
from runs.augmentation_cost.confidence import confidence
from runs.augmentation_cost.step_cache import step_cache
from runs.augmentation_cost.steps import step_cost


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    command = sub.add_parser("confidence", help="the confidence check against its step's prefill")
    command.add_argument("--questions", type=int, default=20)
    command.add_argument("--dataset", nargs="+", default=["musique", "hotpotqa"])
    command.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    command.set_defaults(fn=confidence)
    command = sub.add_parser("steps", help="a step's cost with and without the step cache")
    command.add_argument("--model", default="smollm2-135m")
    command.add_argument("--dataset", default="hotpotqa")
    command.add_argument("--questions", type=int, default=8)
    command.add_argument("--offset", type=int, default=45, help="questions the depth run left out")
    command.add_argument("--threads", type=int, default=2)
    command.add_argument(
        "--storage-dtype",
        default="bfloat16",
        help="the store's format (bfloat16, the default: a hard hit loaded from the store is "
        "rounded, the rows left in place are not; float32: both variants compute the same)",
    )
    command.set_defaults(fn=step_cost)
    command = sub.add_parser("step-cache", help="first tokens with and without the step cache")
    command.add_argument("--model", default="smollm2-135m")
    command.add_argument("--questions", type=int, default=8)
    command.add_argument("--offset", type=int, default=45, help="questions the depth run left out")
    command.set_defaults(fn=step_cache)
    run_subcommand(parser)


if __name__ == "__main__":
    main()
