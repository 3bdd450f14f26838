"""Which tokens or requests to recompute: a screen of selection signals, and uncertainty routing.

``signals``: which signal could close the gap to the output-aware oracle? A cheap screen of
selection scores. The fidelity benchmark decodes every rule for real, which costs minutes per
question on the quality model. This screen asks a cheaper question of many candidate scores at
once: with the positions a score picks at each ratio made exact (the full prefill's K/V in every
layer, the rest as cached), does the model still predict full recomputation's answer? For each
question it runs the full prefill (its greedy answer is the reference), the reused prefill
(ratio 0), and then, per score and ratio, one teacher-forced pass of the query and the reference
answer over the mixed context (``AnswerLoss``). A row holds the answer's loss, whether every
answer token stays the argmax ("answer kept", a proxy for exact agreement) and whether the first
one does.

Exact K/V stand in for recomputation (what a recomputed token would get if its context were
exact), so the screen ranks scores and does not replace the fidelity benchmark. The
``output_oracle`` is left out: it optimizes this very loss, so it scores near 100% here.

Scores (``a``: attention the query suffix pays a position over the cached KV, summed over query
tokens and the layers named, head-mean; ``dV_l``: squared deviation of the cached V from the
full prefill's at layer ``l``, which the engine computes exactly at its check layer ``l``):

- practical (what the engine can know before recomputing): ``kv_deviation`` (dV_1),
  ``query_attention`` (a, every layer), ``query_deviation`` (a x dV_1, the default),
  ``qdev_deep_layers`` (a from the upper half of the layers x dV_1), ``qdev_last_token``
  (a of the query's last token x dV_1), ``qdev_linear`` (a x sqrt(dV_1)), ``qdev_check_2`` /
  ``qdev_check_3`` (a x dV_2 / dV_3: a deeper check layer, one / two more full layers),
  ``qdev_draft`` (a of a draft answer, 8 greedy tokens over the cached KV, x dV_1: the lookahead
  queries of pseudo-query KV selection);
- controls (need the full prefill): ``all_layer_deviation`` (each layer's a x sqrt(dV_l),
  summed: every layer's true deviation), ``answer_attention`` (a of the reference answer's own
  tokens x dV_1: what the draft approximates).

Rows are appended per question to ``<rows>/<model>.rows.jsonl`` (``<rows>``: ``--output``'s path
under the benchmarks' cache, ``$ADARAG_BENCH_CACHE``, else ``~/.cache/adarag-bench``; a stopped
run resumes); the report ``<output>/<model>.md`` has each score's figures with 95% bootstrap
intervals and its paired difference against ``query_deviation``.

``routing``: uncertainty routing on the fidelity questions, who is routed up and what it keeps.
``experimental.recompute.uncertain_entropy = H`` runs the query suffix over the reused KV before the
fused prefill and, when the entropy of its next-token distribution is above ``H`` nats,
recomputes the request at ``uncertain_ratio`` (1.0: a full prefill) instead of its own ratio.
A routed request is exactly a request at the higher ratio (the engine's tests show the same
positions, and ratio 1.0 equals full prefill), so its quality comes from the fidelity rows
already measured (``fidelity.py run``): this subcommand only measures each question's entropy
over the reused KV (``--measure``: the ratio-0 prefill's next-token distribution, what the query
pass computes), written per question to ``<model>/<dataset>.entropy.jsonl`` beside the fidelity
rows, so a run resumes.

The report chooses ``H`` on the calibration split (the largest threshold on a 0.05 grid whose
routed policy keeps ``--target`` % exact agreement with full recomputation, pooled) and applies
it to the report split, per data set and pooled, with 95% bootstrap intervals; the routed
policy's rows are named ``<rule>+routed<H>``. Its cost is the share of requests routed up;
``--speed`` reads an ``engine.py ttft`` result with variants ``kept`` (routing on, not routed),
``routed`` (routed up) and ``full`` and turns the share into a mean TTFT speed-up.

    python benchmarks/selection.py signals --model qwen2.5-coder-0.5b --questions 8 --offset 0
    python benchmarks/selection.py routing --model qwen2.5-coder-0.5b --measure
    python benchmarks/selection.py routing --model qwen2.5-coder-0.5b \
        --speed benchmarks/results/engine/engine_ttft_routing_qwen.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import DEFAULT_DATA_DIR, RESULTS, run_subcommand
from runs.selection.routing import routing
from runs.selection.routing_split import SPLITS
from runs.selection.signals import signals

from adarag.evaluation.workload import DATASETS


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    command = sub.add_parser("signals", help="a screen of selection scores against the answer")
    command.add_argument("--model", default="qwen2.5-coder-0.5b")
    command.add_argument("--dataset", nargs="+", default=list(DATASETS), choices=DATASETS)
    command.add_argument("--questions", type=int, default=8)
    command.add_argument("--offset", type=int, default=0, help="skip this many questions")
    command.add_argument("--max-new-tokens", type=int, default=16)
    command.add_argument("--threads", type=int)
    command.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    command.add_argument("--output", type=Path, default=RESULTS / "fidelity" / "signals")
    command.add_argument("--report-only", action="store_true")
    command.set_defaults(fn=signals)
    command = sub.add_parser("routing", help="uncertainty routing replayed on the fidelity rows")
    command.add_argument("--model", default="default")
    command.add_argument("--dataset", nargs="+", default=list(DATASETS), choices=DATASETS)
    command.add_argument("--measure", action="store_true", help="measure missing entropies")
    command.add_argument("--split", nargs="+", default=list(SPLITS), choices=list(SPLITS))
    command.add_argument("--ratio", type=float, default=0.2, help="the requests' own ratio")
    command.add_argument("--target", type=float, default=85.0, help="calibration's exact agree %%")
    command.add_argument("--threads", type=int)
    command.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    command.add_argument("--speed", type=Path, help="an `engine.py ttft` result (.json)")
    command.add_argument(
        "--output", default="uncertainty_routing", help="results/fidelity/<output>_<model>.md"
    )
    command.set_defaults(fn=routing)
    run_subcommand(parser)


if __name__ == "__main__":
    main()
