"""What a pipeline shows of its lazily built resources: config, model, profile, cache, prompts.

:class:`ResourceViews` is the base of :class:`~adarag.pipeline.rag.AdaRAG`: each view reads the
pipeline's :class:`~adarag.pipeline.resources.Resources`, building what it names on first use.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from adarag.cache.store import LayeredKVStore, StoreStats
from adarag.cache.tiers import TieredCache, TierStats
from adarag.config import AdaRagConfig
from adarag.engine.core import Engine
from adarag.engine.prefill_request import LearnedControls
from adarag.pipeline.prompt import PromptBuilder
from adarag.pipeline.resources import Resources
from adarag.profiles import ModelProfile


@dataclass(frozen=True)
class CacheReport:
    """Cache statistics: tier hits and recomputed tokens, store sizes and events."""

    tiers: TierStats
    store: StoreStats


class ResourceViews:
    """The pipeline's configuration, engine, profile, cache and prompt builder, and its close.

    Attributes:
        _resources: What the views read (set by the pipeline's constructor).
    """

    _resources: Resources

    @property
    def config(self) -> AdaRagConfig:
        """The configuration."""
        return self._resources.config

    @property
    def engine_lock(self) -> threading.RLock:
        """The lock serialising engine work (shared by ``AdaRAG.with_config``)."""
        return self._resources.engine_lock

    @property
    def engine(self) -> Engine:
        """The backend engine (loaded on first use)."""
        return self._resources.engine

    @property
    def model_name(self) -> str:
        """The checkpoint's name (``SmolLM2-135M-Instruct``), for traces and usage (loads it)."""
        return str(self.engine.checkpoint.name)

    @property
    def profile(self) -> ModelProfile:
        """The model's attention-sink profile and calibration (generic when never profiled)."""
        return self._resources.profile

    @property
    def learned_controls(self) -> LearnedControls:
        """What this pipeline's fused prefills read from the profile (scorer, ladder, packet)."""
        return self._resources.learned

    @property
    def kv_namespace(self) -> str:
        """What stored chunk KV is bound to besides its token ids.

        The checkpoint, the dtype KV is computed in and the dtype it is stored in: the disk
        tier's directory name, and part of every cache key. The system prompt, template and
        separator are bound through the token ids of the system prefix and of each chunk.
        """
        return self._resources.kv_namespace

    @property
    def cache(self) -> TieredCache:
        """The three-tier chunk-KV cache of this model (opened on first use)."""
        return self._resources.cache

    @property
    def kv_directory(self) -> Path:
        """The disk tier's directory: ``<cache.store.directory or home/kv>/<kv_namespace>``."""
        return self._resources.kv_directory

    @property
    def cache_disk_problem(self) -> str | None:
        """Why chunk KV is not written to the disk tier now (a full or read-only file system).

        None while the disk tier takes writes, has none, or the cache is not opened yet.
        """
        store = self._resources.opened_store
        return None if store is None else store.disk_problem

    def cache_stats(self) -> CacheReport:
        """Hits per tier, recomputed tokens, and the store's sizes and evictions."""
        cache = self.cache
        store = cache.store
        store_stats = store.snapshot() if isinstance(store, LayeredKVStore) else StoreStats()
        return CacheReport(cache.stats, store_stats)

    def close(self) -> None:
        """Write memory-only cache entries to disk, so a later process reuses them."""
        cache = self._resources.opened_cache
        if cache is not None:
            store = cache.store
            if isinstance(store, LayeredKVStore):
                store.flush()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def prompts(self) -> PromptBuilder:
        """The prompt builder for this pipeline's ``config.prompt`` (the only layout maker)."""
        return self._resources.prompts

    @property
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (for token-sized chunking and counting)."""
        return self.engine.tokenizer
