"""Run coroutines concurrently while a ticker measures how long the event loop is held."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any


@dataclass
class ProbeResult:
    results: list[Any]
    spans: list[tuple[float, float]]  # (start, end) of each coroutine
    max_tick_gap_s: float
    elapsed_s: float

    @property
    def overlapped(self) -> bool:
        """Every coroutine started before any of them finished."""
        return max(start for start, _ in self.spans) < min(end for _, end in self.spans)


async def probe(*awaitables: Awaitable[Any], tick_s: float = 0.02) -> ProbeResult:
    """Await ``awaitables`` together; a ticker records the longest gap between loop turns."""
    spans: list[tuple[float, float]] = []
    done = asyncio.Event()

    async def timed(awaitable: Awaitable[Any]) -> Any:
        started = time.perf_counter()
        result = await awaitable
        spans.append((started, time.perf_counter()))
        return result

    async def ticker() -> float:
        last, max_gap = time.perf_counter(), 0.0
        while not done.is_set():
            await asyncio.sleep(tick_s)
            now = time.perf_counter()
            max_gap, last = max(max_gap, now - last), now
        return max_gap

    started = time.perf_counter()
    tick_task = asyncio.create_task(ticker())
    results = await asyncio.gather(*(timed(a) for a in awaitables))
    elapsed = time.perf_counter() - started
    done.set()
    return ProbeResult(list(results), spans, await tick_task, elapsed)
