"""Admission: which chunk KV written back after a prefill is kept as a lasting entry.

Writing back every prompt's chunks unconditionally lets a stream of novel queries flush the
warm entries: each query brings several entries that will never be read again, and under LRU
they evict the popular chunks' KV, so reuse decays towards none. Chunk popularity follows a
power law, so most written-back chunks are one-offs.

The ``frequency`` policy counts how often each chunk is written back (once per prompt that did
not reuse it as is), in a count-min sketch whose counters are halved every ``10 * width``
records, so the counts follow recent popularity (TinyLFU, Einziger et al., 2017). A chunk seen
fewer than ``threshold`` times is stored *on probation*: readable (the next augmentation step
of the same request reuses it) but evicted before every other entry and not spilled to disk
(a closing pipeline's flush writes it only into free disk room).
A chunk seen ``threshold`` times or more is stored as a lasting entry, under its independent
key too, so the popular chunks' KV is what the tiers keep. The ``always`` policy keeps every
write-back as a lasting entry.
"""

from __future__ import annotations

import hashlib
from typing import Literal, Protocol

import numpy as np

SKETCH_WIDTH = 1 << 14  # counters per row: ~16K distinct recent chunks before collisions matter
SKETCH_DEPTH = 4  # rows; the estimate is the smallest of a key's counters
RESET_PER_WIDTH = 10  # halve every counter after this many records per counter of a row


class AdmissionPolicy(Protocol):
    """Decides whether a written-back chunk is kept as a lasting entry."""

    def record(self, chunk_key: str) -> bool:
        """Count one write-back of the chunk; True when it is to be kept as a lasting entry."""
        ...


class AlwaysAdmit:
    """Every write-back is a lasting entry."""

    def record(self, chunk_key: str) -> bool:
        """Always True."""
        return True


class CountMinSketch:
    """Approximate counts of keys in fixed memory, with periodic halving (aging).

    Estimates never fall below the true count since the last halving (they may exceed it when
    keys collide in every row).

    Args:
        width: Counters per row.
        depth: Rows, each hashing keys independently.
        reset_after: Records after which every counter is halved; None never halves.
    """

    def __init__(
        self, width: int = SKETCH_WIDTH, depth: int = SKETCH_DEPTH, reset_after: int | None = None
    ) -> None:
        assert width >= 1 and 1 <= depth <= 8, f"bad sketch shape {depth}x{width}"
        self.width = width
        self.depth = depth
        self.reset_after = reset_after
        self.counters = np.zeros((depth, width), dtype=np.uint32)
        self.num_records = 0
        self._rows = np.arange(depth)

    def add(self, key: str) -> int:
        """Count ``key`` once; returns its estimated count, this one included."""
        columns = self._columns(key)
        self.counters[self._rows, columns] += 1
        estimate = int(self.counters[self._rows, columns].min())
        self.num_records += 1
        if self.reset_after is not None and self.num_records >= self.reset_after:
            self.counters >>= 1
            self.num_records = 0
        return estimate

    def estimate(self, key: str) -> int:
        """The estimated count of ``key``."""
        return int(self.counters[self._rows, self._columns(key)].min())

    def _columns(self, key: str) -> np.ndarray:
        digest = hashlib.blake2b(key.encode(), digest_size=4 * self.depth).digest()
        return np.frombuffer(digest, dtype="<u4").astype(np.int64) % self.width


class FrequencyAdmission:
    """Keep a chunk's write-back once the chunk has been written back ``threshold`` times.

    Args:
        threshold: Write-backs (this one included) a chunk needs before it is kept; 1 keeps
            every one, like :class:`AlwaysAdmit`.
        sketch: Where counts are kept; a fresh aging sketch when None.
    """

    def __init__(self, threshold: int, sketch: CountMinSketch | None = None) -> None:
        assert threshold >= 1, f"threshold must be at least 1, got {threshold}"
        self.threshold = threshold
        self.sketch = sketch or CountMinSketch(reset_after=RESET_PER_WIDTH * SKETCH_WIDTH)

    def record(self, chunk_key: str) -> bool:
        """Count the chunk; True once it has been seen ``threshold`` times."""
        return self.sketch.add(chunk_key) >= self.threshold


def make_admission(name: Literal["always", "frequency"], threshold: int) -> AdmissionPolicy:
    """The policy named in ``StoreConfig.admission``."""
    return FrequencyAdmission(threshold) if name == "frequency" else AlwaysAdmit()
