"""Cancelling a request's handling when its client hangs up before the response starts.

A whole (non-streamed) answer is computed before anything is sent, so without this a client
that hangs up keeps its engine slot until the answer ends or ``serve.request_timeout_s``
passes. Cancelling the handling closes the answer's stream: decoding stops at the next step and
the slot is freed (:class:`~adarag.serve.scheduler.EngineWorker`). Once the response has
started, a stream notices the hang-up itself, when it next sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)


async def call_until_disconnect(
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    send: Send,
    client_receive: Receive,
    body_read: asyncio.Event | None = None,
) -> None:
    """Run ``app`` on the request; cancel it if the client hangs up before the response starts.

    Args:
        app: The application.
        scope: The request.
        receive: What the application reads the request from.
        send: Where the response goes.
        client_receive: The connection's own ``receive``, its body already read: the next
            message it gives is the hang-up.
        body_read: Set once the application has read the whole body through ``receive``,
            when the body is passed on as it arrives (an upload); the hang-up is watched for
            from then on. None: the body was read before.
    """
    started = asyncio.Event()

    async def send_noting_start(message: Message) -> None:
        if message["type"] == "http.response.start":
            started.set()
        await send(message)

    handling = asyncio.ensure_future(app(scope, receive, send_noting_start))
    watching = asyncio.ensure_future(_until_gone_before(started, client_receive, body_read))
    try:
        await asyncio.wait({handling, watching}, return_when=asyncio.FIRST_COMPLETED)
        if watching.done() and watching.result():
            logger.info(
                "client hung up before the response: %s %s cancelled",
                scope["method"],
                scope["path"],
            )
            handling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await handling  # the client is gone: nothing to answer
            return
        await handling
    finally:
        for task in (handling, watching):
            task.cancel()
        await asyncio.gather(handling, watching, return_exceptions=True)


async def _until_gone_before(
    started: asyncio.Event, client_receive: Receive, body_read: asyncio.Event | None
) -> bool:
    """True when the client hangs up before ``started`` is set; False once it is."""
    if body_read is not None:
        read = asyncio.ensure_future(body_read.wait())
        response = asyncio.ensure_future(started.wait())
        try:
            await asyncio.wait({read, response}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            read.cancel()
            response.cancel()
        if started.is_set():
            return False
    hang_up = asyncio.ensure_future(_hang_up(client_receive))
    response = asyncio.ensure_future(started.wait())
    try:
        await asyncio.wait({hang_up, response}, return_when=asyncio.FIRST_COMPLETED)
        return hang_up.done() and not started.is_set()
    finally:
        hang_up.cancel()
        response.cancel()


async def _hang_up(client_receive: Receive) -> None:
    while (await client_receive())["type"] != "http.disconnect":
        pass
