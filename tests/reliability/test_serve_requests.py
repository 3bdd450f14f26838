"""Requests that cost the server more than they should: too many given chunks, ambiguous framing.

- ``/v1/rag/query`` took any number of caller-given ``chunks`` (5,000 were accepted and worked
  on until the request timed out): retrieval is capped at ``retrieval.max_top_k``, given chunks
  now are too, with a 400 before any prefill.
- A request with both ``Content-Length`` and ``Transfer-Encoding`` was served and its
  connection kept open; RFC 9112 (section 6.1) asks the server to close it after responding.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.reliability.http_server import AUTH, Served, _read_reply, serving, tiny_rag


@pytest.fixture(scope="module")
def server(tiny_checkpoints, tmp_path_factory) -> Iterator[Served]:
    rag = tiny_rag(tiny_checkpoints["llama"], tmp_path_factory.mktemp("requests-home"))
    with serving(rag) as served:
        yield served


def test_more_given_chunks_than_max_top_k_are_refused_before_any_prefill(server, ledger):
    """Before: 5,000 given chunks were accepted."""
    max_top_k = 64  # retrieval.max_top_k's default
    for count in (max_top_k + 1, 5000):
        body = {"question": "what?", "chunks": [f"chunk {i}" for i in range(count)]}
        started = time.monotonic()
        reply = httpx.post(f"{server.url}/v1/rag/query", json=body, headers=AUTH, timeout=30)
        assert reply.status_code == 400, reply.text
        assert time.monotonic() - started < 5
        error = reply.json()["error"]
        assert error["param"] == "chunks" and "retrieval.max_top_k=64" in error["message"]
    body = {"question": "what?", "chunks": ["paris is in france"] * 2, "max_new_tokens": 1}
    reply = httpx.post(f"{server.url}/v1/rag/query", json=body, headers=AUTH, timeout=120)
    assert reply.status_code == 200, reply.text
    ledger.record("HTTP: more given chunks than retrieval.max_top_k", cases=2)


def test_a_request_framed_by_both_length_and_chunks_closes_its_connection(server, ledger):
    """Before: the connection stayed open (a request smuggling vector behind a proxy)."""
    body = b'{"object": 1}'
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    head = (
        "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: {AUTH['Authorization']}\r\n"
        "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head + chunked)
        reply = _read_reply(sock)
        assert reply.status is not None, reply
        assert reply.headers.get("connection") == "close", reply.headers
        sock.settimeout(5)
        assert sock.recv(1) == b""  # closed by the server
    normal = (
        "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: {AUTH['Authorization']}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(normal)
        assert _read_reply(sock).status == 200
        sock.sendall(normal)  # an ordinary connection stays open for the next request
        assert _read_reply(sock).status == 200
    ledger.record("HTTP: Content-Length with Transfer-Encoding", cases=1)
