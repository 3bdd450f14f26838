"""`adarag calibrate` end to end on a tiny model: the profile it writes drives the stop rule."""

from __future__ import annotations

import json

from adarag import AdaRAG
from adarag.cli import main
from adarag.config import AdaRagConfig
from adarag.profiles import ModelProfile
from adarag.profiles.model_profile import Calibration


def test_calibrate_writes_an_agreement_calibration_the_pipeline_reads(tiny_checkpoints, tmp_path):
    settings = {
        "home": str(tmp_path / "home"),
        "engine": {"model": str(tiny_checkpoints["llama"])},
        "augment": {"stop_rule": "agreement"},
        "experimental": {"augment": {"num_lens_layers": 2}},
    }
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(settings))
    data = tmp_path / "dev.jsonl"
    rows = [
        {
            "question": f"Where was person {i} born?",
            "answers": [f"town {i}"],
            "passages": [
                {"title": f"P{i}-{j}", "text": f"Person {i} lived in town {j}."} for j in range(3)
            ],
        }
        for i in range(6)
    ]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    output = tmp_path / "profile.json"
    argv = ["--config", str(config_path), "calibrate", "--data", str(data), "--chunks", "3"]
    status = main([*argv, "--max-new-tokens", "4", "--risk", "0.2", "--output", str(output)])
    assert status == 0
    profile = ModelProfile.from_json(output.read_text(), str(output))
    agreement = profile.calibration.agreement
    assert agreement is not None and agreement.risk == 0.2 and agreement.min_steps == 2
    assert list(agreement.probabilities) == sorted(agreement.probabilities)
    assert output.with_name("profile.reliability.png").stat().st_size > 0
    records = json.loads(output.with_name("profile.calibration-records.json").read_text())
    assert all(
        len(r["margins"]) == len(r["stable"]) == len(r["step_answers"]) == len(r["step_seconds"])
        for r in records
    )
    assert all(seconds > 0 for r in records for seconds in r["step_seconds"])
    assert agreement.cost_share is None or agreement.cost_share > 0
    assert all(r["stable"][0] is False for r in records)  # no previous answer at step 1

    # the pipeline reads what calibrate wrote (from the home, by fingerprint)
    rag = AdaRAG(AdaRagConfig.build(**settings))
    (rag.config.home / "profiles").mkdir(parents=True, exist_ok=True)
    fingerprint_path = rag.config.home / "profiles" / f"{rag.engine.fingerprint}.json"
    fingerprint_path.write_text(output.read_text())
    assert rag.profile.calibration.agreement == agreement

    # refitting from the saved records reproduces the calibration without running the model
    refit = tmp_path / "refit.json"
    records_path = output.with_name("profile.calibration-records.json")
    argv_refit = ["--config", str(config_path), "calibrate", "--records", str(records_path)]
    assert main([*argv_refit, "--risk", "0.2", "--output", str(refit)]) == 0
    assert ModelProfile.from_json(refit.read_text(), str(refit)).calibration == profile.calibration

    # --agreement-only keeps the confidence constants the model's profile already has
    own = Calibration(threshold=0.77, kl_weight=0.33, kl_scale=2.0, entropy_scale=3.0)
    fingerprint_path.write_text(profile.with_calibration(own).to_json())
    only = tmp_path / "agreement-only.json"
    assert main([*argv_refit, "--agreement-only", "--output", str(only)]) == 0
    kept = ModelProfile.from_json(only.read_text(), str(only)).calibration
    assert kept.agreement is not None
    assert kept == Calibration(0.77, 0.33, 2.0, 3.0, kept.agreement)


def test_a_file_that_is_not_calibration_records_is_a_clear_error(
    tiny_checkpoints, tmp_path, capsys
):
    bogus = tmp_path / "records.json"
    bogus.write_text(json.dumps([{"question": "q?"}]))
    config_path = tmp_path / "config.json"
    settings = {"home": str(tmp_path / "home"), "engine": {"model": str(tiny_checkpoints["llama"])}}
    config_path.write_text(json.dumps(settings))
    assert main(["--config", str(config_path), "calibrate", "--records", str(bogus)]) == 2
    assert "not calibration records" in capsys.readouterr().err


def test_calibration_data_without_passages_is_a_clear_error(tmp_path, capsys):
    data = tmp_path / "no-passages.jsonl"
    data.write_text(json.dumps({"question": "q?", "answers": ["a"]}) + "\n")
    status = main(["calibrate", "--data", str(data), "--model", str(tmp_path / "unused")])
    assert status == 2
    assert "lacks ['passages']" in capsys.readouterr().err
