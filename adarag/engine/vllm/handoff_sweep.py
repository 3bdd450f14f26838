"""A periodic sweep of hand-overs nobody deleted (their front end was killed mid-request).

Both sides run one: the front end from start-up, and each replica's scheduler-side connector,
so a killed front end's files leave the directory (a tmpfs: memory) within ``max_age_s`` plus a
sweep interval even when no front end starts again. A hand-over older than ``max_age_s`` is
never still needed: a request waits at most that long for its replica's next bytes. On a server
the values expire instead, and the sweep finds nothing.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

logger = logging.getLogger(__name__)

MAX_SWEEP_INTERVAL_S = 60.0


class _Stale(Protocol):
    @property
    def location(self) -> str: ...

    def remove_stale(self, max_age_s: float) -> int: ...


class HandoffSweeper:
    """A daemon thread deleting, every ``interval_s``, hand-overs older than ``max_age_s``.

    Args:
        store: The hand-over (:class:`~adarag.engine.vllm.handoff_store.HandoffStore`).
        max_age_s: Age past which a hand-over is deleted.
        interval_s: Seconds between sweeps; None: a quarter of ``max_age_s``, at most a minute.
    """

    def __init__(self, store: _Stale, max_age_s: float, interval_s: float | None = None) -> None:
        self.store = store
        self.max_age_s = max_age_s
        self.interval_s = interval_s or min(MAX_SWEEP_INTERVAL_S, max_age_s / 4)
        self.num_removed = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="adarag-handoff-sweep", daemon=True)

    def start(self) -> HandoffSweeper:
        """Sweep once now, then every ``interval_s`` until :meth:`stop`."""
        self.sweep()
        self._thread.start()
        return self

    def sweep(self) -> int:
        """Delete the stale hand-overs now; how many (a failure is logged, not raised)."""
        try:
            removed = self.store.remove_stale(self.max_age_s)
        except OSError as err:
            logger.warning("cannot sweep stale hand-overs in %s: %s", self.store.location, err)
            return 0
        if removed:
            logger.info("removed %d stale hand-overs from %s", removed, self.store.location)
        self.num_removed += removed
        return removed

    def stop(self) -> None:
        """End the thread (at once; a sweep in progress finishes first)."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            self.sweep()
