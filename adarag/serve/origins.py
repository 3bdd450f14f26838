"""Which names the server answers to and which web pages may call it: the Host and Origin checks.

A browser lets any page send some requests to any address without asking the server first: a
form post (``multipart/form-data``, ``text/plain``) or a ``fetch`` in ``no-cors`` mode. A page
on another site could so add documents to a server on the user's machine, or query it. And a
page whose host name an attacker points at 127.0.0.1 (DNS rebinding) is, to the browser, on the
server's own origin, so it can also read the answers. Two ASGI middlewares refuse both, with
403, before anything else runs (as Ollama and Jupyter do):

- :class:`HostCheck` (installed by :class:`~adarag.serve.AdaRagServer`, which knows the address
  it listens on) accepts a ``Host`` header naming that address or one of
  ``serve.allowed_hosts``; loopback names (``localhost``, any 127.0.0.0/8 address, ``::1``)
  when it listens on a loopback address; any IP address and this machine's name when it
  listens on every interface (``0.0.0.0`` or ``::``). DNS rebinding needs a host name, so an
  IP address is never one.
- :class:`OriginCheck` (installed by :func:`~adarag.serve.create_app`) refuses a request whose
  ``Origin`` header is neither the server's own (the ``Host`` it was sent to) nor one of
  ``serve.allowed_origins``. Browsers send ``Origin`` with every cross-origin request that can
  change anything; clients that are not browsers send none and pass.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from adarag.config import ServeConfig
from adarag.config.serve import normal_origin
from adarag.serve.errors import foreign_host, foreign_origin
from adarag.serve.limits import send_refusal

_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def allowed_host_names(config: ServeConfig) -> frozenset[str] | None:
    """The host names a request may name (IP addresses aside); None: every name."""
    if "*" in config.allowed_hosts:
        return None
    bound = config.host.strip("[]").lower()
    names = {bound, *config.allowed_hosts}
    if _is_loopback(bound) or bound in _WILDCARDS:
        names.add("localhost")
    if bound in _WILDCARDS:
        names.add(socket.gethostname().lower())
    return frozenset(names - {""})


def is_allowed_host(host: str, config: ServeConfig, names: frozenset[str] | None) -> bool:
    """Whether a request naming ``host`` (its Host header's name, no port) is answered."""
    host = host.strip("[]").lower().rstrip(".")
    if names is None or host in names or host.endswith(".localhost") and "localhost" in names:
        return True
    bound = config.host.strip("[]").lower()
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return bound in _WILDCARDS or (address.is_loopback and _is_loopback(bound))


class HostCheck:
    """ASGI middleware refusing (403) a request whose Host the server does not answer to.

    Args:
        app: The application.
        config: The address listened on (``serve.host``) and ``serve.allowed_hosts``.
    """

    def __init__(self, app: ASGIApp, config: ServeConfig) -> None:
        self.app = app
        self.config = config
        self._names = allowed_host_names(config)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse the request, or hand it on."""
        if scope["type"] == "http":
            given = _header(scope, b"host")
            name = _host_name(given) if given is not None else None
            if given is not None and (
                name is None or not is_allowed_host(name, self.config, self._names)
            ):
                await send_refusal(send, foreign_host(given))
                return
        await self.app(scope, receive, send)


class OriginCheck:
    """ASGI middleware refusing (403) a request sent by a web page of a foreign origin.

    Args:
        app: The application.
        config: ``serve.allowed_origins``.
    """

    def __init__(self, app: ASGIApp, config: ServeConfig) -> None:
        self.app = app
        self._allowed = frozenset(config.allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse the request, or hand it on."""
        if scope["type"] == "http":
            origin = _header(scope, b"origin")
            if origin is not None and not self._is_allowed(origin, _header(scope, b"host")):
                await send_refusal(send, foreign_origin(origin))
                return
        await self.app(scope, receive, send)

    def _is_allowed(self, origin: str, host: str | None) -> bool:
        try:
            parts = urlsplit(origin.strip())
            port = parts.port
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return False  # "null" (a sandboxed frame, a file) and anything malformed
        given = normal_origin(parts.scheme, parts.hostname, port)
        if given in self._allowed:
            return True
        own = _split_host(host) if host is not None else None
        return own is not None and given == normal_origin(parts.scheme, *own)


def _header(scope: Scope, name: bytes) -> str | None:
    value = next((v for k, v in scope["headers"] if k == name), None)
    return value.decode("latin-1") if value is not None else None


def _split_host(host: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a Host header; None when it is malformed."""
    try:
        parts = urlsplit(f"//{host.strip()}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or parts.path or parts.query or parts.username is not None:
        return None
    return parts.hostname, port


def _host_name(host: str) -> str | None:
    split = _split_host(host)
    return split[0] if split else None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
