"""`adarag calibrate --selector` and `--depth` end to end on a tiny model.

The profile they write drives the learned rule, the routing ladder and the probe stop rule.
"""

from __future__ import annotations

import json

import pytest
import torch

from adarag import AdaRAG
from adarag.cli import calibrate_learned, calibration_questions, main
from adarag.config import AdaRagConfig, RecomputeConfig
from adarag.engine.prefill_request import LearnedControls, PrefillRequest
from adarag.evaluation.profiling.depth_probe import probe_layers
from adarag.evaluation.reuse import independent_chunks, reuse_sources
from adarag.profiles import ModelProfile

TOWNS = ("paris", "berlin", "madrid", "rome", "vienna", "lisbon")
DATA_SETS = ("hotpotqa", "musique")


def _write_data(directory):
    """Tiny MuSiQue- and HotpotQA-shaped dev files (their own passages per question)."""
    directory.mkdir()
    for name in ("musique", "hotpotqa"):
        rows = []
        for i in range(6):
            passages = [
                {
                    "title": f"{name} {i} {j}",
                    "text": f"person {i} of {name} lived in {TOWNS[(i + j) % 6]} for {j} years.",
                    "supporting": j == 0,
                }
                for j in range(6)
            ]
            rows.append(
                {
                    "id": f"{name}-{i}",
                    "question": f"where did person {i} of {name} live?",
                    "answers": [TOWNS[i % 6]],
                    "passages": passages,
                }
            )
        (directory / f"{name}_dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _tiny_settings(tiny_checkpoints, tmp_path):
    """The tiny model's settings with a home of its own, and the config file holding them."""
    settings = {
        "home": str(tmp_path / "home"),
        "engine": {"model": str(tiny_checkpoints["llama"])},
        "experimental": {"augment": {"num_lens_layers": 2}},
    }
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(settings))
    return settings, config_path


@pytest.fixture()
def calibrated(tiny_checkpoints, tmp_path):
    settings, config_path = _tiny_settings(tiny_checkpoints, tmp_path)
    data = tmp_path / "data"
    _write_data(data)
    output = tmp_path / "profile.json"
    records = tmp_path / "records"
    argv = [
        "--config",
        str(config_path),
        "calibrate",
        "--selector",
        "--dataset",
        "musique",
        "hotpotqa",
        "--data-dir",
        str(data),
        "--questions",
        "3",
        "--max-new-tokens",
        "3",
        "--records",
        str(records),
        "--output",
        str(output),
    ]
    return settings, argv, output, records


def test_selector_shards_then_fits_a_profile_the_learned_rule_reads(calibrated, capsys):
    settings, argv, output, records = calibrated
    assert main([*argv, "--shard", "0/2"]) == 0
    assert not output.exists()  # half the questions: nothing is fitted yet
    assert "shard 0/2 recorded" in capsys.readouterr().out
    assert len(list(records.glob("*/*.safetensors"))) == 3
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "held out" in printed and "musique" in printed and "hotpotqa" in printed
    assert "warning: 6 calibration questions" in printed
    assert "Calibration(" not in printed  # a readable summary, not a repr
    profile = ModelProfile.from_json(output.read_text(), str(output))
    assert profile.selector is not None and profile.ladder is not None
    ladder = profile.ladder
    assert len(ladder.thresholds) == len(ladder.targets) and ladder.rungs[-1] == 1.0
    assert all(0.0 <= agreement <= 1.0 for agreement, _ in ladder.held_out)

    # the pipeline reads it: the learned rule chooses other positions than query_deviation
    rag = AdaRAG(AdaRagConfig.build(**settings))
    layout = rag.layout(
        "where did person 2 of musique live?",
        [f"person {i} lived in {t}." for i, t in enumerate(TOWNS)],
    )
    system_kv, chunk_kvs = independent_chunks(rag.engine, layout)
    learned = RecomputeConfig(selection_policy="learned")
    at_half = reuse_sources(system_kv, chunk_kvs, 0.5)
    plain = rag.engine.prefill(PrefillRequest(layout, at_half, selection=learned))
    fitted = rag.engine.prefill(
        PrefillRequest(
            layout,
            at_half,
            selection=learned,
            controls=LearnedControls(token_scorer=profile.selector),
        )
    )
    assert plain.num_recomputed_tokens == fitted.num_recomputed_tokens
    assert not torch.equal(plain.recomputed_positions, fitted.recomputed_positions)
    full = rag.engine.prefill(PrefillRequest(layout))
    at_one = rag.engine.prefill(
        PrefillRequest(
            layout,
            reuse_sources(system_kv, chunk_kvs, 1.0),
            selection=learned,
            controls=LearnedControls(token_scorer=profile.selector),
        ),
    )
    torch.testing.assert_close(at_one.logits, full.logits, atol=1e-5, rtol=1e-5)


def test_ladder_only_climbs_with_the_profiles_selector_and_keeps_it(calibrated, capsys):
    settings, argv, _, records = calibrated
    to_home = argv[: argv.index("--output")]  # the profile goes to the home, which reads it
    ladder_argv = [*to_home, "--ladder-only", "--offset", "3", "--records", str(records) + "-2"]
    assert main(ladder_argv) == 2  # no selector fitted yet: a clear error, nothing written
    error = capsys.readouterr().err
    assert "--ladder-only" in error and "no fitted selector" in error
    assert main(to_home) == 0
    fitted = AdaRAG(AdaRagConfig.build(**settings)).profile
    assert fitted.selector is not None and fitted.ladder is not None
    capsys.readouterr()

    assert main([*ladder_argv, "--target-agreement", "0.6", "0.7"]) == 0
    assert "climbed on 6 questions with the profile's selector" in capsys.readouterr().out
    refitted = AdaRAG(AdaRagConfig.build(**settings)).profile
    assert refitted.selector == fitted.selector  # kept as it was
    assert refitted.ladder is not None and refitted.ladder.targets == (0.6, 0.7)
    chains = (records.parent / "records-2").glob("profile-chains-*.jsonl")
    lines = [json.loads(line) for path in chains for line in path.read_text().splitlines()]
    assert sorted(line["qid"] for line in lines) == [
        f"{n}-{i}" for n in DATA_SETS for i in (3, 4, 5)
    ]
    assert not list((records.parent / "records-2").glob("*/*.safetensors"))  # no oracle labels


def test_a_model_without_a_fitted_selector_says_so_once(tiny_checkpoints, tiny_config, caplog):
    config = tiny_config(
        tiny_checkpoints["llama"],
        cache={"recompute": {"selection_policy": "learned", "target_agreement": 0.9}},
        augment={"enabled": False},
    )
    rag = AdaRAG(config)
    with caplog.at_level("WARNING", logger="adarag.pipeline.learned"):
        for _ in range(2):
            rag.query("where is paris?", chunks=["paris is in france.", "berlin is in germany."])
    messages = [r.getMessage() for r in caplog.records if r.name == "adarag.pipeline.learned"]
    assert sum("no fitted selector" in m for m in messages) == 1
    assert sum("no routing ladder" in m for m in messages) == 1


def _bundled_rows() -> list[dict]:
    """Short bundled-shaped questions (the tiny model's context is 512 characters)."""
    return [
        {
            "dataset": dataset,
            "qid": f"{dataset}-{i}",
            "question": f"where is p{i}?",
            "answers": [TOWNS[i]],
            "chunks": [f"p{i} is in {TOWNS[(i + j) % 6]}." for j in range(3)],
        }
        for dataset in ("musique", "hotpotqa", "2wikimqa-gold")
        for i in range(4)
    ]


def test_depth_records_in_shards_then_fits_a_probe_the_stop_rule_reads(
    tiny_checkpoints, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(calibration_questions, "calibration_questions", _bundled_rows)
    monkeypatch.setattr(calibrate_learned, "DEPTH_K", 4)
    settings, config_path = _tiny_settings(tiny_checkpoints, tmp_path)
    records = tmp_path / "records"
    argv = ["--config", str(config_path), "calibrate", "--depth", "--questions", "3"]
    argv += ["--max-new-tokens", "2", "--records", str(records)]
    # the shards run one after the other here, each over a Chroma of its own; the profile goes
    # to the home, which then reads it
    assert main([*argv, "--shard", "0/2"]) == 0
    assert "shard 0/2 recorded" in capsys.readouterr().out
    assert main([*argv, "--shard", "1/2"]) == 0
    recorded = sorted(records.glob("*/*.safetensors"))
    assert len(recorded) == 9  # three per set
    printed = capsys.readouterr().out  # the last shard completed the records and fitted
    assert "AUROC" in printed and "stop rule: P >=" in printed
    assert main(argv) == 0  # everything recorded: it only fits again
    assert sorted(records.glob("*/*.safetensors")) == recorded

    settings["augment"] = {"stop_rule": "probe"}
    rag = AdaRAG(AdaRagConfig.build(**settings))
    probe = rag.profile.depth_probe
    assert probe is not None and probe.layers == probe_layers(rag.engine.spec.num_layers)
    chunks = [f"p{i} is in {t}." for i, t in enumerate(TOWNS)]
    trace = rag.query("where is p2?", chunks=chunks).trace
    assert trace.stop_reason in ("confident", "exhausted")
    assert max(1, probe.min_steps) <= len(trace.steps) <= len(chunks)
