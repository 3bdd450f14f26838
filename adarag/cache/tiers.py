"""The three tiers (AdaCache section 3.1): where each chunk's KV comes from, and write-back.

For each chunk ``c_i`` of a prompt, in order of accuracy:

- **hard**: its KV computed after exactly ``system + c_1..c_i`` (key ``H_i``) -- reused as is;
- **soft**: its KV computed in an earlier prompt with the same effective prefix (predecessor and,
  for chunks after it, the sink chunk) -- reused with ratio α;
- **alternative** (FusionRAG's alternative path, when enabled): its KV stored by an earlier prompt
  in which a shorter run ``c_j..c_{i-1}`` of the same chunks came just before it, the longest run
  first;
- **variant** (Cache-Craft, when enabled): the stored variant with the lowest cache-fix overhead,
  recomputing that share of its tokens (see :mod:`adarag.cache.variants`);
- **fused** (FusionRAG, when enabled): its KV computed at warm after its most similar chunks;
- **independent**: its KV computed alone after the system prefix -- reused with ratio β;
- **miss**: computed in full.

After a prefill every chunk's fused KV is stored under its hard and soft keys (Algorithm 1, line
18), and a chunk that missed every tier is also stored as its independent entry (and, with
variants on, as a variant). With the alternative path on, it is also stored under the runs of the
chunks before it. The admission policy (:mod:`adarag.cache.admission`, ``StoreConfig.admission``)
decides which of these entries last and which are kept on probation only (readable, evicted
first).

Lookups and write-backs run outside the engine lock, so one request's disk or shared-tier read
never holds up another's prefill. The tiers' own state (hit counters, admission, the context
index) changes under the cache's leaf :class:`~adarag.cache.state_lock.StateLock`, which is never
held across a store call that may reach the disk or the shared tier (but for the context index's
walk, which asks the store what it holds); the variant index holds its own.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from adarag.cache.admission import make_admission
from adarag.cache.context_index import ContextIndex, PrefixMatch, schedule_contexts
from adarag.cache.keys import (
    PromptKeys,
    chunk_key,
    fused_key,
    fused_neighbour_key,
    path_keys,
    prompt_keys,
    system_key,
    variant_key,
)
from adarag.cache.state_lock import StateLock
from adarag.cache.store import KVStore
from adarag.cache.variants import Variant, VariantIndex, VariantStats
from adarag.config import CacheConfig, ExperimentalConfig
from adarag.kv import ChunkKV
from adarag.schema import Tier

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TierHit:
    """Where one chunk's KV comes from.

    Attributes:
        tier: The tier it was found in (``miss`` when none).
        kv: The cached KV, None on a miss.
        recompute_ratio: Fraction of its tokens to recompute (1.0 on a miss).
        token_ranking: For a variant, its tokens the most contextualised first (recomputed in
            that order); None otherwise.
    """

    tier: Tier
    kv: ChunkKV | None
    recompute_ratio: float
    token_ranking: tuple[int, ...] | None = None


@dataclass
class TierStats:
    """Hits per tier and recomputed tokens, since the cache was made."""

    hits: Counter[str] = field(default_factory=Counter)
    num_prompt_tokens: int = 0
    num_recomputed_tokens: int = 0
    num_probation_writes: int = 0  # write-backs the admission policy kept on probation only

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
        variants: Cache-Craft's variant metadata to share (another cache over the same store);
            a new index when None.
        experimental: The strategies' tiers (FusionRAG's fused entries and alternative path,
            Cache-Craft's variants); all off when None.
    """

    def __init__(
        self,
        config: CacheConfig,
        store: KVStore,
        model_fingerprint: str,
        system_ids: Sequence[int],
        sink_chunk_idx: int | None,
        variants: VariantIndex | None = None,
        experimental: ExperimentalConfig | None = None,
    ) -> None:
        self.config = config
        self.experimental = experimental or ExperimentalConfig()
        self.store = store
        self.root = system_key(model_fingerprint, system_ids)
        self.num_system_tokens = len(system_ids)
        self.sink_chunk_idx = sink_chunk_idx
        self.stats = TierStats()
        self.variants = (
            variants if variants is not None else VariantIndex(self.experimental.variants)
        )
        self.admission = make_admission(config.store.admission, config.store.admission_threshold)
        self.index = ContextIndex()
        """The chunk sequences this cache wrote to the hard tier (and planned ones)."""
        self.lock = StateLock("the tiers' counters, admission or context index")
        """Guards ``stats``, ``admission`` and ``index`` (a leaf lock)."""
        self._last_keys: tuple[tuple[tuple[int, ...], ...], PromptKeys] | None = None

    def keys(self, chunk_ids: Sequence[Sequence[int]]) -> PromptKeys:
        """Every key of a prompt's chunks (the last prompt's kept: its write-back reuses them)."""
        ids = tuple(tuple(chunk) for chunk in chunk_ids)
        last = self._last_keys  # one read: another thread may replace it
        if last is not None and last[0] == ids:
            return last[1]
        keys = prompt_keys(self.root, ids, self.sink_chunk_idx)
        self._last_keys = (ids, keys)
        return keys

    def system_kv(self) -> ChunkKV | None:
        """The system prefix's KV (an exact hit once computed)."""
        return self._get(self.root, self.num_system_tokens)

    def put_system(self, kv: ChunkKV) -> None:
        """Store the system prefix's KV."""
        self.store.put([self.root], kv, persist=True)

    def lookup(self, chunk_ids: Sequence[Sequence[int]]) -> list[TierHit]:
        """The most accurate tier holding each chunk (see module docstring).

        Reads the disk and the shared tier as needed: call it without the engine lock.
        """
        keys = self.keys(chunk_ids)
        hits = [self._lookup_one(keys, idx, len(ids)) for idx, ids in enumerate(chunk_ids)]
        with self.lock:
            self._count_hits(hits)
        return hits

    def write_back(
        self,
        chunk_ids: Sequence[Sequence[int]],
        hits: Sequence[TierHit],
        fused: Sequence[ChunkKV | None],
        variant_stats: Sequence[VariantStats | None] | None = None,
    ) -> None:
        """Store each chunk's fused KV under its hard and soft keys after a prefill.

        The entry lasts when its prefix (hard or soft key) has been written back before, or when
        it holds the independent key of a chunk seen often enough; otherwise it is kept on
        probation. A popular chunk's independent entry is taken off probation.

        Args:
            chunk_ids: The prompt's chunks.
            hits: What :meth:`lookup` returned for them.
            fused: Each chunk's KV after the prefill; None for a hard hit (stored already).
            variant_stats: With variants on, the statistics of each chunk computed in full
                (None for the others); those chunks become variants.
        """
        keys = self.keys(chunk_ids)
        config, experimental = self.config, self.experimental
        written = [idx for idx, hit in enumerate(hits) if hit.tier != "hard"]  # hard: stored
        entry_keys: dict[int, set[str]] = {idx: set() for idx in written}
        for idx in written:
            if config.hard.enabled:
                entry_keys[idx].add(keys.hard[idx])
            if config.soft.enabled:
                entry_keys[idx].add(keys.soft[idx])
            if experimental.alternative_path.enabled:
                entry_keys[idx].update(path_keys(keys.root, keys.chunks, idx))
        # the tiers' state under their lock first; the store's reads and writes after it
        with self.lock:
            if config.hard.enabled:
                self._index_path(keys.chunks, keys.hard)
            admitted = {idx: self._admit(keys.independent[idx], entry_keys[idx]) for idx in written}
        num_probation = 0
        for idx in written:
            hit, kv = hits[idx], fused[idx]
            assert kv is not None, "every chunk but a hard hit needs its fused KV"
            independent = keys.independent[idx]
            is_popular, is_repeated = admitted[idx]
            is_new = hit.tier == "miss" and not self.store.contains(independent)
            if config.independent.enabled and is_new:
                entry_keys[idx].add(independent)
            if is_popular and hit.tier == "independent":
                self.store.protect(independent)
            if entry_keys[idx]:
                is_lasting = is_repeated or (is_popular and independent in entry_keys[idx])
                num_probation += not is_lasting
                self.store.put(sorted(entry_keys[idx]), kv, probation=not is_lasting)
            stats = variant_stats[idx] if variant_stats is not None else None
            if experimental.variants.enabled and hit.tier == "miss" and stats is not None:
                self._add_variant(keys, idx, kv, stats)
        with self.lock:
            self._count_probation(num_probation)

    def put_fused(
        self,
        chunk_ids: Sequence[int],
        kv: ChunkKV,
        neighbours: Sequence[Sequence[int]] = (),
    ) -> None:
        """Store a chunk's KV computed after its similar chunks (FusionRAG's offline step).

        Args:
            chunk_ids: The chunk's token ids.
            kv: Its KV computed after ``neighbours``.
            neighbours: The chunks it was computed after; the entry also answers to a key per
                neighbour, so a lookup can count those in its prompt.
        """
        chunk = chunk_key(self.root, chunk_ids)
        keys = [fused_key(self.root, chunk)]
        keys += [
            fused_neighbour_key(self.root, chunk, chunk_key(self.root, ids)) for ids in neighbours
        ]
        self.store.put(keys, kv, persist=True)

    def has_fused(self, chunk_ids: Sequence[int]) -> bool:
        """Whether a chunk's fused KV is stored."""
        return self.store.contains(fused_key(self.root, self.keys([chunk_ids]).chunks[0]))

    def _add_variant(self, keys: PromptKeys, idx: int, kv: ChunkKV, stats: VariantStats) -> None:
        prefix = keys.chunks[:idx]
        key = variant_key(keys.root, prefix, keys.chunks[idx])
        self.store.put([key], kv)
        variant = Variant(key, keys.chunks[idx], prefix, stats)
        for evicted in self.variants.add(variant):
            self.store.discard(evicted.key)

    def put_independent(self, chunk_ids: Sequence[int], kv: ChunkKV) -> None:
        """Store a chunk's KV computed alone after the system prefix (ingest), on disk too.

        It is also the exact KV of the one-chunk prompt ``[chunk]``, a hard hit at position 1.
        """
        keys = self.keys([chunk_ids])
        self.store.put([keys.independent[0], keys.alone[0]], kv, persist=True)
        with self.lock:
            self._index_path(keys.chunks, keys.alone)

    def longest_cached_prefix(self, chunk_ids: Sequence[Sequence[int]]) -> PrefixMatch:
        """The order of a request's chunks that starts with the most hard-tier hits.

        Args:
            chunk_ids: The request's chunks in the retriever's order.
        """
        keys = self.keys(chunk_ids)
        with self.lock:  # the walk prunes the paths whose entries were evicted
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
            with self.lock:
                self._index_path(ordered.chunks, ordered.hard, planned=True)
        return list(batch.order)

    def independent_kv(self, chunk_ids: Sequence[int]) -> ChunkKV | None:
        """A chunk's independent KV, or None."""
        return self._get(self.keys([chunk_ids]).independent[0], len(chunk_ids))

    def has_independent(self, chunk_ids: Sequence[int]) -> bool:
        """Whether a chunk's independent KV is stored."""
        return self.store.contains(self.keys([chunk_ids]).independent[0])

    def record(self, num_prompt_tokens: int, num_recomputed_tokens: int) -> None:
        """Count a prefill's prompt and recomputed tokens."""
        with self.lock:
            self._count_tokens(num_prompt_tokens, num_recomputed_tokens)

    # --- the tiers' state, changed with ``self.lock`` held (checked in debug runs)

    def _count_tokens(self, num_prompt_tokens: int, num_recomputed_tokens: int) -> None:
        self.lock.check_held()
        self.stats.num_prompt_tokens += num_prompt_tokens
        self.stats.num_recomputed_tokens += num_recomputed_tokens

    def _count_hits(self, hits: Sequence[TierHit]) -> None:
        self.lock.check_held()
        self.stats.hits.update(hit.tier for hit in hits)

    def _count_probation(self, num_writes: int) -> None:
        self.lock.check_held()
        self.stats.num_probation_writes += num_writes

    def _index_path(
        self, chunk_keys: Sequence[str], hard_keys: Sequence[str], *, planned: bool = False
    ) -> None:
        self.lock.check_held()
        self.index.insert(chunk_keys, hard_keys, planned=planned)

    def _admit(self, independent: str, entry_keys: set[str]) -> tuple[bool, bool]:
        """Whether the chunk is popular and whether any of its entry keys is written again."""
        self.lock.check_held()
        is_popular = self.admission.record(independent)
        repeats = [self.admission.record(key) for key in sorted(entry_keys)]
        return is_popular, any(repeats)

    def _lookup_one(self, keys: PromptKeys, idx: int, num_tokens: int) -> TierHit:
        config, experimental = self.config, self.experimental
        if config.hard.enabled and (kv := self._get(keys.hard[idx], num_tokens)) is not None:
            return TierHit("hard", kv, 0.0)
        if config.soft.enabled and (kv := self._get(keys.soft[idx], num_tokens)) is not None:
            return TierHit("soft", kv, config.soft.recompute_ratio)
        if experimental.alternative_path.enabled:
            for key in path_keys(keys.root, keys.chunks, idx):  # the longest run first
                if (kv := self._get(key, num_tokens)) is not None:
                    return TierHit("alternative", kv, experimental.alternative_path.recompute_ratio)
        if experimental.variants.enabled and (hit := self._variant_hit(keys, idx, num_tokens)):
            return hit
        fused = fused_key(keys.root, keys.chunks[idx])
        if (
            experimental.fusion.enabled
            and self._neighbours_in_prompt(keys, idx) >= experimental.fusion.min_neighbors_in_prompt
            and (kv := self._get(fused, num_tokens)) is not None
        ):
            return TierHit("fused", kv, experimental.fusion.recompute_ratio)
        independent = keys.independent[idx]
        if config.independent.enabled and (kv := self._get(independent, num_tokens)) is not None:
            return TierHit("independent", kv, config.independent.recompute_ratio)
        return TierHit("miss", None, 1.0)

    def _neighbours_in_prompt(self, keys: PromptKeys, idx: int) -> int:
        """How many of the prompt's other chunks chunk ``idx``'s fused entry was computed after."""
        if not self.experimental.fusion.min_neighbors_in_prompt:
            return 0  # no gate: nothing to count
        chunk = keys.chunks[idx]
        return sum(
            self.store.contains(fused_neighbour_key(keys.root, chunk, other))
            for other in dict.fromkeys(keys.chunks)
            if other != chunk
        )

    def _variant_hit(self, keys: PromptKeys, idx: int, num_tokens: int) -> TierHit | None:
        """The lowest-CFO variant of chunk ``idx`` whose KV is still stored, or None."""
        while (found := self.variants.best(keys.chunks[idx], keys.chunks[:idx])) is not None:
            variant, cfo = found
            kv = self._get(variant.key, num_tokens)
            if kv is not None:
                return TierHit("variant", kv, cfo, variant.stats.ranking)
            self.variants.remove(variant)  # its KV was evicted from the store
        return None

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
