"""Running the application with uvicorn, with a graceful shutdown on SIGTERM and SIGINT."""

from __future__ import annotations

import logging
import signal
from types import FrameType

import uvicorn
from fastapi import FastAPI

from adarag.config import ServeConfig
from adarag.serve.connections import GuardedConfig
from adarag.serve.origins import HostCheck
from adarag.serve.service import EngineService

logger = logging.getLogger(__name__)


class AdaRagServer(uvicorn.Server):
    """uvicorn's server, telling the engine when a shutdown begins.

    On the first SIGTERM or SIGINT (or :meth:`handle_exit` from another thread) queued requests
    get 503 at once, the listening socket closes, and in-flight requests have
    ``shutdown_grace_s`` to finish before they are cancelled; the KV cache is then flushed to
    disk. A second SIGINT exits at once (no flush). The process exits with status 0. HTTP is
    parsed by h11, which buffers at most twice ``max_request_header_bytes`` of a request's head;
    a head must arrive within ``header_read_timeout_s``, at most ``max_connections`` are open and
    ``max_connections_per_address`` from one client address (:mod:`adarag.serve.connections`).
    A request whose ``Host`` names neither the address listened on nor one of ``allowed_hosts``
    is refused (:class:`~adarag.serve.origins.HostCheck`: DNS rebinding).

    Args:
        app: An application from :func:`~adarag.serve.create_app`.
        config: Host, port and grace period.
        log_level: uvicorn's log level (``"info"`` logs each request).
    """

    def __init__(self, app: FastAPI, config: ServeConfig, *, log_level: str = "info") -> None:
        super().__init__(
            GuardedConfig(
                HostCheck(app, config),
                header_read_timeout_s=config.header_read_timeout_s,
                max_connections=config.max_connections,
                max_connections_per_address=config.max_connections_per_address,
                host=config.host,
                port=config.port,
                log_level=log_level,
                # uvicorn's annotation says int; it passes the value to asyncio.wait_for
                timeout_graceful_shutdown=config.shutdown_grace_s,  # type: ignore[arg-type]
                lifespan="on",
                # h11 bounds what it buffers of a request's head (httptools does not): headers
                # up to the limit get a 431 from the application, twice that a 400 from h11
                h11_max_incomplete_event_size=2 * config.max_request_header_bytes,
            )
        )
        self._service: EngineService = app.state.service

    @property
    def bound_port(self) -> int | None:
        """The port listened on (the one picked when ``port`` was 0), once started."""
        for server in self.servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Begin a graceful shutdown (the second SIGINT forces it).

        Unlike uvicorn's own, the signal is not raised again once the server has stopped, so
        the process exits with status 0 after a graceful shutdown.
        """
        self._service.begin_shutdown_threadsafe()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True
