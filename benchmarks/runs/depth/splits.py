"""The depth benchmark's splits: which questions each holds and where their files go."""

from __future__ import annotations

import json
from pathlib import Path

from common import CACHE

MAX_K = 12
# questions per data set: the first CALIBRATION choose the rules' thresholds, the rest report
OFFSETS = {"2wikimqa": 100, "hotpotqa": 100, "musique": 40}
REPORTED = 45  # questions from each offset: 5 calibrate the hand-made rules, 40 report
ROWS = {"report": CACHE / "depth", "calibration": CACHE / "depth-calibration"}
PROBE_RECORDS = {"report": CACHE / "depth-probe", "calibration": CACHE / "depth-probe-calibration"}


def split_rows(rows: list[dict], dataset: str, split: str, count: int) -> list[dict]:
    """The questions of ``split``: the report's (from the offset), or ``count`` others."""
    start = OFFSETS[dataset]
    if split == "report":
        return rows[start : start + count]
    others = rows[:start] + rows[start + REPORTED :]
    return others[:count]


def recorded_qids(path: Path) -> set[str]:
    """The question ids a JSON-lines file of rows already holds (a run resumes after them)."""
    if not path.exists():
        return set()
    return {json.loads(line)["qid"] for line in path.read_text().splitlines() if line.strip()}


def retrieved_path(dataset: str, split: str) -> Path:
    """Where a split's top-12 per question are written."""
    infix = "" if split == "report" else ".calibration"
    return CACHE / f"{dataset}{infix}.retrieved.jsonl"
