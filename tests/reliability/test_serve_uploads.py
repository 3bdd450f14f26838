"""Uploads under load: many of one name, large ones, and more at once than the server parses.

- Two uploads of one name could leave the knowledge base holding the older text while the newer
  one was on disk (24 parallel uploads: disk version 223, knowledge base 220, listed processed):
  the file was renamed into place before its generation was taken. Both now happen under one
  lock, so the last upload kept is the one ingested.
- An upload was held in memory about four times (+243 MiB of peak memory for 60 MiB) and any
  number were parsed at once; now the body goes to disk as it arrives, is parsed from the file
  in a worker process, and at most ``serve.max_concurrent_uploads`` are received and parsed at
  once.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.reliability.conftest import scale
from tests.reliability.docx_bomb import docx_bomb
from tests.reliability.http_server import peak_rss_bytes
from tests.reliability.kb_server import kb_serving, start_kb_server_process, wait_processed
from tests.reliability.test_serve_parse import parse_workers

MIB = 1024 * 1024
PURPOSE = {"purpose": "assistants"}  # every multipart upload names one


def test_the_last_of_many_uploads_of_one_name_is_the_one_stored(tiny_checkpoints, tmp_path, ledger):
    """Before: parallel uploads of one name left the knowledge base on an older one."""
    num_uploads = 24
    rounds = scale(3, 10)
    with kb_serving(
        tiny_checkpoints["llama"], tmp_path, max_concurrent_uploads=8, default_max_tokens=1
    ) as (served, kb):
        mismatched = 0
        for round_idx in range(rounds):

            def send(version: int, round_idx=round_idx) -> None:
                text = f"# Race\n\nround {round_idx} version {version} of the race notes\n"
                reply = httpx.post(
                    f"{served.url}/v1/files",
                    files={"file": ("race.md", text.encode())},
                    data={"purpose": "assistants"},
                    timeout=120,
                )
                assert reply.status_code == 200, reply.text

            with ThreadPoolExecutor(num_uploads) as pool:
                list(pool.map(send, range(num_uploads)))
            entry = wait_processed(served, "race.md")
            assert entry["status"] == "processed", entry
            on_disk = (tmp_path / "documents" / "race.md").read_text()
            source = next(s for s in kb.sources() if s.endswith("race.md"))
            stored = " ".join(chunk.text for chunk in kb.chunks(sources=[source]))
            version = on_disk.split("version ")[1].split()[0]
            mismatched += f"round {round_idx} version {version} " not in stored
        assert mismatched == 0, f"{mismatched} of {rounds} rounds stored another version"
    ledger.record(
        f"HTTP: {num_uploads} parallel uploads of one name", cases=rounds, data_lost=mismatched
    )


def test_an_upload_goes_to_disk_not_memory(tiny_checkpoints, tmp_path, ledger):
    """Before: a 60 MiB upload raised the server's peak memory by 243 MiB."""
    settings = '{"serve": {"max_upload_bytes": 67108864}}'
    server, url = start_kb_server_process(tiny_checkpoints["llama"], tmp_path, settings)
    try:
        small = httpx.post(
            f"{url}/v1/files", files={"file": ("warm.md", b"# a\n\nwords\n")}, data=PURPOSE
        )
        assert small.status_code == 200, small.text
        time.sleep(1)
        before = peak_rss_bytes(server.pid)
        blank = b"\n" * (60 * MIB)  # a file of 60 MiB that holds no text: nothing to embed
        reply = httpx.post(
            f"{url}/v1/files", files={"file": ("blank.md", blank)}, data=PURPOSE, timeout=300
        )
        assert reply.status_code == 200, reply.text
        grown_mib = (peak_rss_bytes(server.pid) - before) / MIB
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert grown_mib < 40, grown_mib
    ledger.record("HTTP: 60 MiB upload held in memory", cases=1)
    ledger.extra["http_upload_memory"] = {
        "upload_mib": 60,
        "peak_memory_growth_mib": round(grown_mib, 1),
    }


def test_at_most_max_concurrent_uploads_are_parsed_at_once(tiny_checkpoints, tmp_path, ledger):
    """Before: any number of uploads were parsed at once."""
    slow = docx_bomb(100_000)
    retrieval = {"max_parse_seconds": 2.0}
    with kb_serving(
        tiny_checkpoints["llama"], tmp_path, retrieval=retrieval, max_concurrent_uploads=2
    ) as (served, _):
        most = 0
        stop = threading.Event()

        def sample() -> None:
            nonlocal most
            while not stop.is_set():
                most = max(most, len(parse_workers(os.getpid())))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()

        def send(idx: int) -> int:
            files = {"file": (f"slow{idx}.docx", slow)}
            reply = httpx.post(f"{served.url}/v1/files", files=files, data=PURPOSE, timeout=300)
            return reply.status_code

        try:
            with ThreadPoolExecutor(6) as pool:
                statuses = list(pool.map(send, range(6)))
        finally:
            stop.set()
            sampler.join()
    assert statuses == [422] * 6
    assert 1 <= most <= 2, most
    ledger.record("HTTP: 6 slow uploads at once (2 parsed at a time)", cases=6)


@pytest.fixture(autouse=True)
def _no_worker_left():
    yield
    assert parse_workers(os.getpid()) == []
