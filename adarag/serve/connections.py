"""HTTP connections as ``adarag serve`` accepts them: capped in number, heads read in bounded time.

uvicorn (over h11) holds a connection open for as long as its client keeps sending a request's
head a byte at a time, and accepts as many connections as arrive. :class:`GuardedH11Protocol`
adds these limits of ``serve``:

- ``header_read_timeout_s``: from the moment a connection opens, or its previous response ends
  and more bytes arrive, its request head must be complete within this many seconds, or the
  server answers ``408 Request Timeout`` and closes it;
- ``max_connections``: a connection beyond this many open ones is closed as soon as it is
  accepted, before anything is read;
- ``max_connections_per_address``: likewise, a connection beyond this many open ones from its
  client's IP address (as nginx's ``limit_conn``), so one client holding idle sockets cannot
  take every connection. Behind a reverse proxy every client has the proxy's address: there the
  proxy caps connections per client, and this cap is raised to ``max_connections``.

A request framed both by ``Content-Length`` and by ``Transfer-Encoding`` (which h11 reads by the
latter) is answered, and its connection closed after the response (RFC 9112, section 6.1), so a
proxy that framed it by its length cannot have a second request smuggled in behind it.

The body's own time limit, the header size and the rest are :mod:`adarag.serve.limits`'.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

logger = logging.getLogger(__name__)

_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
)


class GuardedConfig(uvicorn.Config):
    """uvicorn's configuration plus the connection limits :class:`GuardedH11Protocol` reads.

    Args:
        app: The ASGI application.
        header_read_timeout_s: Seconds a request's head may take to arrive.
        max_connections: Open connections at most.
        max_connections_per_address: Open connections from one client address at most.
        **kwargs: uvicorn's own settings (``http`` is this module's protocol).
    """

    def __init__(
        self,
        app: Any,
        *,
        header_read_timeout_s: float,
        max_connections: int,
        max_connections_per_address: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, http=GuardedH11Protocol, **kwargs)
        self.header_read_timeout_s = header_read_timeout_s
        self.max_connections = max_connections
        self.max_connections_per_address = max_connections_per_address


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a time limit on request heads and connection caps."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        assert isinstance(config, GuardedConfig), "serve with a GuardedConfig"
        self._head_timeout_s = config.header_read_timeout_s
        self._max_connections = config.max_connections
        self._max_per_address = config.max_connections_per_address
        self._head_timer: asyncio.TimerHandle | None = None
        self._framed_cycle: RequestResponseCycle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        """Accept the connection (or close it at once past the cap) and start the head's clock."""
        super().connection_made(transport)  # type: ignore[arg-type]
        if len(self.connections) > self._max_connections:
            logger.debug(
                "closing a connection from %s: %d open", self.client, self._max_connections
            )
            self.transport.close()
            return
        if self._num_from_address() > self._max_per_address:
            logger.debug(
                "closing a connection from %s: %d open from its address",
                self.client,
                self._max_per_address,
            )
            self.transport.close()
            return
        self._start_head_clock()

    def _num_from_address(self) -> int:
        """Open connections from this one's client address, this one included."""
        address = self.client[0] if self.client else None
        if address is None:
            return 1  # a Unix socket: no address to share
        return sum(
            1
            for other in self.connections
            if isinstance(other, H11Protocol) and other.client and other.client[0] == address
        )

    def data_received(self, data: bytes) -> None:
        """Feed h11; the head's clock runs while a request head is incomplete."""
        if self._head_timer is None and self.conn.their_state is h11.IDLE:
            self._start_head_clock()  # the next request on a kept-alive connection begins
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._stop_head_clock()
        if self.cycle is not None and self.cycle is not self._framed_cycle:
            self._framed_cycle = self.cycle
            _close_if_framed_twice(self.cycle)

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the head's clock, then let uvicorn clean up."""
        self._stop_head_clock()
        super().connection_lost(exc)

    def _start_head_clock(self) -> None:
        self._stop_head_clock()
        self._head_timer = self.loop.call_later(self._head_timeout_s, self._head_timed_out)

    def _stop_head_clock(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        logger.debug(
            "closing a connection from %s: no complete request head within %g s",
            self.client,
            self._head_timeout_s,
        )
        self.transport.write(_TIMEOUT_RESPONSE)
        self.transport.close()


def _close_if_framed_twice(cycle: RequestResponseCycle) -> None:
    """Close the connection after a request framed by both Content-Length and Transfer-Encoding.

    RFC 9112 (section 6.1): a proxy in front may have framed it by the other header.
    """
    names = {name for name, _ in cycle.scope["headers"]}
    if b"content-length" in names and b"transfer-encoding" in names:
        cycle.keep_alive = False
        # uvicorn answers a request that asks to close with Connection: close
        cycle.scope["headers"] = [*cycle.scope["headers"], (b"connection", b"close")]
