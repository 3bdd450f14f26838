"""Which configuration file the command reads ($ADARAG_CONFIG, the default one); `adarag config`."""

from __future__ import annotations

import json

import pytest

from adarag.cli import build_parser, main
from adarag.cli.options import build_config
from adarag.config import RetrievalConfig, discover_config, find_config_file

SIGNING_KEY = "k" * 24
PASSWORD = "hunter2-secret"


@pytest.fixture()
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("ADARAG_HOME", str(home))
    return home


def _write(path, settings):
    path.write_text(json.dumps(settings))
    return path


def _top_k(argv):
    return build_config(build_parser().parse_args(["chat", *argv])).retrieval.top_k


def test_each_source_overrides_the_ones_below_it(home, tmp_path, monkeypatch):
    default = RetrievalConfig().top_k
    assert _top_k([]) == default
    _write(home / "config.json", {"retrieval": {"top_k": 2, "chunk_tokens": 100}})
    assert _top_k([]) == 2
    monkeypatch.setenv("ADARAG_CONFIG", str(_write(tmp_path / "env.json", {"retrieval": {}})))
    assert _top_k([]) == default  # one file is read: the default file is not merged under it
    _write(tmp_path / "env.json", {"retrieval": {"top_k": 3}})
    assert _top_k([]) == 3
    explicit = _write(tmp_path / "explicit.json", {"retrieval": {"top_k": 5}})
    assert _top_k(["--config", str(explicit)]) == 5
    assert _top_k(["--config", str(explicit), "--top-k", "7"]) == 7


def test_adarag_config_names_the_file_it_read(home, tmp_path, monkeypatch):
    monkeypatch.setenv("ADARAG_CONFIG", str(_write(tmp_path / "c.json", {})))
    assert find_config_file().origin == "$ADARAG_CONFIG"
    monkeypatch.delenv("ADARAG_CONFIG")
    assert find_config_file() is None
    _write(home / "config.json", {"retrieval": {"top_k": 3}})
    assert find_config_file().path == home / "config.json"
    assert discover_config().retrieval.top_k == 3  # the same file, from Python


def test_a_missing_adarag_config_file_is_refused_naming_the_variable(
    home, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("ADARAG_CONFIG", str(tmp_path / "missing.json"))
    assert main(["config"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "missing.json: No such file or directory" in error
    assert "came from $ADARAG_CONFIG; or unset ADARAG_CONFIG" in error


def test_the_config_command_shows_the_resolved_settings_with_secrets_masked(
    home, tmp_path, monkeypatch, capsys
):
    settings = {
        "retrieval": {"top_k": 3},
        "cache": {
            "store": {
                "signing_key": SIGNING_KEY,
                "remote_url": f"redis://app:{PASSWORD}@127.0.0.1:6379/0",
                "remote_password": PASSWORD,
            }
        },
    }
    monkeypatch.setenv("ADARAG_CONFIG", str(_write(tmp_path / "c.json", settings)))
    assert main(["config", "--collection", "notes"]) == 0
    out = capsys.readouterr().out
    header, precedence, *body = out.splitlines()
    assert header == f"configuration file: {tmp_path / 'c.json'} (from $ADARAG_CONFIG)"
    assert precedence.startswith("precedence: command-line options > --config FILE")
    shown = json.loads("\n".join(body))
    assert shown["retrieval"]["top_k"] == 3 and shown["retrieval"]["collection"] == "notes"
    store = shown["cache"]["store"]
    assert store["signing_key"] == store["remote_password"] == "***"
    assert store["remote_url"] == "redis://app:***@127.0.0.1:6379/0"
    assert SIGNING_KEY not in out and PASSWORD not in out
    assert shown["home"] == str(home) and "engine" in shown  # every section, not only the file's


def test_the_config_command_can_show_only_what_differs_from_the_defaults(home, capsys):
    _write(home / "config.json", {"retrieval": {"top_k": 3}})
    assert main(["config", "--changed", "--model", "qwen2.5-coder-0.5b"]) == 0
    out = capsys.readouterr().out
    assert (
        out.splitlines()[0] == f"configuration file: {home / 'config.json'} (from the default file)"
    )
    body = json.loads("\n".join(out.splitlines()[2:]))
    assert body == {"engine": {"model": "qwen2.5-coder-0.5b"}, "retrieval": {"top_k": 3}}


def test_adarag_config_is_honoured_by_a_command_that_answers(
    tiny_checkpoints, home, tmp_path, monkeypatch, capsys
):
    settings = {
        "engine": {"model": str(tiny_checkpoints["llama"])},
        "experimental": {"augment": {"num_lens_layers": 2}},
    }
    monkeypatch.setenv("ADARAG_CONFIG", str(_write(tmp_path / "tiny.json", settings)))
    notes = tmp_path / "notes.md"
    notes.write_text("Paris is the capital of France.\n")
    assert main(["ask", "the capital of france?", str(notes), "--max-new-tokens", "3"]) == 0
    assert "answer: " in capsys.readouterr().out  # the tiny model the file names answered
