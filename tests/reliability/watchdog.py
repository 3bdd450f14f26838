"""Work on threads (or an event loop) under a watchdog: a deadlock fails the test, never hangs it.

Every worker is a daemon thread, so a worker stuck on a lock cannot keep pytest from exiting;
the failure message holds every thread's stack at the moment the watchdog gave up.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

DEADLOCK_TIMEOUT_S = 300.0
"""How long a batch of work may take before it is called a deadlock (never a speed check: the
work takes seconds)."""


def thread_stacks() -> str:
    """Every live thread's stack, for a deadlock report."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f"--- thread {names.get(ident, ident)}\n")
        parts.extend(traceback.format_stack(frame))
    return "".join(parts)


def run_threads(
    tasks: Sequence[Callable[[], T]],
    *,
    timeout_s: float = DEADLOCK_TIMEOUT_S,
    barrier: bool = True,
) -> list[T]:
    """Run each task on its own daemon thread; their results in task order.

    Args:
        tasks: The work, one thread each.
        timeout_s: The watchdog: threads still running then fail the test as a deadlock.
        barrier: Start every task at the same moment (more interleaving).

    Raises:
        The first exception a task raised (after every thread has ended).
    """
    results: list[Any] = [None] * len(tasks)
    errors: list[BaseException | None] = [None] * len(tasks)
    start = threading.Barrier(len(tasks)) if barrier and tasks else None

    def body(idx: int) -> None:
        try:
            if start is not None:
                start.wait()
            results[idx] = tasks[idx]()
        except BaseException as err:  # reported to the test below
            errors[idx] = err

    threads = [
        threading.Thread(target=body, args=(idx,), name=f"worker-{idx}", daemon=True)
        for idx in range(len(tasks))
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0.0))
    stuck = [thread.name for thread in threads if thread.is_alive()]
    if stuck:
        pytest.fail(
            f"deadlock: {len(stuck)} of {len(threads)} threads still running after {timeout_s} s "
            f"({', '.join(stuck)})\n{thread_stacks()}"
        )
    for err in errors:
        if err is not None:
            raise err
    return results


def run_async(
    main: Callable[[], Coroutine[Any, Any, T]], *, timeout_s: float = DEADLOCK_TIMEOUT_S
) -> T:
    """``asyncio.run(main())`` on a daemon thread under the watchdog (see :func:`run_threads`)."""
    return run_threads([lambda: asyncio.run(main())], timeout_s=timeout_s, barrier=False)[0]


def call_with_timeout(task: Callable[[], T], *, timeout_s: float = DEADLOCK_TIMEOUT_S) -> T:
    """``task()`` on a daemon thread under the watchdog: a call blocked on a lock fails the test."""
    return run_threads([task], timeout_s=timeout_s, barrier=False)[0]
