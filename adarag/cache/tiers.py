"""The three tiers (AdaCache section 3.1): where each chunk's KV comes from, and write-back.

For each chunk ``c_i`` of a prompt, in order of accuracy:

- **hard**: its KV computed after exactly ``system + c_1..c_i`` (key ``H_i``) -- reused as is;
- **soft**: its KV computed in an earlier prompt with the same effective prefix (predecessor and,
  for chunks after it, the sink chunk) -- reused with ratio α;
- **independent**: its KV computed alone after the system prefix -- reused with ratio β;
- **miss**: computed in full.

After a prefill every chunk's fused KV is stored under its hard and soft keys (Algorithm 1, line
18), and a chunk that missed every tier is also stored as its independent entry.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from adarag.cache.context_index import ContextIndex, PrefixMatch, schedule_contexts
from adarag.cache.entry import ChunkKV
from adarag.cache.keys import PromptKeys, prompt_keys, system_key
from adarag.cache.store import KVStore
from adarag.config import CacheConfig
from adarag.schema import Tier

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TierHit:
    """Where one chunk's KV comes from.

    Attributes:
        tier: The tier it was found in (``miss`` when none).
        kv: The cached KV, None on a miss.
        recompute_ratio: Fraction of its tokens to recompute (1.0 on a miss).
    """

    tier: Tier
    kv: ChunkKV | None
    recompute_ratio: float


@dataclass
class TierStats:
    """Hits per tier and recomputed tokens, since the cache was made."""

    hits: Counter[str] = field(default_factory=Counter)
    num_prompt_tokens: int = 0
    num_recomputed_tokens: int = 0

    @property
    def recomputed_ratio(self) -> float:
        """Recomputed tokens over prompt tokens."""
        return self.num_recomputed_tokens / max(self.num_prompt_tokens, 1)


class TieredCache:
    """Tier lookup and write-back over one :class:`KVStore`.

    Args:
        config: Tier switches and ratios.
        store: Where entries live.
        model_fingerprint: Part of every key.
        system_ids: Token ids of the system prefix (part of every key).
        sink_chunk_idx: The profile's sink chunk (0-based), or None.
    """

    def __init__(
        self,
        config: CacheConfig,
        store: KVStore,
        model_fingerprint: str,
        system_ids: Sequence[int],
        sink_chunk_idx: int | None,
    ) -> None:
        self.config = config
        self.store = store
        self.root = system_key(model_fingerprint, system_ids)
        self.num_system_tokens = len(system_ids)
        self.sink_chunk_idx = sink_chunk_idx
        self.stats = TierStats()
        self.index = ContextIndex()
        """The chunk sequences this cache wrote to the hard tier (and planned ones)."""

    def keys(self, chunk_ids: Sequence[Sequence[int]]) -> PromptKeys:
        """Every key of a prompt's chunks."""
        return prompt_keys(self.root, chunk_ids, self.sink_chunk_idx)

    def system_kv(self) -> ChunkKV | None:
        """The system prefix's KV (an exact hit once computed)."""
        return self._get(self.root, self.num_system_tokens)

    def put_system(self, kv: ChunkKV) -> None:
        """Store the system prefix's KV."""
        self.store.put([self.root], kv, persist=True)

    def lookup(self, chunk_ids: Sequence[Sequence[int]]) -> list[TierHit]:
        """The most accurate tier holding each chunk (see module docstring)."""
        keys = self.keys(chunk_ids)
        hits = []
        for idx in range(len(chunk_ids)):
            hits.append(self._lookup_one(keys, idx, len(chunk_ids[idx])))
            self.stats.hits[hits[-1].tier] += 1
        return hits

    def write_back(
        self, chunk_ids: Sequence[Sequence[int]], hits: Sequence[TierHit], fused: Sequence[ChunkKV]
    ) -> None:
        """Store each chunk's fused KV under its hard and soft keys after a prefill.

        Args:
            chunk_ids: The prompt's chunks.
            hits: What :meth:`lookup` returned for them.
            fused: Each chunk's KV after the prefill.
        """
        keys = self.keys(chunk_ids)
        if self.config.hard.enabled:
            self.index.insert(keys.chunks, keys.hard)
        for idx, (hit, kv) in enumerate(zip(hits, fused, strict=True)):
            if hit.tier == "hard":
                continue  # already stored under this exact prefix
            entry_keys = set()
            if self.config.hard.enabled:
                entry_keys.add(keys.hard[idx])
            if self.config.soft.enabled:
                entry_keys.add(keys.soft[idx])
            is_new = hit.tier == "miss" and not self.store.contains(keys.independent[idx])
            if self.config.independent.enabled and is_new:
                entry_keys.add(keys.independent[idx])
            if entry_keys:
                self.store.put(sorted(entry_keys), kv)

    def put_independent(self, chunk_ids: Sequence[int], kv: ChunkKV) -> None:
        """Store a chunk's KV computed alone after the system prefix (ingest), on disk too.

        It is also the exact KV of the one-chunk prompt ``[chunk]``, a hard hit at position 1.
        """
        keys = self.keys([chunk_ids])
        self.store.put([keys.independent[0], keys.alone[0]], kv, persist=True)
        self.index.insert(keys.chunks, keys.alone)

    def longest_cached_prefix(self, chunk_ids: Sequence[Sequence[int]]) -> PrefixMatch:
        """The order of a request's chunks that starts with the most hard-tier hits.

        Args:
            chunk_ids: The request's chunks in the retriever's order.
        """
        keys = self.keys(chunk_ids)
        return self.index.longest_prefix(keys.chunks, self.store.contains)

    def plan(self, requests: Sequence[Sequence[Sequence[int]]]) -> list[int]:
        """Schedule a batch (see :func:`schedule_contexts`) and record each request's order.

        Returns:
            The request indices in the order to run them.
        """
        chunk_keys = [self.keys(chunk_ids).chunks for chunk_ids in requests]
        batch = schedule_contexts(chunk_keys)
        for chunks, order in zip(requests, batch.chunk_orders, strict=True):
            ordered = self.keys([chunks[idx] for idx in order])
            self.index.insert(ordered.chunks, ordered.hard, planned=True)
        return list(batch.order)

    def has_independent(self, chunk_ids: Sequence[int]) -> bool:
        """Whether a chunk's independent KV is stored."""
        return self.store.contains(self.keys([chunk_ids]).independent[0])

    def record(self, num_prompt_tokens: int, num_recomputed_tokens: int) -> None:
        """Count a prefill's prompt and recomputed tokens."""
        self.stats.num_prompt_tokens += num_prompt_tokens
        self.stats.num_recomputed_tokens += num_recomputed_tokens

    def _lookup_one(self, keys: PromptKeys, idx: int, num_tokens: int) -> TierHit:
        config = self.config
        if config.hard.enabled and (kv := self._get(keys.hard[idx], num_tokens)) is not None:
            return TierHit("hard", kv, 0.0)
        if config.soft.enabled and (kv := self._get(keys.soft[idx], num_tokens)) is not None:
            return TierHit("soft", kv, config.soft.recompute_ratio)
        independent = keys.independent[idx]
        if config.independent.enabled and (kv := self._get(independent, num_tokens)) is not None:
            return TierHit("independent", kv, config.independent.recompute_ratio)
        return TierHit("miss", None, 1.0)

    def _get(self, key: str, num_tokens: int) -> ChunkKV | None:
        """The entry under ``key`` if it holds ``num_tokens`` tokens (anything else is a miss)."""
        kv = self.store.get(key)
        if kv is not None and kv.num_tokens != num_tokens:
            logger.warning(
                "dropping cached KV of %d tokens stored for a %d-token segment; recomputing it",
                kv.num_tokens,
                num_tokens,
            )
            self.store.discard(key)
            return None
        return kv
