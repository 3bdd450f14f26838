"""The blending gate: exact reuse passes on every tiny family, a wrong re-rotation fails it."""

from __future__ import annotations

import json

import pytest

from adarag.cli import main
from adarag.engine.gate import check_blending
from adarag.errors import InputError
from adarag.kernels import rope_delta
from tests.tiny_models import TINY_FAMILIES
from tests.unit.engine.helpers import CHUNKS, QUESTION, layout_of, load_engine


def _engine(tiny_checkpoints, tiny_config, family="llama"):
    return load_engine(tiny_config(tiny_checkpoints[family]))


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_the_gate_passes_every_tiny_family(tiny_checkpoints, tiny_config, family):
    engine = _engine(tiny_checkpoints, tiny_config, family)
    report = check_blending(engine)
    assert report.passed, report.summary()
    assert report.reasons == ()
    # float32: re-rotating by +37 then -37 positions leaves the keys within a few ulps
    assert report.max_key_error < 1e-4
    assert report.max_logit_error < 1e-4
    assert report.ratio_one_logit_error < 1e-4
    assert report.answers_equal


def test_the_gate_passes_on_the_pipelines_prompt_layout(tiny_checkpoints, tiny_config):
    engine = _engine(tiny_checkpoints, tiny_config)
    report = check_blending(engine, layout_of(engine, QUESTION, CHUNKS), shift=500)
    assert report.passed, report.summary()
    assert report.shift == 500


def _skipped(keys, delta_positions, inv_freq, *, backend="auto"):
    return keys


def _off_by_one(keys, delta_positions, inv_freq, *, backend="auto"):
    return rope_delta(keys, delta_positions + 1, inv_freq, backend=backend)


def _wrong_sign(keys, delta_positions, inv_freq, *, backend="auto"):
    return rope_delta(keys, -delta_positions, inv_freq, backend=backend)


@pytest.mark.parametrize("wrong", [_skipped, _off_by_one, _wrong_sign])
def test_a_wrong_re_rotation_fails_the_gate_naming_it(
    tiny_checkpoints, tiny_config, monkeypatch, wrong
):
    engine = _engine(tiny_checkpoints, tiny_config)
    monkeypatch.setattr("adarag.engine.kv_cache.rope_delta", wrong)
    report = check_blending(engine)
    assert not report.passed
    assert len(report.reasons) == 1 and report.reasons[0].startswith("re-rotation:")
    assert report.max_key_error > 1e-2
    # ratio 1.0 recomputes every token, so no re-rotation reaches it
    assert report.answers_equal and report.ratio_one_logit_error < 1e-4
    assert "FAILED" in report.summary() and "failed: re-rotation" in report.summary()


def test_a_layout_without_chunks_or_a_zero_shift_is_refused(tiny_checkpoints, tiny_config):
    engine = _engine(tiny_checkpoints, tiny_config)
    layout = layout_of(engine, QUESTION, CHUNKS)
    with pytest.raises(InputError, match="no chunk"):
        check_blending(engine, layout.with_chunks(0))
    with pytest.raises(InputError, match="nonzero shift"):
        check_blending(engine, layout, shift=0)


def _argv(tiny_checkpoints, tmp_path):
    settings = {"home": str(tmp_path / "home"), "engine": {"model": str(tiny_checkpoints["qwen2"])}}
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(settings))
    return ["--config", str(config_path), "check", "--chunks", "1"]


def test_check_command_prints_the_report_and_exits_by_the_verdict(
    tiny_checkpoints, tmp_path, capsys, monkeypatch
):
    assert main(_argv(tiny_checkpoints, tmp_path)) == 0
    assert "blending gate for qwen2: PASSED" in capsys.readouterr().out
    monkeypatch.setattr("adarag.engine.kv_cache.rope_delta", _skipped)
    assert main(_argv(tiny_checkpoints, tmp_path)) == 1
    captured = capsys.readouterr()
    assert "failed: re-rotation" in captured.out
    assert "failed the blending gate" in captured.err and "'full' policy" in captured.err
