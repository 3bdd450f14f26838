"""Bad options, keys and directories on the command line: one line naming the fix, exit 2.

Regression (issue 45): a short key in the environment gave a pydantic traceback and exit 1,
``"signing_key": true`` said "must be a number", ``--chroma-dir /dev/null`` raised
FileExistsError, ``--max-new-tokens 1000000000000`` gave a traceback, and a key file open to
every user was read silently.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from adarag.cli import main as cli_main
from tests.reliability.test_hostile_input import no_hang

KEY = "an-example-signing-key-of-32-bytes"
Case = Callable[[Path, pytest.MonkeyPatch, Path], list[str]]


def _config(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def _notes(root: Path) -> Path:
    notes = root / "notes.md"
    notes.write_text("The meeting moved to Thursday.\n")
    return notes


def _open_key_file(root: Path, monkeypatch: pytest.MonkeyPatch, model: Path) -> list[str]:
    key = root / "signing.key"
    key.write_text(KEY + "\n")
    key.chmod(0o666)
    config = _config(root / "c.json", {"cache": {"store": {"signing_key_file": str(key)}}})
    return ["--config", str(config), "ask", "when?", str(_notes(root)), "--model", str(model)]


def _short_key_in_the_environment(root, monkeypatch, model) -> list[str]:
    monkeypatch.setenv("ADARAG_KV_SIGNING_KEY", "short")
    return ["ask", "when?", str(_notes(root)), "--model", str(model)]


def _short_hand_over_key_in_the_environment(root, monkeypatch, model) -> list[str]:
    monkeypatch.setenv("ADARAG_HANDOFF_KEY", "short")
    return ["ask", "when?", str(_notes(root)), "--model", str(model)]


def _signing_key_true(root, monkeypatch, model) -> list[str]:
    config = _config(root / "c.json", {"cache": {"store": {"signing_key": True}}})
    return ["--config", str(config), "ask", "when?", str(_notes(root))]


def _chroma_dir_dev_null(root, monkeypatch, model) -> list[str]:
    return ["ingest", str(_notes(root)), "--chroma-dir", "/dev/null", "--model", str(model)]


def _huge_max_new_tokens(root, monkeypatch, model) -> list[str]:
    return ["ask", "when?", str(_notes(root)), "--max-new-tokens", "1000000000000"]


def _hand_over_directory(mode: int, owner: int | None) -> Case:
    def case(root: Path, monkeypatch: pytest.MonkeyPatch, model: Path) -> list[str]:
        handoff = root / "handoff"
        handoff.mkdir()
        handoff.chmod(mode)
        if owner is not None:
            os.chown(handoff, owner, owner)
        engine = {
            "backend": "vllm-server",
            "vllm_server_urls": ["http://127.0.0.1:9"],
            "vllm_handoff": str(handoff),
            "vllm_handoff_key": KEY,
            "model": str(model),
        }
        return ["--config", str(_config(root / "c.json", {"engine": engine})), "check"]

    return case


CASES: dict[str, tuple[Case, str]] = {
    "key file open to every user (0666)": (_open_key_file, "(mode 0666)"),
    "short signing key in the environment": (
        _short_key_in_the_environment,
        "$ADARAG_KV_SIGNING_KEY is shorter than 16 bytes",
    ),
    "short hand-over key in the environment": (
        _short_hand_over_key_in_the_environment,
        "$ADARAG_HANDOFF_KEY is shorter than 16 bytes",
    ),
    "signing_key of true": (_signing_key_true, "signing_key must be text, got true"),
    "--chroma-dir /dev/null": (_chroma_dir_dev_null, "cannot use /dev/null as the Chroma"),
    "--max-new-tokens 1000000000000": (_huge_max_new_tokens, "must be at most 8192"),
    "world-writable hand-over directory": (
        _hand_over_directory(0o777, None),
        "may be written by other users (mode 0777)",
    ),
    "hand-over directory of another user": (
        _hand_over_directory(0o700, 65534),
        "belongs to uid 65534, not to this user",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_option_key_or_directory_exits_2_with_one_line(
    tiny_checkpoints, tmp_path, monkeypatch, capsys, ledger, case
):
    make, expected = CASES[case]
    if "another user" in case and os.geteuid() != 0:
        pytest.skip("handing a directory to another user needs root")
    monkeypatch.setenv("ADARAG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ADARAG_KV_SIGNING_KEY", raising=False)
    monkeypatch.delenv("ADARAG_HANDOFF_KEY", raising=False)
    argv = make(tmp_path, monkeypatch, tiny_checkpoints["llama"])
    capsys.readouterr()
    with no_hang(60):
        try:
            status = cli_main(argv)
        except SystemExit as exited:  # argparse's own refusal of an option
            status = exited.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    command = argv[argv.index("--config") + 2] if "--config" in argv else argv[0]
    handled = (
        status == 2
        and len(lines) == 1
        and lines[0].startswith(f"adarag {command}: error: ")
        and expected in lines[0]
        and KEY not in captured.err + captured.out
    )
    ledger.record(f"CLI: {case}", detected=int(handled))
    assert handled, (status, captured.err)
