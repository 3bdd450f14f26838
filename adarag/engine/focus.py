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
from typing import TYPE_CHECKING

from adarag.engine.rope import apply_rope
from adarag.engine.stream import drop_unfocused

if TYPE_CHECKING:
    import torch

    from adarag.engine.batch import ForwardBatch
    from adarag.engine.kv_cache import KVCache
    from adarag.engine.layer_stack import CosSin, LayerStack
    from adarag.engine.selection import RecomputePlan
    from adarag.engine.stream import Stream


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


class ChunkFocus:
    """Cache-Craft's focused-chunk early stop inside a fused prefill's layer loop.

    Before each layer the query suffix's queries are projected (:meth:`queries`); after it,
    their attention per chunk feeds a :class:`FocusTracker` (:meth:`update`). Once the focused
    set is stable, the recomputed tokens of the other cached chunks leave the stream.

    Args:
        stack: The model's layers.
        batch: The prompt (its segments and the selection's ``focus_window``).
        plan: The prefill's positions.
    """

    def __init__(self, stack: LayerStack, batch: ForwardBatch, plan: RecomputePlan) -> None:
        window = batch.selection.focus_window
        assert window is not None, "no focus window"
        self._stack = stack
        self._plan = plan
        self._tracker = FocusTracker(window, len(batch.segments) - 2)
        self._cu = stack.cu_segments(batch)

    def queries(self, layer_idx: int, stream: Stream, cos_sin: CosSin) -> torch.Tensor:
        """Queries [n_query, num_heads, head_dim] of the query suffix (the stream's last rows)."""
        num_query = self._plan.query.numel()
        layer = self._stack.model.decoder_layers[layer_idx]
        q, _, _ = layer.project_qkv(stream.hidden[-num_query:])
        return apply_rope(q, cos_sin[0][-num_query:], cos_sin[1][-num_query:])  # no K needed

    def update(
        self, layer_idx: int, queries: torch.Tensor, kv: KVCache, stream: Stream, cos_sin: CosSin
    ) -> tuple[CosSin, bool]:
        """Add the layer's attention per chunk; the stream's cos/sin, and whether it is final.

        When the focused set has become stable, the stream drops the unfocused chunks' tokens.
        """
        positions = self._plan.query.to(self._stack.device)
        mass = self._stack.segment_mass(layer_idx, queries, positions, kv, self._cu)
        per_segment = mass.sum(dim=0).mean(dim=0)  # [num_segments]
        focused = self._tracker.update(per_segment[1:-1].tolist())
        if focused is None:
            return cos_sin, False
        return drop_unfocused(stream, cos_sin, self._plan, focused), True
