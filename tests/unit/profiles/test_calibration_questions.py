"""`adarag calibrate`'s questions from a user's own files: each file a data set, bad rows named."""

from __future__ import annotations

import argparse
import json

import pytest

from adarag.cli import main
from adarag.cli.calibration_questions import questions_for
from adarag.errors import InputError
from adarag.profiles import ModelProfile
from tests.unit.profiles.test_calibrate_learned import TOWNS, _tiny_settings, _write_data


def _args(**overrides):
    values = {"data": [], "dataset": None, "offset": 0, "questions": None, "chunks": 4}
    return argparse.Namespace(**{**values, **overrides})


def test_each_file_is_a_data_set_with_its_own_passages_as_chunks(tmp_path):
    _write_data(tmp_path / "data")
    files = [tmp_path / "data" / "musique_dev.jsonl", tmp_path / "data" / "hotpotqa_dev.jsonl"]
    found = questions_for(_args(data=files, offset=1, questions=3))
    assert [dataset for dataset, _ in found] == ["musique_dev", "hotpotqa_dev"] * 3
    first = found[0][1]
    assert first.qid == "musique-1" and first.answers == (TOWNS[1],)
    assert len(first.chunks) == 4 and all("of musique" in chunk for chunk in first.chunks)
    assert "person 1 of musique" in first.chunks[0]  # BM25 ranks the question's own passage first


def test_bad_question_files_are_refused_naming_the_file_and_row(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"question": "q", "answers": ["a"], "passages": []}) + "\n")
    with pytest.raises(InputError, match="either --data"):
        questions_for(_args(data=[good], dataset=["musique"]))
    lacking = tmp_path / "lacking.jsonl"
    lacking.write_text(json.dumps({"question": "q", "answers": ["a"]}) + "\n")
    with pytest.raises(InputError, match=r"lacking.jsonl:1: a row lacks \['passages'\]"):
        questions_for(_args(data=[lacking]))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "q"}\n{not json\n')
    with pytest.raises(InputError, match="broken.jsonl:2: not a JSON row"):
        questions_for(_args(data=[broken], offset=1))
    good.write_text(good.read_text() + "{not json, never read\n")
    assert questions_for(_args(data=[good], questions=1)) == []  # no passages; line 2 unread
    no_text = tmp_path / "no_text.jsonl"
    no_text.write_text(json.dumps({"question": "q", "answers": [], "passages": [{"t": 1}]}) + "\n")
    with pytest.raises(InputError, match="no_text.jsonl:1: its passages must be objects"):
        questions_for(_args(data=[no_text]))
    with pytest.raises(InputError, match="missing.jsonl: cannot read it"):
        questions_for(_args(data=[tmp_path / "missing.jsonl"]))


def test_the_packet_fits_on_a_user_s_own_files(tiny_checkpoints, tmp_path, capsys):
    _, config_path = _tiny_settings(tiny_checkpoints, tmp_path)
    _write_data(tmp_path / "data")
    output = tmp_path / "profile.json"
    argv = ["--config", str(config_path), "calibrate", "--packet", "--packet-variant", "bridge"]
    files = [str(tmp_path / "data" / f"{name}_dev.jsonl") for name in ("musique", "hotpotqa")]
    argv += ["--data", *files, "--questions", "5"]
    argv += ["--max-new-tokens", "3", "--packet-tokens", "2", "--learning-rate", "0.5"]
    argv += ["--records", str(tmp_path / "records"), "--chunks", "4"]
    assert main([*argv, "--epochs", "4", "--output", str(output)]) == 0
    packet = ModelProfile.read(output.parent, output.name).packet
    assert packet is not None and packet.num_questions == 8  # every fifth of 10 held out
    assert len(packet.loss_curve) == 2 + 4
    assert "(hotpotqa_dev hotpotqa-4)" in capsys.readouterr().out  # each file a data set
    teachers = {path.name for path in (tmp_path / "records").rglob("*.safetensors")}
    assert {"musique_dev-musique-0.safetensors", "hotpotqa_dev-hotpotqa-4.safetensors"} <= teachers
