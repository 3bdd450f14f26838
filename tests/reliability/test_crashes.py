"""``kill -9`` in the middle of warming, ingesting and a query's write-back, then restart.

Each case starts a real process (``crash_child``), kills it by pid at a chosen moment (a KV
file half-written, a batch of chunks half-embedded), and checks what the next process sees: no
partial entry, no lock that blocks, every stored entry intact (it equals a fresh computation),
and after a re-run the knowledge base and the KV store agree (every chunk has its KV).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from adarag import AdaRAG, AdaRagConfig
from adarag.cache.disk import STAGING_PREFIX, SUFFIX
from adarag.cli import main as cli_main
from adarag.engine.prefill_request import PrefillRequest
from adarag.retrievers import KnowledgeBase
from adarag.schema import PromptLayout
from tests.reliability.conftest import FULL, scale
from tests.reliability.crash_child import passages

REPO = Path(__file__).resolve().parents[2]
NUM_CHUNKS = scale(12, 30)


class Child:
    """A crash_child process whose output lines are collected as they come."""

    def __init__(self, mode: str, config_path: Path, arg: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.crash_child", mode, str(config_path), arg],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.output = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        while chunk := self.process.stdout.read1(4096):  # type: ignore[attr-defined]
            self.output += chunk.decode(errors="replace")

    def kill_when(self, ready: Callable[[], bool], timeout: float = 120.0) -> bool:
        """SIGKILL the process as soon as ``ready()``; False when it ended first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
                return True
            if self.process.poll() is not None:
                return False
            time.sleep(0.001)
        self.process.kill()
        raise AssertionError(f"the moment never came; output:\n{self.output}")

    def lines(self, prefix: str) -> int:
        return sum(line.startswith(prefix) for line in self.output.splitlines())


def _staging(directory: Path) -> list[Path]:
    return list(directory.glob(f"{STAGING_PREFIX}*")) if directory.is_dir() else []


def _entries(directory: Path) -> list[Path]:
    return list(directory.glob(f"*{SUFFIX}")) if directory.is_dir() else []


@pytest.fixture()
def config_file(tiny_checkpoints, tmp_path):
    config = AdaRagConfig.build(
        home=tmp_path / "home",
        engine={"model": str(tiny_checkpoints["llama"])},
        augment={"enabled": False},
        experimental={"augment": {"num_lens_layers": 2}},
        retrieval={"embedding_batch_size": 2},  # one chunk per passage, six batches or more
    )
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.model_dump(mode="json")))
    return config, path


def _check_store_intact(rag: AdaRAG, *, warmed: bool = True) -> int:
    """Every entry file on disk is whole; returns how many chunks' independent KV is stored.

    With ``warmed`` (entries written by ``warm``, each chunk computed alone after the system
    prefix) each also equals a fresh computation. A query's write-back stores chunks computed
    in their prompt's context, which only the integrity checks apply to.
    """
    directory = rag.kv_directory
    store = rag.cache.store  # opening it removes the dead writer's staging files
    assert _staging(directory) == [], "a partial entry is still visible"
    assert store.disk is not None
    engine, system_ids = rag.engine, rag.prompts.system_ids
    # warming computes each chunk after the system prefix's exact KV (never the stored copy)
    prefix = rag.engine.prefill(PrefillRequest(PromptLayout((), (), system_ids))).kv.segment(
        0, len(system_ids)
    )
    system_kv = prefix if rag.cache.system_kv() is not None else None
    checked = 0
    for text in passages(NUM_CHUNKS + 2):
        ids = rag.prompts.chunk_ids(text)
        keys = rag.cache.keys([ids])
        kv = store.get(keys.independent[0])
        if kv is None or system_kv is None:
            continue
        checked += 1
        if not warmed:
            continue
        computed = engine.compute_chunk(system_ids, ids, system_kv)
        fresh = store.codec.decode(store.codec.encode(computed))  # as the store keeps it
        assert torch.allclose(kv.k, fresh.k, atol=1e-5) and torch.allclose(kv.v, fresh.v, atol=1e-5)
    for header in store.disk.scan():  # every other file (write-backs) is whole
        assert store.disk.read(header.entry_id) is not None
    return checked


def _kill_points(points: list[int], full: list[int]) -> list[int]:
    return full if FULL else points


@pytest.mark.parametrize("after", _kill_points([2], [1, 3, 6, 10]))
def test_kill_during_warm_leaves_no_partial_entry_and_warm_resumes(config_file, after, ledger):
    config, path = config_file
    directory = AdaRAG(config).kv_directory
    child = Child("warm", path, str(NUM_CHUNKS))
    killed = child.kill_when(lambda: child.lines("warmed") >= after and bool(_staging(directory)))
    assert killed, "warm finished before the kill"
    rag = AdaRAG(config)
    intact = _check_store_intact(rag)
    assert intact >= after
    assert rag.warm(passages(NUM_CHUNKS)) == NUM_CHUNKS - intact  # resumes where it stopped
    assert _check_store_intact(AdaRAG(config)) == NUM_CHUNKS
    ledger.record("kill -9 during warm (mid-write)", data_lost=0)


@pytest.mark.parametrize("after", _kill_points([1], [1, 2, 4]))
def test_kill_during_write_back_leaves_no_partial_entry(config_file, after, ledger):
    config, path = config_file
    directory = AdaRAG(config).kv_directory
    child = Child("query", path, "6")
    killed = child.kill_when(lambda: child.lines("answered") >= after and bool(_staging(directory)))
    if not killed:  # write-backs are flushed at exit: the kill lands there
        pytest.fail(f"no write-back was caught in flight:\n{child.output}")
    rag = AdaRAG(config)
    _check_store_intact(rag, warmed=False)
    assert _entries(directory)  # what was written before the kill is still there
    ledger.record("kill -9 during a query's write-back", data_lost=0)


def _ingest_corpus(directory: Path) -> Path:
    path = directory / "passages.jsonl"
    lines = [
        json.dumps({"title": f"river {i}", "text": text})
        for i, text in enumerate(passages(NUM_CHUNKS))
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _embedded(output: str) -> int:
    """Chunks embedded so far, from the ingest command's progress bar."""
    found = re.findall(r"embedding chunks.*?(\d+)/\d+", output)
    return max((int(n) for n in found), default=0)


INGEST_POINTS = {
    "mid-embedding": lambda child, kv: _embedded(child.output) >= 2,
    "after the chunks were stored": lambda child, kv: "ingested 1 file" in child.output,
    "mid-warm": lambda child, kv: len(_entries(kv)) >= 3 and bool(_staging(kv)),
}


@pytest.mark.parametrize("moment", list(INGEST_POINTS) if FULL else ["mid-embedding", "mid-warm"])
def test_kill_during_ingest_then_rerun_agrees(
    config_file, tmp_path, moment, ledger, capsys, caplog
):
    config, path = config_file
    corpus = _ingest_corpus(tmp_path)
    kv_directory = AdaRAG(config).kv_directory
    child = Child("ingest", path, str(corpus))
    killed = child.kill_when(lambda: INGEST_POINTS[moment](child, kv_directory))
    assert killed, f"ingest finished before the kill:\n{child.output}"

    # the lock of the killed process does not block: the re-run completes the job
    assert cli_main(["--config", str(path), "ingest", str(corpus)]) == 0
    capsys.readouterr()
    assert f"left by pid {child.process.pid}, which is no longer running" in caplog.text
    caplog.clear()
    with KnowledgeBase.from_config(config, create=False) as kb:
        chunks = kb.chunks()
        ids = [str(chunk.chunk_id) for chunk in chunks]
        assert len(ids) == len(set(ids)) == NUM_CHUNKS  # nothing lost, nothing doubled
        rag = AdaRAG(config)
        missing = [
            c for c in chunks if not rag.cache.has_independent(rag.prompts.chunk_ids(c.text))
        ]
    assert missing == [], f"{len(missing)} chunks in Chroma have no KV"
    assert "recovered the lock" not in caplog.text  # the re-run released it cleanly
    _check_store_intact(rag)
    ledger.record(f"kill -9 during ingest ({moment})", data_lost=len(missing))
