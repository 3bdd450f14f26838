"""Write adarag/data/calibration_questions.jsonl: the questions `adarag calibrate` fits on.

The first questions of the benchmarks' calibration split (questions #0-39 of each data set;
the report split starts at #40), with the chunks the fidelity benchmark gives them: MuSiQue's and
HotpotQA's top passages of their own by BM25, 2WikiMultihopQA's gold passages among random
corpus passages. Run it over the QA data sets' dev files:

    python scripts/bundle_calibration.py --data-dir DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from adarag.evaluation.workload import DEFAULT_DATA_DIR, FIDELITY_CHUNKS, load_questions

BUNDLED = {"musique": 20, "hotpotqa": 20, "2wikimqa-gold": 20}
OUTPUT = Path(__file__).resolve().parents[1] / "adarag" / "data" / "calibration_questions.jsonl"


def main() -> None:
    """Write the bundled calibration questions."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    args = parser.parse_args()
    lines = []
    for dataset, count in BUNDLED.items():
        for item in load_questions(dataset, args.data_dir, count, FIDELITY_CHUNKS[dataset]):
            record = {
                "dataset": dataset,
                "qid": item.qid,
                "question": item.question,
                "answers": list(item.answers),
                "chunks": list(item.chunks),
            }
            lines.append(json.dumps(record, ensure_ascii=False))
    OUTPUT.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} questions -> {OUTPUT}")  # noqa: T201


if __name__ == "__main__":
    main()
