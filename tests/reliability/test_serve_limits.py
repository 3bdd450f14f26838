"""Requests the server must refuse before reading or parsing them, sent over raw sockets.

Once, a body was read and parsed before its API key was checked (600 MB sent without a key:
+1.8 GB of server memory), a declared 4 GB body was waited for with no time limit, and headers,
body size and JSON nesting had no bound. Now the key is checked first (401 before any of the
body is read), a body over ``serve.max_request_body_bytes`` gets 413 (from its Content-Length,
or once that much has arrived), a body that stops arriving gets 408 after
``serve.body_read_timeout_s``, headers over ``serve.max_request_header_bytes`` get 431 (and far
over it, h11 refuses them before buffering more), and JSON nested deeper than
``serve.max_json_depth`` gets 400 before it is parsed. Each refusal closes the connection.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.reliability.http_server import (
    API_KEY,
    AUTH,
    Served,
    exchange,
    head,
    peak_rss_bytes,
    serving,
    tiny_rag,
)

BODY_LIMIT = 1024 * 1024
HEADER_LIMIT = 8 * 1024
DEPTH_LIMIT = 16
BODY_TIMEOUT_S = 1.0
PROMPT_BODY = {"model": "m", "prompt": "1, 2,", "max_tokens": 2}
ROUTE = "/v1/completions"


@pytest.fixture(scope="module")
def server(tiny_checkpoints, tmp_path_factory) -> Iterator[Served]:
    rag = tiny_rag(tiny_checkpoints["llama"], tmp_path_factory.mktemp("limits-home"))
    with serving(
        rag,
        max_request_body_bytes=BODY_LIMIT,
        max_request_header_bytes=HEADER_LIMIT,
        max_json_depth=DEPTH_LIMIT,
        body_read_timeout_s=BODY_TIMEOUT_S,
    ) as served:
        yield served


def post_head(length: int | None, *, key: bool = True, **headers: str) -> bytes:
    fields = {"Content-Type": "application/json", **(AUTH if key else {}), **headers}
    if length is not None:
        fields["Content-Length"] = str(length)
    return head("POST", ROUTE, fields)


def post_json(server: Served, data: bytes):
    return exchange(server.port, post_head(len(data)) + data)


def check_refused(reply, status: int, code: str | None = None) -> dict:
    assert reply.status == status, (reply.status, reply.body[:300])
    assert reply.headers.get("connection") == "close"
    error = reply.json()["error"]
    if code is not None:
        assert error["code"] == code
    return error


def still_serves(server: Served) -> None:
    reply = post_json(server, json.dumps(PROMPT_BODY).encode())
    assert reply.status == 200, reply.body[:300]


# --- the key before the body


def test_a_body_without_the_key_is_refused_before_it_is_read(server, ledger):
    megabyte = b"x" * (1024 * 1024)
    started = time.monotonic()
    reply = exchange(
        server.port, post_head(600 * 1024**2, key=False), [megabyte] * 600, timeout_s=5
    )
    check_refused(reply, 401, "invalid_api_key")
    assert reply.headers["www-authenticate"] == "Bearer"
    assert time.monotonic() - started < 30
    still_serves(server)
    ledger.record("HTTP: body sent without the API key", cases=1)


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/v1/models"])
def test_the_docs_and_the_schema_need_the_key_the_health_check_does_not(server, path, ledger):
    check_refused(exchange(server.port, head("GET", path, {})), 401, "invalid_api_key")
    wrong = exchange(server.port, head("GET", path, {"Authorization": "Bearer not-the-key"}))
    check_refused(wrong, 401, "invalid_api_key")
    assert exchange(server.port, head("GET", path, AUTH)).status == 200
    assert exchange(server.port, head("GET", "/health", {})).status == 200
    ledger.record("HTTP: docs and schema without the API key", cases=1)


# --- body size and time


@pytest.mark.parametrize("length", [BODY_LIMIT + 1, 4 * 1024**3])
def test_a_declared_body_over_the_limit_gets_413_before_it_is_read(server, length, ledger):
    started = time.monotonic()
    error = check_refused(exchange(server.port, post_head(length), timeout_s=10), 413)
    assert error["code"] == "request_too_large" and "max_request_body_bytes" in error["message"]
    assert time.monotonic() - started < 5
    ledger.record("HTTP: body over the size limit", cases=1)


def test_a_chunked_body_is_cut_off_at_the_limit_with_413(server, ledger):
    piece = b"x" * (64 * 1024)
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    request = post_head(None, **{"Transfer-Encoding": "chunked"})
    reply = exchange(server.port, request, [chunk] * (2 * BODY_LIMIT // len(piece)), timeout_s=10)
    check_refused(reply, 413, "request_too_large")
    still_serves(server)
    ledger.record("HTTP: body over the size limit", cases=1)


def test_a_body_under_the_limit_is_served(server):
    body = dict(PROMPT_BODY, user="x" * (BODY_LIMIT - 200))  # a field the server ignores
    data = json.dumps(body).encode()
    assert BODY_LIMIT - 200 < len(data) <= BODY_LIMIT
    assert post_json(server, data).status == 200


def test_a_body_that_stops_arriving_gets_408(server, ledger):
    started = time.monotonic()
    reply = exchange(server.port, post_head(1000) + b'{"model": "m"', timeout_s=10 * BODY_TIMEOUT_S)
    check_refused(reply, 408, "request_timeout")
    assert BODY_TIMEOUT_S <= time.monotonic() - started < 5 * BODY_TIMEOUT_S
    # a body trickling in, a byte at a time, is held to the same deadline
    started = time.monotonic()
    trickle = [b" "] * 100
    reply = exchange(server.port, post_head(100), trickle, pause_s=BODY_TIMEOUT_S / 10)
    check_refused(reply, 408, "request_timeout")
    assert time.monotonic() - started < 5 * BODY_TIMEOUT_S
    still_serves(server)
    ledger.record("HTTP: body that stops arriving", cases=2)


# --- headers and JSON nesting


def test_headers_over_the_limit_get_431_and_far_over_are_not_buffered(server, ledger):
    over = exchange(server.port, head("GET", "/v1/models", {**AUTH, "X-Pad": "a" * HEADER_LIMIT}))
    check_refused(over, 431, "headers_too_large")
    # 10 MB of headers: refused once twice the limit has arrived, the rest never read
    started = time.monotonic()
    padding = [f"X-Pad-{idx}: {'a' * 1000}\r\n".encode() for idx in range(10_000)]
    reply = exchange(server.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n", padding, timeout_s=10)
    assert reply.status == 400 and time.monotonic() - started < 10
    assert exchange(server.port, head("GET", "/v1/models", AUTH)).status == 200
    ledger.record("HTTP: headers over the size limit", cases=2)


def nested(depth: int) -> bytes:
    return ('{"model": "m", "prompt": "1,", "extra": ' + "[" * depth + "]" * depth + "}").encode()


@pytest.mark.parametrize("depth", [DEPTH_LIMIT, 100_000])
def test_json_nested_past_the_limit_is_refused_before_parsing(server, depth, ledger):
    error = check_refused(post_json(server, nested(depth)), 400)
    assert "max_json_depth" in error["message"]
    ledger.record("HTTP: JSON nested past the limit", cases=1)


def test_json_within_the_nesting_limit_is_parsed_and_brackets_in_strings_do_not_count(server):
    assert post_json(server, nested(DEPTH_LIMIT - 1)).status == 200
    body = dict(PROMPT_BODY, user="[{" * 10_000 + '\\"[[' + "}]" * 10_000)
    assert post_json(server, json.dumps(body).encode()).status == 200


# --- memory


@pytest.fixture()
def child_server(tiny_checkpoints, tmp_path) -> Iterator[tuple[int, int]]:
    """A server in a process of its own: (its pid, its port)."""
    command = [sys.executable, "-m", "tests.reliability.http_server"]
    command += [str(tiny_checkpoints["llama"]), str(tmp_path / "home"), API_KEY]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("port "), f"the server did not start: {line!r}"
        yield process.pid, int(line.split()[1])
    finally:
        process.stdin.close()
        process.wait(timeout=120)


def test_600_mb_sent_without_the_key_leaves_the_servers_memory_as_it_was(child_server, ledger):
    pid, port = child_server
    warm = exchange(
        port, post_head(len(json.dumps(PROMPT_BODY))) + json.dumps(PROMPT_BODY).encode()
    )
    assert warm.status == 200
    before = peak_rss_bytes(pid)
    megabyte = b"x" * (1024 * 1024)
    reply = exchange(port, post_head(600 * 1024**2, key=False), [megabyte] * 600, timeout_s=10)
    assert reply.status == 401
    growth = peak_rss_bytes(pid) - before
    assert growth < 64 * 1024**2, f"peak memory grew by {growth / 1024**2:.0f} MB"
    ledger.record("HTTP: body sent without the API key", cases=1)
    ledger.extra["http_body_without_key"] = {
        "body_bytes": 600 * 1024**2,
        "peak_rss_before_bytes": before,
        "peak_rss_growth_bytes": growth,
    }
