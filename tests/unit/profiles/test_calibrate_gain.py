"""`adarag calibrate --depth --gain-records` on synthetic records, end to end on a tiny model.

Every question has 8 chunks whose gains put each τ of the grid between two of them, so each τ
keeps a set of its own. The gold chunk is 4th by gain and 6th as retrieved: τ = 0.1 in gain
order is the smallest set holding it (F1 1.0 at 4 chunks), where fixed top-k gains 0.1 F1 per
chunk and the retrieval-order sets answer only 0.8.
"""

from __future__ import annotations

import json
import logging

import pytest

from adarag import AdaRAG
from adarag.cli import main
from adarag.config import AdaRagConfig
from adarag.evaluation.gain_depth import subset_key
from tests.unit.engine.helpers import CHUNKS, QUESTION

GAINS = [0.01, 0.25, -0.05, 0.07, 0.35, 0.12, 0.03, 0.17]
GOLD = 5
GAIN_ORDER = sorted(range(len(GAINS)), key=lambda idx: -GAINS[idx])


def _tokens(num_chunks: int) -> int:
    return 20 + 10 * num_chunks


def _answered(f1: float, num_chunks: int, **extra) -> dict:
    return {"answer": "", "f1": f1, "tokens": _tokens(num_chunks), **extra}


def _record(number: int) -> dict:
    by_gain = [
        _answered(1.0 if GOLD in GAIN_ORDER[:k] else 0.0, k, confidence=0.5)
        for k in range(1, len(GAINS) + 1)
    ]
    subsets = {}
    for k in range(2, len(GAINS)):
        kept = sorted(GAIN_ORDER[:k])
        subsets[subset_key(kept)] = _answered(0.8 if GOLD in kept else 0.0, k)
    return {
        "qid": f"q{number}",
        "scores": [1.0 - 0.1 * idx for idx in range(len(GAINS))],
        "gains": GAINS,
        "scoring_s": 0.01,
        "none": _answered(0.0, 0),
        "single": [_answered(1.0 if idx == GOLD else 0.0, 1) for idx in range(len(GAINS))],
        "fixed": [_answered(0.1 * k, k) for k in range(1, len(GAINS) + 1)],
        "gain_order": GAIN_ORDER,
        "by_gain": by_gain,
        "subsets": subsets,
        "static": [
            {"k": 8, "tokens": 100 + 10 * number, "seconds": 0.1 + 0.01 * number},
            {"k": 3, "tokens": 50 + 5 * number, "seconds": 0.05 + 0.004 * number},
        ],
    }


def _write_records(directory, counts: dict[str, int]) -> None:
    directory.mkdir()
    number = 0
    for dataset, count in counts.items():
        lines = []
        for _ in range(count):
            lines.append(json.dumps(_record(number)) + "\n")
            number += 1
        (directory / f"{dataset}.jsonl").write_text("".join(lines))


@pytest.fixture()
def tiny_settings(tiny_checkpoints, tmp_path):
    settings = {
        "home": str(tmp_path / "home"),
        "engine": {"model": str(tiny_checkpoints["llama"])},
        "experimental": {"augment": {"num_lens_layers": 2}},
    }
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(settings))
    return settings, config_path


def test_the_gain_records_choose_the_tau_that_beats_fixed_top_k_and_the_profile_keeps_it(
    tiny_settings, tmp_path, capsys, caplog
):
    settings, config_path = tiny_settings
    records = tmp_path / "gain"
    _write_records(records, {"musique": 2, "hotpotqa": 1})
    argv = ["--config", str(config_path), "calibrate", "--depth", "--gain-records", str(records)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "τ=0.1, listed in gain order" in printed and "+60.0 against fixed top-k" in printed

    settings["augment"] = {"stop_rule": "gain"}
    rag = AdaRAG(AdaRagConfig.build(**settings))
    gain = rag.profile.gain
    assert gain is not None
    assert (gain.threshold, gain.order) == (0.1, "gain")
    assert gain.num_questions == 3 and gain.datasets == ("hotpotqa", "musique")
    assert gain.f1_over_fixed == pytest.approx(60.0)
    assert rag.profile.depth_probe is None  # without --records only the gain rule is fitted
    with caplog.at_level(logging.INFO, logger="adarag.pipeline.rag"):
        rag.query(QUESTION, chunks=list(CHUNKS))
    assert "no gain threshold calibrated" not in caplog.text  # the fitted τ is used


def test_a_directory_without_gain_records_is_a_clear_error(tiny_settings, tmp_path, capsys):
    _, config_path = tiny_settings
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a record\n")
    argv = ["--config", str(config_path), "calibrate", "--depth", "--gain-records"]
    assert main([*argv, str(empty)]) == 2
    assert "no gain records" in capsys.readouterr().err
    assert main([*argv, str(tmp_path / "missing")]) == 2
    assert "no gain records" in capsys.readouterr().err


def test_a_line_that_is_not_a_gain_record_names_its_file_and_line(tiny_settings, tmp_path, capsys):
    _, config_path = tiny_settings
    records = tmp_path / "gain"
    _write_records(records, {"musique": 1})
    with (records / "musique.jsonl").open("a") as handle:
        handle.write(json.dumps({"qid": "broken"}) + "\n")
    argv = ["--config", str(config_path), "calibrate", "--depth", "--gain-records", str(records)]
    assert main(argv) == 2
    assert "musique.jsonl:2 is not a gain record" in capsys.readouterr().err


def test_gain_records_without_depth_are_refused(tiny_settings, tmp_path, capsys):
    _, config_path = tiny_settings
    argv = ["--config", str(config_path), "calibrate", "--gain-records", str(tmp_path)]
    assert main(argv) == 2
    assert "pass it with --depth" in capsys.readouterr().err
