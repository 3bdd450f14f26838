"""A document that is slow to parse is refused at ``retrieval.max_parse_seconds``, and stops
nothing: not the other routes, not a shutdown.

The 82 KB Word file of 493,000 empty paragraphs (:mod:`tests.reliability.docx_bomb`) used to pin
a core for about 37 minutes in the server's default thread pool, stalling every route that uses
it, parsing on after its client hung up, and keeping the process alive after SIGTERM. Each parse
now runs in a worker process with a CPU and wall-clock deadline, killed at it, when the client
hangs up and when the server shuts down.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.reliability.docx_bomb import docx_bomb
from tests.reliability.kb_server import kb_serving, listed, start_kb_server_process

pytest.importorskip("docx")
LIMIT_S = 3.0


def parse_workers(parent: int) -> list[int]:
    """The pids of ``parent``'s parse worker processes."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:"))
        if int(ppid) == parent and b"parse_worker.py" in cmdline:
            found.append(int(entry.name))
    return found


def wait_for(condition, timeout_s: float) -> float:
    """Seconds until ``condition()`` holds (fails past ``timeout_s``)."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, "timed out"
        time.sleep(0.05)
    return time.monotonic() - started


def send_bomb(url: str) -> httpx.Response:
    files = {"file": ("minutes.docx", docx_bomb())}
    return httpx.post(f"{url}/v1/files", files=files, data={"purpose": "assistants"}, timeout=600)


def test_a_docx_bomb_is_refused_within_the_parse_deadline(tiny_checkpoints, tmp_path, ledger):
    """Before: an 83 KB .docx pinned a core for ~37 min and stalled other routes."""
    retrieval = {"max_parse_seconds": LIMIT_S}
    with kb_serving(tiny_checkpoints["llama"], tmp_path, retrieval=retrieval) as (served, _):
        health_s: list[float] = []
        stop = threading.Event()

        def probe_health() -> None:
            while not stop.is_set():
                started = time.monotonic()
                assert httpx.get(f"{served.url}/health", timeout=30).status_code == 200
                assert httpx.get(f"{served.url}/v1/files", timeout=30).status_code == 200
                health_s.append(time.monotonic() - started)
                time.sleep(0.2)

        prober = threading.Thread(target=probe_health)
        prober.start()
        started = time.monotonic()
        try:
            reply = send_bomb(served.url)
        finally:
            refused_s = time.monotonic() - started
            stop.set()
            prober.join()
        assert reply.status_code == 422, reply.text
        error = reply.json()["error"]
        assert error["code"] == "parse_timeout"
        assert "retrieval.max_parse_seconds" in error["message"]
        assert "minutes.docx" in error["message"]
        assert str(tmp_path) not in reply.text
        assert refused_s < LIMIT_S + 10  # the limit, plus the worker's start on a busy machine
        assert parse_workers(os.getpid()) == []
        assert "minutes.docx" not in listed(served)
        assert health_s and max(health_s) < 2.0  # other routes answered throughout
        ok = httpx.post(f"{served.url}/v1/files", json={"filename": "a.md", "text": "a b"})
        assert ok.status_code == 200, ok.text  # the next upload is parsed as usual
    ledger.record("HTTP: .docx bomb (493K empty paragraphs)", cases=1)
    ledger.extra["http_parse_bomb"] = {
        "docx_bytes": len(docx_bomb()),
        "max_parse_seconds": LIMIT_S,
        "refused_after_s": round(refused_s, 2),
        "slowest_other_request_s": round(max(health_s), 3),
    }


def test_a_client_hanging_up_kills_its_parse(tiny_checkpoints, tmp_path, ledger):
    """Before: a parse went on after its client hung up."""
    retrieval = {"max_parse_seconds": 600}
    with kb_serving(tiny_checkpoints["llama"], tmp_path, retrieval=retrieval) as (served, _):
        body = docx_bomb()
        boundary = "bomb-boundary"
        part = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n'
            f"assistants\r\n"
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            'filename="minutes.docx"\r\n\r\n'
        ).encode()
        payload = part + body + f"\r\n--{boundary}--\r\n".encode()
        head = (
            "POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", served.port)) as sock:
            sock.sendall(head + payload)
            wait_for(lambda: parse_workers(os.getpid()), 60)
        killed_s = wait_for(lambda: not parse_workers(os.getpid()), 10)
    ledger.record("HTTP: client hangs up during a parse", cases=1)
    ledger.extra.setdefault("http_parse_bomb", {})["worker_killed_after_hang_up_s"] = round(
        killed_s, 2
    )


def test_sigterm_during_a_parse_exits_within_5_s(tiny_checkpoints, tmp_path, ledger):
    """Before: after SIGTERM the server logged its shutdown but never exited."""
    settings = '{"retrieval": {"max_parse_seconds": 600}, "serve": {}}'
    server, url = start_kb_server_process(tiny_checkpoints["llama"], tmp_path, settings)
    try:
        replies: list[httpx.Response | Exception] = []

        def upload() -> None:
            try:
                replies.append(send_bomb(url))
            except httpx.HTTPError as err:
                replies.append(err)

        uploader = threading.Thread(target=upload)
        uploader.start()
        wait_for(lambda: parse_workers(server.pid), 60)
        worker = parse_workers(server.pid)[0]
        started = time.monotonic()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        finally:
            exit_s = time.monotonic() - started
        uploader.join(timeout=30)
        assert server.returncode == 0
        assert exit_s <= 5.0, exit_s
        assert not Path(f"/proc/{worker}").exists()  # the worker went with it
        assert replies and (isinstance(replies[0], Exception) or replies[0].status_code == 503), (
            replies
        )
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    ledger.record("HTTP: SIGTERM during a parse", cases=1)
    ledger.extra.setdefault("http_parse_bomb", {})["sigterm_exit_s"] = round(exit_s, 2)
