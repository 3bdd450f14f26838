"""``adarag serve`` on loopback for the HTTP attack tests: a tiny model, a key, raw sockets.

:func:`serving` runs the server in a thread of the test process; ``python -m
tests.reliability.http_server CHECKPOINT HOME KEY`` runs one in a process of its own (its
memory is measured) and prints ``port N`` once it listens. :func:`exchange` speaks HTTP/1.1 over
a plain socket, so a test can send a body slowly, partly or not at all.
"""

from __future__ import annotations

import json
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from adarag import AdaRAG, AdaRagConfig, Chunk, MemoryRetriever
from adarag.config import ServeConfig
from adarag.serve import AdaRagServer, create_app

API_KEY = "reliability-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
PASSAGES = (
    "paris is the capital of france and the seine runs through it.",
    "berlin is the capital of germany; the spree runs through berlin.",
)
SOURCE_DIR = "/srv/private/knowledge"
"""Where the passages' files "are" on the server: never shown to clients."""


def tiny_rag(checkpoint: Path, home: Path) -> AdaRAG:
    """A pipeline over the tiny checkpoint; its chunks carry server paths as an ingest's do."""
    config = AdaRagConfig.build(
        home=home,
        engine={"model": str(checkpoint)},
        experimental={"augment": {"num_lens_layers": 2}},
    )
    chunks = [
        Chunk(text, metadata={"source": f"{SOURCE_DIR}/notes/file{idx}.md", "chunk_idx": 0})
        for idx, text in enumerate(PASSAGES)
    ]
    return AdaRAG(config, retriever=MemoryRetriever(chunks))


@dataclass
class Served:
    server: AdaRagServer
    thread: threading.Thread
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible API's base URL."""
        return f"{self.url}/v1"

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health").json()


@contextmanager
def serving(rag: AdaRAG, api_key: str | None = API_KEY, **serve) -> Iterator[Served]:
    """A server over ``rag`` in a thread of this process, on a free loopback port."""
    config = ServeConfig(port=0, **serve)
    server = AdaRagServer(create_app(rag, config, api_key=api_key), config, log_level="warning")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield Served(server, thread, server.bound_port)
    finally:
        server.handle_exit(signal.SIGTERM, None)
        thread.join(timeout=120)
        assert not thread.is_alive(), "the server did not stop"


@dataclass
class Reply:
    status: int | None  # None: the connection closed with no response
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


def head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def exchange(
    port: int,
    request_head: bytes,
    body_parts: Iterable[bytes] = (),
    *,
    timeout_s: float = 30.0,
    pause_s: float = 0.0,
) -> Reply:
    """Send ``request_head`` then each body part (``pause_s`` apart); read the response.

    Parts the server no longer reads (it answered, or closed) are not sent; a status of None
    means no response came within ``timeout_s`` of the last thing sent or received.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        try:
            sock.sendall(request_head)
            for part in body_parts:
                time.sleep(pause_s)
                sock.sendall(part)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the server answered (or stopped reading) without reading the rest
        return _read_reply(sock)


def _read_reply(sock: socket.socket) -> Reply:
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            piece = sock.recv(65536)
            if not piece:
                break
            data += piece
    except (ConnectionResetError, TimeoutError):
        pass
    if b"\r\n\r\n" not in data:
        return Reply(None, {}, data)
    raw_head, body = data.split(b"\r\n\r\n", 1)
    status_line, *header_lines = raw_head.decode("latin-1").split("\r\n")
    headers = {
        name.strip().lower(): value.strip()
        for name, value in (line.split(":", 1) for line in header_lines)
    }
    length = int(headers.get("content-length", "0"))
    try:
        while len(body) < length:
            piece = sock.recv(65536)
            if not piece:
                break
            body += piece
    except (ConnectionResetError, TimeoutError):
        pass
    return Reply(int(status_line.split()[1]), headers, body)


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident memory (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def main(checkpoint: str, home: str, api_key: str) -> None:
    rag = tiny_rag(Path(checkpoint), Path(home))
    with serving(rag, api_key=api_key) as served:
        sys.stdout.write(f"port {served.port}\n")
        sys.stdout.flush()
        sys.stdin.read()  # until the test closes our stdin


if __name__ == "__main__":
    main(*sys.argv[1:4])
