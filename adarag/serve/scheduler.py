"""Admission to the one engine: active slots, a bounded FIFO wait, deadlines and shutdown.

A request takes an active slot before it touches the engine; up to ``max_active`` requests hold
one at once (their prefill and decode steps interleave under the pipeline's engine lock), up to
``max_queued`` more wait in arrival order, and one more is refused at once with 429. Engine work
runs in the worker's own threads. A slot is given back only when the engine work done under it
has ended, also when the request stopped waiting for it (timeout, client gone, shutdown): a
step in flight cannot be interrupted, and the bound must hold for the engine, not only for the
HTTP side.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from adarag.pipeline import AnswerStream
from adarag.serve.errors import QueueFullError, RequestTimeoutError, ShuttingDownError

logger = logging.getLogger(__name__)
T = TypeVar("T")


class Slot:
    """One request's hold on the engine; released once its engine work has ended."""

    def __init__(self, slots: EngineSlots) -> None:
        self._slots = slots
        self._pending: set[asyncio.Future[Any]] = set()
        self._release_requested = False
        self._released = False

    def hold(self, future: asyncio.Future[Any]) -> None:
        """Keep the slot until ``future`` (engine work in a thread) is done."""
        self._pending.add(future)
        future.add_done_callback(self._work_done)

    def release(self) -> None:
        """Give the slot back now, or when the engine work it holds ends. Idempotent."""
        self._release_requested = True
        if not self._pending and not self._released:
            self._released = True
            self._slots.hand_over()

    def _work_done(self, future: asyncio.Future[Any]) -> None:
        self._pending.discard(future)
        if self._release_requested:
            # after the future's other callbacks, which may hold the slot for a clean-up
            asyncio.get_running_loop().call_soon(self.release)


class EngineSlots:
    """At most ``max_active`` slots held at once, ``max_queued`` requests waiting in order.

    Used from the event loop's thread only.
    """

    def __init__(self, max_active: int, max_queued: int) -> None:
        self.max_active = max_active
        self.max_queued = max_queued
        self.num_active = 0
        self.is_closing = False
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def num_queued(self) -> int:
        """Requests waiting for a slot."""
        return sum(1 for waiter in self._waiters if not waiter.done())

    async def acquire(self, deadline: float, timeout_s: float) -> Slot:
        """A slot, waiting in line until ``deadline`` (event-loop time) at most.

        Raises:
            ShuttingDownError: The server is shutting down (also while waiting).
            QueueFullError: Every slot is held and the wait queue is full.
            RequestTimeoutError: The deadline passed while waiting.
        """
        if self.is_closing:
            raise ShuttingDownError()
        if self.num_active < self.max_active and not self.num_queued:
            self._take()
            return Slot(self)
        if self.num_queued >= self.max_queued:
            raise QueueFullError(self.max_active, self.max_queued)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout_at(deadline):
                await waiter
        except BaseException as err:
            handed = waiter.done() and not waiter.cancelled() and waiter.exception() is None
            if handed:  # the slot came just as the request stopped waiting: pass it on
                self.hand_over()
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            if isinstance(err, TimeoutError):
                raise RequestTimeoutError(timeout_s, "waiting in the queue") from None
            raise
        return Slot(self)  # handed over by a releasing request: num_active is unchanged

    def hand_over(self) -> None:
        """A slot is free: give it to the longest-waiting request, or mark it free."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.num_active -= 1
        assert self.num_active >= 0, "a slot was released twice"
        if not self.num_active:
            self._idle.set()

    def close(self) -> int:
        """Refuse new requests; every waiting one gets 503. Returns how many were waiting."""
        self.is_closing = True
        refused = 0
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ShuttingDownError())
                refused += 1
        return refused

    async def wait_idle(self) -> None:
        """Until no slot is held (every engine work begun under one has ended)."""
        await self._idle.wait()

    def _take(self) -> None:
        self.num_active += 1
        self._idle.clear()


class EngineWorker:
    """Runs pipeline calls in threads of its own, each bound to a slot and a deadline.

    Args:
        max_active: Slots that may hold engine work at once (sizes the thread pool: one call
            and one clean-up per slot).
        timeout_s: ``serve.request_timeout_s``, named in timeout errors.
    """

    def __init__(self, max_active: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._executor = ThreadPoolExecutor(
            max_workers=2 * max_active + 1, thread_name_prefix="adarag-serve"
        )

    async def call(
        self, slot: Slot, deadline: float, where: str, fn: Callable[..., T], *args: Any
    ) -> T:
        """``fn(*args)`` in a worker thread, awaited until ``deadline`` at most.

        When the request stops waiting (timeout, cancellation), the call goes on in its thread
        and holds the slot until it ends; an :class:`AnswerStream` it returns then is closed
        there (its KV written back and freed).

        Raises:
            RequestTimeoutError: The deadline passed first.
        """
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, fn, *args)
        slot.hold(future)
        try:
            async with asyncio.timeout_at(deadline):
                return await asyncio.shield(future)
        except BaseException as err:
            future.add_done_callback(lambda done: self._close_result(slot, done))
            if isinstance(err, TimeoutError):
                raise RequestTimeoutError(self.timeout_s, where) from None
            raise

    def close_stream(self, slot: Slot, stream: AnswerStream) -> None:
        """Close ``stream`` in a worker thread (waits for its step in flight), holding the slot."""
        if stream.closed:
            return
        try:
            closing = asyncio.get_running_loop().run_in_executor(self._executor, stream.close)
        except RuntimeError:  # the pool has shut down (a step outlived the shutdown's wait)
            stream.close()
            return
        slot.hold(closing)

    def shutdown(self) -> None:
        """Wait for every thread's work to end (blocking)."""
        self._executor.shutdown(wait=True)

    def _close_result(self, slot: Slot, future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        result = future.result()
        if isinstance(result, AnswerStream):
            self.close_stream(slot, result)
