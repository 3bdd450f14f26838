"""The order a request's chunks are listed in, and the hint that restores the retriever's ranking.

RAGBoost's prompt-level reuse (its sections 5 and 6), over the exact hard tier, set in
``experimental.arrangement``:

- ``reorder = "longest_prefix"``: the chunks start with the longest sequence of them the hard
  tier holds (the context index's answer), the rest follow in the retriever's order;
- ``deduplicate``: a conversation's context is kept as the start of the next turn's (so the
  previous turn's prompt is a hard prefix) and only the new turn's chunks not already in it are
  appended, so every chunk is listed once;
- whenever the listed order is not the retriever's, the order hint (``order_hint``) names the
  passages by their listed numbers, best first; a passage an earlier turn brought is named by
  its location (``location_hint``).

Reuse stays exact: only the order of the text changes, and the hint says what the order was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from adarag.config import AdaRagConfig
from adarag.schema import Chunk


@dataclass(frozen=True)
class Arrangement:
    """The chunks in listed order and, for each retrieved chunk best first, where it is listed.

    Attributes:
        chunks: The context in prompt order.
        ranking: For each retrieved chunk, best first, its 0-based index in ``chunks``.
        repeated: For each entry of ``ranking``, whether an earlier turn already listed it.
    """

    chunks: tuple[Chunk, ...]
    ranking: tuple[int, ...]
    repeated: tuple[bool, ...]

    def hint(self, config: AdaRagConfig, num_listed: int | None = None) -> str:
        """The order hint for the first ``num_listed`` chunks (all by default).

        Empty when they are listed in the retriever's order and none is repeated, so such a
        prompt is exactly the plain one.
        """
        listed = len(self.chunks) if num_listed is None else num_listed
        kept = [(pos, rep) for pos, rep in zip(self.ranking, self.repeated, strict=True)]
        kept = [(pos, rep) for pos, rep in kept if pos < listed]
        if [pos for pos, _ in kept] == list(range(listed)) and not any(r for _, r in kept):
            return ""
        names = [
            config.experimental.arrangement.location_hint.replace("{position}", str(pos + 1))
            if rep
            else f"[{pos + 1}]"
            for pos, rep in kept
        ]
        return config.experimental.arrangement.order_hint.replace("{ranking}", ", ".join(names))


def arrange(
    retrieved: Sequence[Chunk],
    config: AdaRagConfig,
    cached_order: Sequence[int] | None = None,
    conversation_chunks: Sequence[Chunk] = (),
) -> Arrangement:
    """List ``retrieved`` (best first) as the configuration says.

    Args:
        retrieved: The retriever's chunks, best first.
        config: ``experimental.arrangement`` (``reorder``, ``deduplicate``) chooses it.
        cached_order: When :func:`wants_cached_order`, the order of ``retrieved`` whose leading
            chunks the hard tier holds most of (indices into it).
        conversation_chunks: The conversation's context so far, in listed order (the previous
            answer's chunks); used with ``experimental.arrangement.deduplicate``.
    """
    arrangement = config.experimental.arrangement
    if arrangement.deduplicate and conversation_chunks:
        listed = list(_unique(conversation_chunks))
        earlier = {chunk.text for chunk in listed}
        unique = list(_unique(retrieved))
        listed += [chunk for chunk in unique if chunk.text not in earlier]
        place = {chunk.text: idx for idx, chunk in enumerate(listed)}
        return Arrangement(
            tuple(listed),
            tuple(place[chunk.text] for chunk in unique),
            tuple(chunk.text in earlier for chunk in unique),
        )
    if wants_cached_order(config, conversation_chunks):
        assert cached_order is not None, "longest_prefix needs the hard tier's order"
        order = list(cached_order)
        listed = [retrieved[idx] for idx in order]
        ranking = tuple(order.index(idx) for idx in range(len(retrieved)))
        return Arrangement(tuple(listed), ranking, (False,) * len(retrieved))
    return Arrangement(tuple(retrieved), tuple(range(len(retrieved))), (False,) * len(retrieved))


def wants_cached_order(config: AdaRagConfig, conversation_chunks: Sequence[Chunk]) -> bool:
    """Whether :func:`arrange` lists the chunks in the hard tier's order (RAGBoost's reorder)."""
    arrangement = config.experimental.arrangement
    if arrangement.deduplicate and conversation_chunks:
        return False
    return arrangement.reorder == "longest_prefix" and config.cache.hard.enabled


def _unique(chunks: Sequence[Chunk]) -> list[Chunk]:
    """``chunks`` with each text once (its first occurrence)."""
    seen: set[str] = set()
    kept = []
    for chunk in chunks:
        if chunk.text not in seen:
            seen.add(chunk.text)
            kept.append(chunk)
    return kept
