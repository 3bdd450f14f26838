"""Hub ids resolved offline from a Hugging Face cache built here, laid out as the Hub lays it out.

A tiny random-weight checkpoint is stored as ``models--<org>--<name>/blobs/<sha256>``, linked from
``snapshots/<commit>/<file>``, with ``refs/main`` naming the commit.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import huggingface_hub.constants
import pytest

from adarag.cli import main
from adarag.engine.checkpoint import Checkpoint
from adarag.engine.provision import is_hub_id, resolve_checkpoint
from adarag.errors import ModelLoadError

REPO_ID = "tiny-org/Tiny-Llama-Instruct"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _store_in_hub_cache(checkpoint: Path, cache: Path, repo_id: str) -> Path:
    """Lay ``checkpoint``'s files out as ``hf download`` stores them; return the snapshot."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in sorted(checkpoint.iterdir()):
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", blob.name))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


@pytest.fixture()
def hub_cache(tiny_checkpoints, tmp_path, monkeypatch):
    cache = tmp_path / "hf-cache"
    snapshot = _store_in_hub_cache(tiny_checkpoints["llama"], cache, REPO_ID)
    # huggingface_hub reads HF_HUB_CACHE once, at import; the module constant is what it uses
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return snapshot


def test_a_hub_id_resolves_to_its_cached_snapshot_under_the_repository_name(hub_cache, tmp_path):
    path = resolve_checkpoint(REPO_ID, tmp_path / "home")
    assert path.resolve() == hub_cache.resolve()
    checkpoint = Checkpoint.open(REPO_ID, tmp_path / "home")
    assert checkpoint.name == "Tiny-Llama-Instruct"  # not the commit the snapshot is named by


def test_a_hub_id_answers_from_the_cache_on_the_command_line(
    hub_cache, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("ADARAG_HOME", str(tmp_path / "home"))
    config = tmp_path / "tiny.json"
    config.write_text(
        '{"experimental": {"augment": {"num_lens_layers": 2}}}'
    )  # the tiny model has 2 layers
    notes = tmp_path / "notes.md"
    notes.write_text("Paris is the capital of France. Berlin is the capital of Germany.\n")
    question = "what is the capital of france?"
    argv = ["ask", "--model", REPO_ID, question, str(notes), "--max-new-tokens", "4"]
    assert main([*argv, "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "precomputed 1 of 1 chunks" in out and "answer: " in out


def test_a_hub_id_missing_from_the_cache_names_the_cache_and_the_fix(hub_cache, tmp_path):
    with pytest.raises(ModelLoadError) as error:
        resolve_checkpoint("tiny-org/Not-Downloaded", tmp_path / "home")
    message = str(error.value)
    assert str(hub_cache.parents[2]) in message  # the cache looked in
    assert "hf download tiny-org/Not-Downloaded" in message and "HF_HUB_CACHE" in message


def test_a_local_directory_wins_over_a_hub_id_of_the_same_spelling(
    hub_cache, tiny_checkpoints, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "tiny-org" / "Tiny-Llama-Instruct"
    shutil.copytree(tiny_checkpoints["qwen2"], local)
    assert resolve_checkpoint(REPO_ID, tmp_path / "home") == Path(REPO_ID)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", True),
        ("meta-llama/Llama-3.1-8B", True),
        ("./models/x", False),
        ("/abs/path", False),
        ("models/x/y", False),
        ("a/../b", False),
        ("org--x/name", False),
        ("smollm2-135m", False),
    ],
)
def test_only_org_slash_name_reads_as_a_hub_id(model, expected):
    assert is_hub_id(model) is expected
