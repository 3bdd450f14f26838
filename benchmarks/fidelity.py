"""Fidelity: fused KV against full recomputation, by rule, lever, ratio and cache tier.

``run``: selection rules, levers and ratios against full recomputation. For each model and data
set, every question's prompt is prefilled in full (the reference) and fused from its chunks'
independent KV at each ratio under each rule (``random``, ``oracle`` and ``output_oracle`` are
controls), then decoded greedily. Every question's rows are appended to
``<rows>/<model>/<dataset><tag>.rows.jsonl`` as soon as it is measured, so a stopped run resumes
where it stopped (rows already there are not measured again) and several runs can share the
questions (``--shard i/n``). ``<rows>`` is ``--output``'s path under the benchmarks' cache
(``$ADARAG_BENCH_CACHE``, else ``~/.cache/adarag-bench``; ``--output`` itself when it lies
outside ``benchmarks/results``); each run that measures a row also appends its machine, its
load at the start and the count of rows already there to ``sittings<tag>.jsonl`` beside them,
which the report's machine line names. The report, rebuilt from all rows each time (or alone with
``--report-only``): ``<output>/<model><tag>.md`` with 95% bootstrap intervals on every figure,
the paired gold-F1 difference against full recomputation, and each rule's paired difference in
exact agreement against ``--baseline``; beside the rows, ``<dataset><tag>.json`` (summaries) and
``<dataset><tag>_agreement.png``. Each table lists the smallest ratio at which each rule meets a
target: ``--target-exact PCT`` (exact agreement and 97% of full's gold F1) or
``--target-first-token PCT``; by default first-token agreement >= 90% for SmolLM2, exact
agreement >= 85% for any other model. A rule whose packet has a trailer reuses entries closed by
it.

Rules are named selections; ``--rule name:key=value,...`` adds one (e.g.
``sinks:selection_policy=kv_deviation,chunk_start_tokens=4``; the learned selector, windows of 4
and the routing ladder at a target: ``learned:selection_policy=learned``,
``learned+w4:selection_policy=learned,span_tokens=4``,
``ladder0.85:selection_policy=learned,target_agreement=0.85``, read from ``--profile`` or the
model's own profile). ``--fused n`` reuses FusionRAG's
fused entries instead of the independent KV: each chunk computed after its ``n`` most similar
passages of the data set's knowledge base (BM25 with the chunk's text; 2Wiki's corpus, HotpotQA's
and MuSiQue's pooled passages), rows named ``<rule>+fused<n>``; ``--fusion-gate g`` keeps a
chunk's independent KV unless ``g`` of its neighbours are in the prompt
(``<rule>+fused<n>in<g>``).

``tables``: the tables of the fidelity results from the rows (``--rows``, default the cache's
``fidelity`` folder: ``<model>/`` the report split, ``calibration/<model>/`` the calibration
split): the lever ablation, the report split per data set, the levers against their rule;
printed as markdown, no model runs.

``tiers``: deviation from full prefill of KV taken from each cache tier, at several
recomputation ratios. For each musique question, prompt ``P = [c1..c6]``. Chunks 3-6 take their
KV from one tier at a time (chunks 1-2 are exact in every variant, so rows compare like with
like):

- hard: their KV from ``P`` itself (exact prefix);
- soft: ``c_i``'s KV from a real earlier prompt ``[c1, d, c_{i-1}, c_i]`` -- the same effective
  prefix (predecessor, and the sink chunk c1 of the model's profile) but another full prefix and
  other positions; the benchmark checks that the soft keys match;
- independent: ``c_i`` computed alone after the system prefix.

Reported over chunks 3-6's rows: relative L2 of K and of V over all layers, and KL(full || fused)
of the last-token logits.

    python benchmarks/fidelity.py run --model qwen2.5-coder-0.5b --questions 40 --offset 40
    python benchmarks/fidelity.py tables
    python benchmarks/fidelity.py tiers --questions 8
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import DEFAULT_DATA_DIR, RESULTS, rows_dir, run_subcommand
from runs.fidelity.run import RATIOS, run
from runs.fidelity.tables import tables
from runs.fidelity.tiers import tiers

from adarag.evaluation.workload import DATASETS


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default")
    parser.add_argument("--dataset", nargs="+", default=list(DATASETS), choices=DATASETS)
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--offset", type=int, default=40, help="skip this many questions")
    parser.add_argument("--shard", default="0/1", help="i/n: every n-th question from the i-th")
    parser.add_argument("--ratios", type=float, nargs="+", default=list(RATIOS))
    parser.add_argument("--rules", nargs="*", default=["kv_deviation"])
    parser.add_argument("--rule", action="append", default=[], help="name:key=value,...")
    parser.add_argument(
        "--baseline", default="kv_deviation", help="rule the others are paired with"
    )
    parser.add_argument(
        "--rule-ratios",
        action="append",
        default=[],
        metavar="NAME=R1,R2",
        help="measure rule NAME at these of --ratios only (e.g. ladder0.85=0.2)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--output", type=Path, default=RESULTS / "fidelity")
    parser.add_argument("--tag", default="", help="suffix of the output names")
    parser.add_argument(
        "--fused",
        type=int,
        metavar="N",
        help="reuse fused entries (each chunk after its N most similar passages)",
    )
    parser.add_argument(
        "--fusion-gate",
        type=int,
        default=0,
        metavar="G",
        help="with --fused: a chunk reuses its fused entry only when G of its neighbours are "
        "in the prompt (rows named <rule>+fused<N>in<G>)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="a model profile JSON whose learned selector, routing ladder and packet the "
        "'learned', target_agreement and packet rules read (default: the model's own profile)",
    )
    parser.add_argument("--report-only", action="store_true", help="rebuild the report from rows")
    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "--target-exact",
        type=float,
        metavar="PCT",
        help="the report's target: exact agreement >= PCT%% and gold F1 >= 97%% of full's "
        "(default 85; SmolLM2's default is first-token agreement >= 90%%)",
    )
    target.add_argument(
        "--target-first-token",
        type=float,
        metavar="PCT",
        help="the report's target: first-token agreement >= PCT%%",
    )
    parser.add_argument(
        "--storage",
        nargs="+",
        default=["float32"],
        choices=["float32", "float16", "bfloat16", "int8"],
        help="storage formats the reused KV passes through (rules named <rule>@<format>)",
    )
    parser.set_defaults(fn=run)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_arguments(sub.add_parser("run", help="rules, levers and ratios against full"))
    command = sub.add_parser("tables", help="the fidelity tables, from the rows")
    command.add_argument("--rows", type=Path, default=rows_dir(RESULTS / "fidelity"))
    command.set_defaults(fn=tables)
    command = sub.add_parser("tiers", help="each cache tier's deviation from full prefill")
    command.add_argument("--questions", type=int, default=8)
    command.add_argument("--data-dir", type=Path)
    command.set_defaults(fn=tiers)
    run_subcommand(parser)


if __name__ == "__main__":
    main()
