"""`adarag ingest` (the real command, model and embedding model) under storage faults.

A KV directory on a full tmpfs made ingest exit 1 with a traceback; a file name that is not
UTF-8 made Chroma raise. Both now end with exit status 2 and one error line, and nothing stored
before is lost. The tests share one knowledge base and KV directory, in this order (the last
fills the directory).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from adarag.cli import main as cli_main
from adarag.config import AdaRagConfig
from adarag.retrievers import KnowledgeBase
from tests.reliability.filesystems import fill, small_tmpfs
from tests.reliability.test_hostile_input import no_hang, tree_digest


@pytest.fixture(scope="module")
def cli_setup(tiny_checkpoints, tmp_path_factory):
    """(config file, KV mountpoint, good file) with the good file ingested and warmed.

    The tiny model computes the KV (what is stored does not matter here, only where); the
    embedding model is the real one.
    """
    root = tmp_path_factory.mktemp("ingest-cli")
    with small_tmpfs(root / "kv", 4 * 1024) as mountpoint:
        config = root / "config.json"
        config.write_text(
            json.dumps(
                {
                    "home": str(root / "home"),
                    "engine": {"model": str(tiny_checkpoints["llama"])},
                    "cache": {"store": {"directory": str(mountpoint)}},
                }
            )
        )
        good = root / "good.md"
        good.write_text("Lothair II was king of Lotharingia. His mother Ermengarde died in 851.\n")
        assert cli_main(["--config", str(config), "ingest", str(good)]) == 0
        assert tree_digest(mountpoint), "warming the good file wrote no KV"
        yield config, mountpoint, good


def _chunk_ids(config: Path) -> set[str]:
    with KnowledgeBase.from_config(AdaRagConfig.from_file(config)) as kb:
        return set(kb.collection.get()["ids"])


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("adarag ingest: error: ")]


def test_ingest_of_a_file_name_that_is_not_utf8_names_it_and_strict_exits_2(
    cli_setup, tmp_path, capsys, ledger
):
    """A folder's file whose name is not UTF-8 is left out and named; ``--strict`` refuses."""
    config, mountpoint, good = cli_setup
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / os.fsdecode(b"caf\xe9.md")).write_text("A note with a latin-1 file name.\n")
    before = (_chunk_ids(config), tree_digest(mountpoint))
    capsys.readouterr()
    argv = ["--config", str(config), "ingest", "--no-warm", str(good), str(folder)]
    strict = cli_main([*argv, "--strict"])
    err = capsys.readouterr().err
    refused = strict == 2 and "caf\\xe9.md" in err and "Traceback" not in err
    unchanged = (_chunk_ids(config), tree_digest(mountpoint)) == before
    status = cli_main(argv)
    out = capsys.readouterr()
    named = status == 0 and "caf\\xe9.md" in out.out and "Traceback" not in out.err
    handled = refused and unchanged and named
    ledger.record("adarag ingest of a file name not UTF-8", detected=int(handled))
    assert handled, (strict, err, status, out)


def test_ingest_into_a_full_kv_directory_exits_2_with_one_line(cli_setup, tmp_path, capsys, ledger):
    config, mountpoint, _ = cli_setup
    kv_before = tree_digest(mountpoint)
    chunks_before = _chunk_ids(config)
    fill(mountpoint)
    new = tmp_path / "new.md"
    new.write_text("Berlin is the capital of Germany. The Spree runs through Berlin.\n")
    capsys.readouterr()
    with no_hang(300):
        status = cli_main(["--config", str(config), "ingest", str(new)])
    err = capsys.readouterr().err
    lines = _error_lines(err)
    kv_after = {
        name: digest for name, digest in tree_digest(mountpoint).items() if name in kv_before
    }
    handled = status == 2 and len(lines) == 1 and "Traceback" not in err
    lost = sum(kv_after.get(name) != digest for name, digest in kv_before.items())
    lost += len(chunks_before - _chunk_ids(config))
    ledger.record("adarag ingest into a full KV directory", detected=int(handled), data_lost=lost)
    assert handled, (status, err)
    assert "No space left on device" in lines[0] and "adarag ingest" in lines[0]
    assert lost == 0
