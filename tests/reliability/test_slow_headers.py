"""Connections that send their request head slowly, or too many connections at once.

Regression (issue 45): 200 connections each sending one header line every 15 s were all still
open after 75 s; uvicorn has no time limit on a request's head and no connection cap. Now a head
must be complete within ``serve.header_read_timeout_s`` of the connection opening (408, then
closed), and a connection past ``serve.max_connections`` is closed as soon as it is accepted.
The test runs the review's attack on a shorter clock: a header line every second against a
3-second limit.
"""

from __future__ import annotations

import selectors
import socket
import time

import httpx
import pytest

from tests.reliability.http_server import serving, tiny_rag

NUM_SLOW = 200
HEAD_TIMEOUT_S = 3.0
LINE_EVERY_S = 1.0
SLACK_S = 2.0  # a loaded two-core machine's scheduling delay


@pytest.fixture(scope="module")
def rag(tiny_checkpoints, tmp_path_factory):
    return tiny_rag(tiny_checkpoints["llama"], tmp_path_factory.mktemp("slow-headers"))


def _open(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the head never ends
    sock.setblocking(False)
    return sock


def _health_s(url: str) -> float:
    started = time.perf_counter()
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    return time.perf_counter() - started


def test_slow_header_connections_are_closed_within_the_timeout(rag, ledger):
    # all from one address: the per-address cap (test_serve_connections.py) is lifted here
    with serving(
        rag, header_read_timeout_s=HEAD_TIMEOUT_S, max_connections_per_address=NUM_SLOW + 10
    ) as served:
        opened = time.monotonic()
        sockets = {_open(served.port): time.monotonic() for _ in range(NUM_SLOW)}
        closed_after: dict[socket.socket, float] = {}
        answers: dict[socket.socket, bytes] = {}
        health_s = []
        selector = selectors.DefaultSelector()
        for sock in sockets:
            selector.register(sock, selectors.EVENT_READ)
        next_line = time.monotonic() + LINE_EVERY_S
        while len(closed_after) < NUM_SLOW and time.monotonic() - opened < 4 * HEAD_TIMEOUT_S:
            for key, _ in selector.select(timeout=0.1):
                sock = key.fileobj
                try:
                    data = sock.recv(4096)
                except (ConnectionResetError, BlockingIOError):
                    data = b""
                answers[sock] = answers.get(sock, b"") + data
                if not data:  # closed by the server
                    closed_after[sock] = time.monotonic() - sockets[sock]
                    selector.unregister(sock)
            if time.monotonic() >= next_line:  # one more header line on every open connection
                for sock in set(sockets) - set(closed_after):
                    try:
                        sock.send(b"X-Slow: 1\r\n")
                    except (BrokenPipeError, ConnectionResetError, BlockingIOError):
                        pass
                health_s.append(_health_s(served.url))
                next_line += LINE_EVERY_S
        still_open = NUM_SLOW - len(closed_after)
        timed_out = sum(answers.get(sock, b"").startswith(b"HTTP/1.1 408") for sock in sockets)
        slowest = max(closed_after.values(), default=float("inf"))
        ledger.record(
            "HTTP: request head sent slowly (200 connections)",
            cases=NUM_SLOW,
            detected=sum(age <= HEAD_TIMEOUT_S + SLACK_S for age in closed_after.values()),
        )
        ledger.extra["http_slow_headers"] = {
            "connections": NUM_SLOW,
            "header_read_timeout_s": HEAD_TIMEOUT_S,
            "header_line_every_s": LINE_EVERY_S,
            "closed_by_server": len(closed_after),
            "answered_408": timed_out,
            "closed_after_s_min": round(min(closed_after.values(), default=0.0), 2),
            "closed_after_s_max": round(slowest, 2),
            "health_checks": len(health_s),
            "health_s_max": round(max(health_s, default=0.0), 3),
            "health_s_median": round(sorted(health_s)[len(health_s) // 2] if health_s else 0.0, 3),
        }
        for sock in sockets:
            sock.close()
        assert still_open == 0 and timed_out == NUM_SLOW
        assert HEAD_TIMEOUT_S - 0.5 <= min(closed_after.values())
        assert slowest <= HEAD_TIMEOUT_S + SLACK_S
        assert health_s and max(health_s) < 2.0  # served while they were held (a busy machine)


def test_a_complete_head_is_served_and_its_connection_kept_alive(rag):
    with serving(rag, header_read_timeout_s=HEAD_TIMEOUT_S) as served:
        with httpx.Client(base_url=served.url) as client:
            for _ in range(3):  # one connection, past the head timeout, still answered
                assert client.get("/health").status_code == 200
                time.sleep(HEAD_TIMEOUT_S / 2)


def test_connections_past_the_cap_are_closed_at_once(rag, ledger):
    cap, extra = 20, 10
    with serving(
        rag,
        max_connections=cap,
        max_connections_per_address=cap + extra,
        header_read_timeout_s=30.0,
    ) as served:
        held = [_open(served.port) for _ in range(cap)]
        time.sleep(0.5)
        refused = 0
        for _ in range(extra):
            with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
                try:
                    refused += sock.recv(1) == b""  # closed before anything was read
                except ConnectionResetError:
                    refused += 1
        for sock in held:
            sock.close()
        time.sleep(0.5)
        answered = httpx.get(f"{served.url}/health", timeout=10).status_code == 200
        ledger.record("HTTP: connections past serve.max_connections", cases=extra, detected=refused)
        assert refused == extra and answered
