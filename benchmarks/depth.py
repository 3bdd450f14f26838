"""Adaptive depth against every fixed top-k, over real retrieval (Chroma, no gold forced in).

Three stages, each resumable:

``retrieve``: each data set's knowledge base (``adarag.evaluation.corpora``) is embedded into an
on-disk Chroma (all-MiniLM-L6-v2) once, and every question's top-12 chunks are written with their
scores to ``<cache>/<dataset>.retrieved.jsonl`` (``<cache>``: ``$ADARAG_BENCH_CACHE``, else
``~/.cache/adarag-bench``).

``run``: per question, every augmentation step k = 1..12 (``record_depth``: step k
reuses steps 1..k-1's exact KV from the hard tier and computes chunk k and the question; no other
tier, float32 store, so step k's answer is the full-recomputation answer of static top-k) with
its answer, gold F1, lens confidence, first-token margin, answer stability and wall time; plus
full prefills of the top-12 prompt and of one more depth (cycling over 1..11), every third
question, for the static TTFT fit. One JSON line per question in
``<cache>/depth/<model>/<dataset>.jsonl``; the depth probe's features of every step (the residual
stream at three layers, the lens signals, the retrieval scores) go to
``<cache>/depth-probe/<model>/<dataset>/``.

``--split calibration`` retrieves and runs other questions of each set, none of the report's:
the depth probe is fitted on them (``adarag calibrate --depth --dataset 2wikimqa hotpotqa
musique --records <cache>/depth-probe-calibration/<model>``); their JSON lines go to
``<cache>/depth-calibration/``.

``report``: fixed top-k for k = 1..12, the adaptive rules and the per-question oracle depth, from
the recorded questions. Per model, the rules' parameters are chosen on the calibration questions
of all three sets pooled (the first ``--calibration`` of each), by the largest gold-F1 gain over
fixed top-k at the same mean prompt tokens; every figure in the tables is on the remaining
(report) questions. Tables (``summary.md``, ``summary.json``) and plots in
``results/adaptive-augmentation/depth/``.

``gain`` and ``gain-report``: chunk selection by information gain against fixed top-k over the
same retrieval (``runs/depth/gain_run.py``, ``runs/depth/gain_report.py``): each chunk's gain
from its cached KV, and the full-recomputation answer of every set a gain rule can keep; tables in
``results/adaptive-augmentation/gain/``.

    python benchmarks/depth.py retrieve
    python benchmarks/depth.py run --model qwen2.5-coder-0.5b --dataset hotpotqa
    python benchmarks/depth.py report
    python benchmarks/depth.py gain --model qwen2.5-coder-0.5b --dataset hotpotqa
    python benchmarks/depth.py gain-report
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import DEFAULT_DATA_DIR
from runs.depth.gain_report import gain_report
from runs.depth.gain_run import gain_run
from runs.depth.report import report
from runs.depth.retrieve import retrieve
from runs.depth.run import run

from adarag.evaluation.corpora import RETRIEVAL_DATASETS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    stage = sub.add_parser("retrieve")
    stage.add_argument("--datasets", nargs="+", default=list(RETRIEVAL_DATASETS))
    stage.add_argument("--questions", type=int, default=60)
    stage.add_argument("--split", choices=("report", "calibration"), default="report")
    stage.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    stage.set_defaults(fn=retrieve)
    stage = sub.add_parser("run")
    stage.add_argument("--model", default="smollm2-135m")
    stage.add_argument("--dataset", choices=RETRIEVAL_DATASETS, required=True)
    stage.add_argument("--questions", type=int, default=60)
    stage.add_argument("--threads", type=int, default=1)
    stage.add_argument("--max-new-tokens", type=int, default=16)
    stage.add_argument("--split", choices=("report", "calibration"), default="report")
    stage.add_argument("--shard", default="0/1", help="i/n: every n-th question from the i-th")
    stage.set_defaults(fn=run)
    stage = sub.add_parser("gain", help="chunk gains and the answers of every set (see gain_run)")
    stage.add_argument("--model", default="smollm2-135m")
    stage.add_argument("--dataset", choices=RETRIEVAL_DATASETS, required=True)
    stage.add_argument("--questions", type=int, default=45)
    stage.add_argument("--max-k", type=int, default=8, help="chunks scored and answered (top-K)")
    stage.add_argument("--threads", type=int, default=1)
    stage.add_argument("--max-new-tokens", type=int, default=16)
    stage.add_argument("--split", choices=("report", "calibration"), default="report")
    stage.set_defaults(fn=gain_run)
    stage = sub.add_parser("gain-report", help="tables of the gain records (see gain_report)")
    stage.set_defaults(fn=gain_report)
    stage = sub.add_parser("report")
    stage.add_argument(
        "--calibration",
        type=int,
        default=5,
        help="the first N questions of each set choose the rules' thresholds",
    )
    stage.set_defaults(fn=report)
    args = parser.parse_args()
    if args.stage in ("run", "gain"):
        args.model_dir = {
            "smollm2-135m": "SmolLM2-135M-Instruct",
            "qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B-Instruct",
        }.get(args.model, Path(args.model).name)
    args.fn(args)


if __name__ == "__main__":
    main()
