"""One client holding idle sockets does not lock the others out.

The connection cap (``serve.max_connections``, 512) was global: 512 idle sockets from one client
took every slot, and reopening them as the head timeout closed them kept everyone else out.
``serve.max_connections_per_address`` (32) now caps the connections of each client address, as
nginx's ``limit_conn`` does. Here an attacker on 127.0.0.2 keeps 600 idle sockets open (each one
the server closes is reopened a second later) while a client on 127.0.0.1 asks ``/health``.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time

import httpx
import pytest

from tests.reliability.conftest import scale
from tests.reliability.http_server import serving, tiny_rag

ATTACKER = "127.0.0.2"
NUM_IDLE = 600
REOPEN_AFTER_S = 1.0


def _idle_socket(port: int) -> socket.socket | None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((ATTACKER, 0))
    sock.settimeout(2)
    try:
        sock.connect(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    sock.setblocking(False)
    return sock


def _hold_idle_sockets(port: int, until: float) -> None:
    """Keep ``NUM_IDLE`` idle sockets open from the attacker's address until ``until``."""
    selector = selectors.DefaultSelector()
    reopen_at: list[float] = []
    open_socks: set[socket.socket] = set()

    def open_one() -> None:
        sock = _idle_socket(port)
        if sock is None:
            reopen_at.append(time.monotonic() + REOPEN_AFTER_S)
            return
        open_socks.add(sock)
        selector.register(sock, selectors.EVENT_READ)

    for _ in range(NUM_IDLE):
        open_one()
    try:
        while time.monotonic() < until:
            for key, _ in selector.select(timeout=0.1):
                sock = key.fileobj
                try:
                    closed = sock.recv(4096) == b""
                except BlockingIOError:
                    closed = False
                except OSError:
                    closed = True
                if closed:
                    selector.unregister(sock)
                    sock.close()
                    open_socks.discard(sock)
                    reopen_at.append(time.monotonic() + REOPEN_AFTER_S)
            now = time.monotonic()
            due = [at for at in reopen_at if at <= now]
            reopen_at[:] = [at for at in reopen_at if at > now]
            for _ in due:
                open_one()
    finally:
        for sock in open_socks:
            sock.close()
        selector.close()


@pytest.fixture(scope="module")
def rag(tiny_checkpoints, tmp_path_factory):
    return tiny_rag(tiny_checkpoints["llama"], tmp_path_factory.mktemp("idle-sockets"))


def test_600_idle_sockets_from_one_address_leave_other_clients_served(rag, ledger):
    """Before: 512 idle sockets from one client locked everyone out."""
    duration_s = scale(15, 60)
    with serving(rag) as served:  # the defaults: 512 connections, 32 per address
        until = time.monotonic() + duration_s
        attacker = threading.Thread(target=_hold_idle_sockets, args=(served.port, until))
        attacker.start()
        time.sleep(2)  # the attacker's sockets are open
        num_ok = num_tried = 0
        latencies_s = []
        while time.monotonic() < until - 1:
            num_tried += 1
            started = time.monotonic()
            try:
                reply = httpx.get(f"{served.url}/health", timeout=5)
                num_ok += reply.status_code == 200
                latencies_s.append(time.monotonic() - started)
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        attacker.join()
    success_ratio = num_ok / num_tried
    ledger.record(
        f"HTTP: {NUM_IDLE} idle sockets from one address",
        cases=num_tried,
        detected=num_ok,
    )
    ledger.extra["http_idle_sockets"] = {
        "attacker_sockets": NUM_IDLE,
        "seconds": duration_s,
        "good_client_requests": num_tried,
        "good_client_success_ratio": round(success_ratio, 4),
        "good_client_slowest_s": round(max(latencies_s), 3) if latencies_s else None,
    }
    assert success_ratio == 1.0, ledger.extra["http_idle_sockets"]
