"""Eviction policies: which entry leaves a full tier first.

A policy maps an entry's usage to a sort key; the entry with the smallest key is evicted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol


@dataclass
class EntryUsage:
    """Bookkeeping of one stored entry."""

    num_hits: int
    last_access: float
    inserted: float


class EvictionPolicy(Protocol):
    """Orders entries for eviction."""

    def priority(self, usage: EntryUsage) -> tuple[float, ...]:
        """Sort key; the smallest is evicted first."""
        ...


class LRUPolicy:
    """Least recently used first."""

    def priority(self, usage: EntryUsage) -> tuple[float, ...]:
        """Older last access first."""
        return (usage.last_access,)


class LFUPolicy:
    """Least frequently used first, least recent among equals.

    Chunk popularity follows a power law, so hit counts separate the few hot chunks from the long
    tail better than recency alone.
    """

    def priority(self, usage: EntryUsage) -> tuple[float, ...]:
        """Fewer hits first, then older last access."""
        return (float(usage.num_hits), usage.last_access)


def make_policy(name: Literal["lru", "lfu"]) -> EvictionPolicy:
    """The policy named in ``StoreConfig.eviction_policy``."""
    return LFUPolicy() if name == "lfu" else LRUPolicy()
