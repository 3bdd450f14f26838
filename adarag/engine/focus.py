"""Focused chunks: which retrieved chunks the question attends to (Cache-Craft Algorithm 1).

Layer by layer, the attention mass the query suffix pays each chunk is accumulated. The chunks
are sorted by it and the gaps between neighbours in that order are normalised to a distribution
``p``; the change point is the gap with the largest entropy term ``−p log p`` (the step of the
cumulative entropy), and the chunks before it are the focused set. Once the same set has held for
``window`` consecutive layers it is final: the fused prefill stops recomputing the tokens of the
other cached chunks for the remaining layers (their cached KV is used there).

Where the paper leaves details open: the focused set is the chunks before the chosen gap (at
least one chunk); with equal masses (no gap) or one chunk, every chunk is focused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


def focused_chunks(cumulative: Sequence[float]) -> frozenset[int]:
    """The chunks (indices into ``cumulative``) before the entropy change point."""
    num_chunks = len(cumulative)
    order = sorted(range(num_chunks), key=lambda idx: (-cumulative[idx], idx))
    ranked = [cumulative[idx] for idx in order]
    gaps = [ranked[idx] - ranked[idx + 1] for idx in range(num_chunks - 1)]
    total = sum(gaps)
    if num_chunks < 2 or total <= 0.0:
        return frozenset(range(num_chunks))
    terms = [-(gap / total) * math.log(gap / total) if gap > 0.0 else 0.0 for gap in gaps]
    change = max(range(len(terms)), key=lambda idx: (terms[idx], -idx))
    return frozenset(order[: change + 1])


@dataclass
class FocusTracker:
    """Accumulates the query's attention per chunk until the focused set is stable.

    Args:
        window: Consecutive layers the set must hold.
        num_chunks: Chunks in the prompt.
    """

    window: int
    num_chunks: int
    cumulative: list[float] = field(init=False)
    history: list[frozenset[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cumulative = [0.0] * self.num_chunks

    def update(self, chunk_mass: Sequence[float]) -> frozenset[int] | None:
        """Add one layer's mass per chunk; the focused set once stable, else None."""
        assert len(chunk_mass) == self.num_chunks, "one mass per chunk"
        self.cumulative = [
            total + mass for total, mass in zip(self.cumulative, chunk_mass, strict=True)
        ]
        self.history.append(focused_chunks(self.cumulative))
        recent = self.history[-self.window :]
        if len(recent) == self.window and all(found == recent[-1] for found in recent):
            return recent[-1]
        return None
