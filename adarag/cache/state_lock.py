"""The leaf lock of the tiers' shared state, which can tell whether this thread holds it.

The tiers' counters, admission state and context index (and the variant index, which pipelines
over one store share) change under their own :class:`StateLock` rather than the engine lock, so
lookups and write-backs, which read and write the disk and the shared tier, run without it. Each
place that changes that state calls :meth:`StateLock.check_held`; with :data:`CHECK_OWNERSHIP` on
(the test suite turns it on) a change made without the lock fails at once instead of corrupting
a counter now and then.
"""

from __future__ import annotations

import threading
from types import TracebackType

CHECK_OWNERSHIP = False
"""Assert in :meth:`StateLock.check_held` that the calling thread holds the lock (a debug check)."""


class StateLock:
    """A re-entrant leaf lock that knows which thread holds it.

    Args:
        name: What it guards, for the assertion's message.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.RLock()
        self._owner: int | None = None
        self._depth = 0

    def __enter__(self) -> StateLock:
        self._lock.acquire()
        self._owner = threading.get_ident()
        self._depth += 1
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
        self._lock.release()

    def is_held(self) -> bool:
        """Whether the calling thread holds the lock."""
        return self._owner == threading.get_ident()

    def check_held(self) -> None:
        """With :data:`CHECK_OWNERSHIP` on, assert the calling thread holds the lock."""
        if CHECK_OWNERSHIP:
            assert self.is_held(), f"{self.name} changed without holding its lock"
