"""The learned selector: which features find the oracle's tokens, and what it buys held out.

``features`` reads the oracle labels ``adarag calibrate --selector`` recorded on the calibration
questions (``--records``, one file per question) and writes
``results/fidelity/learned/<model>_features.md``:

- each feature family as a scorer on its own: the share of the oracle's set it chooses at the
  oracle's budget (recall), the share of the oracle set's first-order gain its set carries, and
  its AUROC over the candidates, at ratios 0.1 / 0.2 / 0.3, with 95% intervals over questions;
- the fitted selector held out: fitted on four data sets and judged on the fifth
  (leave-one-data-set-out, also by source: the three 2WikiMQA sets share questions), against
  ``query_deviation`` on the same questions (paired).

``pareto`` reads the report split's fidelity rows (``fidelity.py run`` with the ``learned``,
window, ladder and oracle rules; ``--rows``, default the benchmarks' cache) and an
``engine.py ttft`` run of the same rules side by side, and writes
``results/fidelity/learned/<model>_pareto.md``: per rule and ratio, exact agreement with full
recomputation, gold F1 against full's (paired), first-token agreement, and the mean TTFT
speed-up over full prefill (a ladder's from the share of requests ending on each rung).

    python benchmarks/learned_selector.py features --records ~/.cache/adarag-bench/selector/M
    python benchmarks/learned_selector.py pareto --model M \
        --speed benchmarks/results/engine/engine_ttft_learned_qwen.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import RESULTS, rows_dir
from runs.learned_selector.features import features
from runs.learned_selector.pareto import pareto


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    stage = sub.add_parser("features", help="feature families and held-out fits, from labels")
    stage.add_argument("--records", type=Path, required=True, help="the labels' directory")
    stage.add_argument("--output", type=Path, default=RESULTS / "fidelity" / "learned")
    stage.set_defaults(fn=features)
    stage = sub.add_parser("pareto", help="the report split's table, from fidelity rows")
    stage.add_argument("--model", required=True, help="the checkpoint's directory name")
    stage.add_argument("--rows", type=Path, default=rows_dir(RESULTS / "fidelity"))
    stage.add_argument("--speed", type=Path, help="an `engine.py ttft` result (JSON)")
    stage.add_argument("--baseline", default="query_deviation")
    stage.add_argument("--output", type=Path, default=RESULTS / "fidelity" / "learned")
    stage.set_defaults(fn=pareto)
    args = parser.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
