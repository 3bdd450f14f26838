"""Decoding steps of concurrent requests run together (``engine.batch_decode``).

Each request decodes in its own thread and asks :meth:`StepBatcher.step` for the logits after its
next token. The first thread to arrive while no step is running becomes the stepper: it waits a
moment (``window_s``) for the other decoding requests to submit their tokens, takes everything
submitted, runs one :meth:`Runner.decode_batch` over all of it, hands every request its logits
and wakes them; the next step gets a new stepper. A request alone steps alone, as before (one
row, the same path as :meth:`Runner.decode`). Several rows multiply each weight once for all of
them, so concurrent requests decode at a multiple of one request's tokens per second.

The batcher takes no other lock: the pipeline runs batched steps outside its engine lock (a
step touches only its requests' KV caches and the read-only model), so a step never waits for
a thread that holds that lock while it decodes (the stability check and the benchmarks do).

A batched step computes a row with other rows beside it, so its logits can differ from a lone
step's in the last float32 bits; a greedy answer can change only where two tokens tie to that
precision. That is why batching is off by default.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from adarag.engine.kv_cache import KVCache
from adarag.engine.runner import Runner


@dataclass
class _Ticket:
    token: int
    kv: KVCache
    logits: torch.Tensor | None = None
    error: BaseException | None = None
    done: bool = False


class StepBatcher:
    """Runs concurrent requests' decoding steps as one batch.

    Args:
        runner: The model's fusion loop (its :meth:`Runner.decode_batch` runs the batch).
        window_s: How long a stepper waits for the other decoding requests to submit.
    """

    def __init__(self, runner: Runner, window_s: float = 0.002) -> None:
        self.runner = runner
        self.window_s = window_s
        self._lock = threading.Condition()
        self._pending: list[_Ticket] = []
        self._decoding = 0  # requests between begin() and end()
        self._stepping = False
        # rows of the last steps run (bounded: a server steps for as long as it lives)
        self.batch_sizes: deque[int] = deque(maxlen=4096)

    def begin(self) -> None:
        """A request starts decoding."""
        with self._lock:
            self._decoding += 1

    def end(self) -> None:
        """A request stops decoding (finished, failed or cancelled)."""
        with self._lock:
            self._decoding -= 1
            self._lock.notify_all()

    def step(self, token: int, kv: KVCache) -> torch.Tensor:
        """Append ``token`` to ``kv`` (with the other requests' tokens) and return its logits."""
        ticket = _Ticket(token, kv)
        with self._lock:
            self._pending.append(ticket)
            self._lock.notify_all()
            while not ticket.done:
                if self._stepping:
                    self._lock.wait()
                    continue
                self._stepping = True
                deadline = time.monotonic() + self.window_s
                while len(self._pending) < self._decoding and time.monotonic() < deadline:
                    self._lock.wait(max(deadline - time.monotonic(), 0.0))
                batch, self._pending = self._pending, []
                self._lock.release()
                try:
                    self._run(batch)
                finally:
                    self._lock.acquire()
                    self._stepping = False
                    self._lock.notify_all()
        if ticket.error is not None:
            raise ticket.error
        assert ticket.logits is not None
        return ticket.logits

    def _run(self, batch: list[_Ticket]) -> None:
        try:
            logits = self.runner.decode_batch([t.token for t in batch], [t.kv for t in batch])
        except BaseException as err:  # every request of the batch sees the step's failure
            for ticket in batch:
                ticket.error = err
                ticket.done = True
            return
        self.batch_sizes.append(len(batch))
        for row, ticket in enumerate(batch):
            ticket.logits = logits[row]
            ticket.done = True
