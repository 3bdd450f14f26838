"""The KV directory under real file-system faults: full, read-only, out of descriptors, refused.

- A full (ENOSPC) or read-only (EROFS) directory -- a real tmpfs -- leaves the pipeline answering
  every question exactly as before, with one warning and ``cache_disk_problem`` saying why; the
  files already there are still served and none is lost.
- An error opening an entry file that says nothing about its content (EMFILE for real, EACCES
  and EIO through a failing ``os.open``) is a miss that keeps the file; it is served again once
  the error passes. Only proven damage deletes a file.
- A staging file of another host or PID namespace (a live writer in another container sharing
  the volume) is left alone until it is old; one of a dead writer here is removed.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from adarag import AdaRAG
from adarag.cache.disk import SUFFIX
from adarag.cache.staging import STAGING_MAX_AGE_S, STAGING_PREFIX, writer_id
from adarag.cache.store import LayeredKVStore
from adarag.config import AdaRagConfig, StoreConfig
from adarag.kv import ChunkKV
from adarag.schema import GenerationParams
from tests.reliability.filesystems import (
    descriptors_exhausted,
    failing_open,
    fill,
    remount_read_only,
    small_tmpfs,
)
from tests.unit.engine.helpers import CHUNKS, QUESTION, load_engine

PARAMS = GenerationParams(max_new_tokens=6)
STATIC = {"enabled": False}
MORE_CHUNKS = (
    "madrid is the capital of spain and lies on the manzanares.",
    "rome is the capital of italy; the tiber runs through rome.",
)
QUESTIONS = (QUESTION, "what river runs through rome?", "which city lies on the spree?")


@pytest.fixture(scope="module")
def engine(tiny_checkpoints, tmp_path_factory):
    home = tmp_path_factory.mktemp("gen-home")
    config = AdaRagConfig.build(home=home, engine={"model": str(tiny_checkpoints["llama"])})
    return load_engine(config)


def _answers(rag: AdaRAG) -> list[tuple[str, tuple[str, ...]]]:
    chunks = [*CHUNKS, *MORE_CHUNKS]
    found = []
    for question in QUESTIONS:
        answer = rag.query(question, chunks=chunks, params=PARAMS)
        found.append((answer.text, answer.trace.steps[-1].tiers))
    return found


def _files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in directory.rglob(f"*{SUFFIX}")}


@pytest.fixture()
def pipelines(engine, tiny_checkpoints, tiny_config, tmp_path):
    """Pipelines on a KV directory (float32 storage: exact answers), by default inside a 2 MiB
    tmpfs."""
    with small_tmpfs(tmp_path / "mnt", 2048) as mountpoint:

        def make(directory: Path = mountpoint) -> AdaRAG:
            config = tiny_config(
                tiny_checkpoints["llama"],
                augment=STATIC,
                cache={"store": {"directory": str(directory), "storage_dtype": "float32"}},
            )
            return AdaRAG(config, loaded_engine=engine)

        yield make, mountpoint


def _warm_then_answer(make, directory: Path, fault) -> tuple[AdaRAG, int, list]:
    """Warm CHUNKS, close, apply ``fault``; a new pipeline warms MORE_CHUNKS and answers."""
    writer = make(directory)
    writer.warm(CHUNKS)
    writer.close()
    fault(directory)
    rag = make(directory)
    warmed = rag.warm(MORE_CHUNKS)  # computed, kept in memory: no OSError
    answers = _answers(rag)
    rag.close()
    return rag, warmed, answers


@pytest.mark.parametrize("fault", ["full (ENOSPC)", "read-only (EROFS)"])
def test_a_full_or_read_only_kv_directory_leaves_every_answer_and_every_file(
    pipelines, fault, caplog, ledger, tmp_path
):
    make, mountpoint = pipelines
    # the reference: the same steps on a healthy directory
    _, _, reference = _warm_then_answer(make, tmp_path / "healthy", lambda directory: None)
    stored: dict[str, bytes] = {}

    def apply(directory: Path) -> None:
        stored.update(_files(directory))
        fill(directory) if fault.startswith("full") else remount_read_only(directory)

    with caplog.at_level(logging.WARNING, logger="adarag.cache.disk"):
        rag, warmed, answers = _warm_then_answer(make, mountpoint, apply)
    problems = [r for r in caplog.records if "cannot be written" in r.getMessage()]
    lost = sum(_files(mountpoint).get(name) != data for name, data in stored.items())
    wrong = sum(got != want for got, want in zip(answers, reference, strict=True))
    ledger.record(
        f"KV directory {fault}",
        cases=len(QUESTIONS),
        detected=len(QUESTIONS) * int(rag.cache_disk_problem is not None and len(problems) == 1),
        wrong_answers=wrong,
        data_lost=lost,
    )
    assert len(stored) == 4  # the three chunks and the system prompt
    assert warmed == 2
    assert wrong == 0 and lost == 0, (answers, reference)
    assert rag.cache_disk_problem is not None and len(problems) == 1
    code = "ENOSPC" if fault.startswith("full") else "EROFS"
    assert code in rag.cache_disk_problem
    # the entries already there were served from disk
    assert answers[0][1][:3] == ("hard", "independent", "independent")


def test_a_server_on_a_full_kv_directory_answers_every_request_and_says_why(
    pipelines, engine, ledger
):
    """`adarag serve` used to answer the first question, then fail every request with 500."""
    from adarag import Chunk, MemoryRetriever
    from tests.integration.test_serve import API_KEY, openai_client, running

    make, mountpoint = pipelines
    writer = make()
    writer.warm(CHUNKS)
    writer.close()
    fill(mountpoint)
    rag = make()
    rag.retriever = MemoryRetriever([Chunk(text) for text in (*CHUNKS, *MORE_CHUNKS)])
    questions = [*QUESTIONS, "what runs through berlin?", "where is madrid?"]
    with running(rag) as server:
        client = openai_client(server)
        statuses = []
        for question in questions:
            try:
                client.chat.completions.create(
                    model="adarag",
                    messages=[{"role": "user", "content": question}],
                    max_tokens=4,
                )
                statuses.append(200)
            except Exception as err:  # any failed request is what this test looks for
                statuses.append(getattr(err, "status_code", 0))
        rag.close()  # the flush at shutdown writes nothing and raises nothing
        health = server.health()
    failed = sum(status != 200 for status in statuses)
    ledger.record(
        "adarag serve on a full KV directory",
        cases=len(questions),
        detected=len(questions) - failed,
        wrong_answers=failed,
    )
    assert failed == 0, statuses
    assert "ENOSPC" in (health.get("kv_disk_problem") or ""), health
    assert API_KEY  # the server required it


def _kv(value: float) -> ChunkKV:
    shape = (2, 8, 2, 4)
    return ChunkKV(torch.full(shape, value), torch.full(shape, -value), 3)


def _disk_store(directory: Path) -> LayeredKVStore:
    return LayeredKVStore(StoreConfig(storage_dtype="float32"), directory, "model-a")


@pytest.mark.parametrize("error", ["EMFILE", "EACCES", "EIO"])
def test_an_error_opening_a_valid_file_keeps_it_and_serves_it_later(
    tmp_path, monkeypatch, error, ledger
):
    directory = tmp_path / "kv"
    _disk_store(directory).put(["hard", "soft"], _kv(1.5), persist=True)
    (path,) = directory.glob(f"*{SUFFIX}")
    content = path.read_bytes()
    store = _disk_store(directory)  # a restart: the entry is on disk only

    if error == "EMFILE":  # real: every descriptor of this process is taken
        with descriptors_exhausted():
            during = store.get("hard")
    else:
        code = getattr(errno, error)
        with failing_open(monkeypatch, lambda name: name.endswith(SUFFIX), code) as refused:
            during = store.get("hard")
            # the caller recomputes and writes back under the same keys: the file stays
            store.put(["hard", "soft"], _kv(1.5))
        assert refused, "the fault layer was not reached"
    kept = path.is_file() and path.read_bytes() == content
    after = _disk_store(directory).get("soft")
    served_later = after is not None and torch.equal(after.k, _kv(1.5).k)
    ledger.record(
        f"KV file open error ({error})",
        detected=int(during is None and kept and served_later),
        data_lost=int(not kept),
    )
    assert during is None, "a read that failed served something"
    assert kept, f"{error}: a valid file was deleted"
    assert served_later
    assert store.snapshot().disk_read_errors == 1


def test_staging_files_of_other_namespaces_are_aged_out_never_judged_by_pid(tmp_path, ledger):
    directory = tmp_path / "kv"
    directory.mkdir()
    # another container's live writer: its namespace is not ours, its pid is not running here
    dead_pid = 4_000_000  # above pid_max: no process here has it
    foreign = directory / f"{STAGING_PREFIX}0123456789ab-{dead_pid}-{'0' * 32}"
    foreign.write_bytes(b"partial")
    old_foreign = directory / f"{STAGING_PREFIX}0123456789ab-{dead_pid}-{'1' * 32}"
    old_foreign.write_bytes(b"partial")
    old = time.time() - STAGING_MAX_AGE_S - 1
    os.utime(old_foreign, (old, old))
    # a live writer of this namespace (this process), and a dead one
    namespace = writer_id().split("-")[0]
    live = directory / f"{STAGING_PREFIX}{writer_id()}-{'3' * 32}"
    live.write_bytes(b"partial")
    dead = directory / f"{STAGING_PREFIX}{namespace}-{dead_pid}-{'2' * 32}"
    dead.write_bytes(b"partial")
    _disk_store(directory)  # opening the directory cleans up
    kept = foreign.exists() and live.exists()
    removed = not old_foreign.exists() and not dead.exists()
    ledger.record(
        "another container's live staging file", detected=int(kept), data_lost=int(not kept)
    )
    assert kept, "a live writer's staging file was deleted"
    assert removed, "a dead writer's (or an old foreign) staging file was kept"


_CONTAINER_WRITER = """
import os, sys, time
from pathlib import Path
import torch
from adarag.kv import ChunkKV
from adarag.cache.store import LayeredKVStore
from adarag.config import StoreConfig

# a pid this namespace has and the test's has not (its pid_max is lower)
Path("/proc/sys/kernel/ns_last_pid").write_text("299999")
pid = os.fork()
if pid == 0:
    def stalled_fsync(fd):  # a slow disk: the write stays staged while the test looks
        print("staging", os.getpid(), flush=True)
        time.sleep(120)
    os.fsync = stalled_fsync
    store = LayeredKVStore(StoreConfig(), Path(sys.argv[1]), "model-a")
    shape = (2, 8, 2, 4)
    store.put(["key"], ChunkKV(torch.ones(shape), torch.ones(shape), 0), persist=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_a_live_writer_in_another_pid_namespace_keeps_its_staging_file(tmp_path, ledger):
    """Two containers on one KV volume: the other's live writer has a pid that is dead here."""
    directory = tmp_path / "kv"
    directory.mkdir()
    command = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c"]
    writer = subprocess.Popen(
        [*command, _CONTAINER_WRITER, str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        line = writer.stdout.readline().split()
        if not line:
            pytest.skip(f"cannot start a PID namespace here: {writer.stderr.read()[-300:]}")
        writer_pid = int(line[1])
        assert not os.path.exists(f"/proc/{writer_pid}"), "the writer's pid also exists here"
        (staging,) = directory.glob(f"{STAGING_PREFIX}*")
        _disk_store(directory)  # another container opens the volume
        kept = staging.exists()
    finally:
        os.killpg(writer.pid, 9)
        writer.wait()
    ledger.record(
        "live writer in another PID namespace", detected=int(kept), data_lost=int(not kept)
    )
    assert kept, "another container's live staging file was deleted"
