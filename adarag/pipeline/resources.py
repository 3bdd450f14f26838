"""The lazily built resources a pipeline shares: engine, profile, store, cache and prompts.

:class:`Resources` builds each on first use, under the engine lock, so requests arriving together
on a fresh pipeline share one of each. :meth:`Resources.derive` makes a pipeline's resources for
other config overrides, sharing the engine, the engine lock and (for the same store config)
the store.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import TypeVar

from adarag.cache.codec import TokenLayout
from adarag.cache.store import LayeredKVStore
from adarag.cache.tiers import TieredCache
from adarag.cache.variants import VariantIndex
from adarag.config import AdaRagConfig
from adarag.engine.checkpoint import HASH_CACHE_FILE
from adarag.engine.core import Engine
from adarag.engine.prefill_request import LearnedControls, PrefillRequest
from adarag.kv import ChunkKV
from adarag.pipeline.backends import load_engine
from adarag.pipeline.learned import learned_controls
from adarag.pipeline.prompt import PromptBuilder
from adarag.profiles import ModelProfile, find_profile, generic_profile
from adarag.schema import PromptLayout

T = TypeVar("T")

# the records keep the name of the pipeline's logger
logger = logging.getLogger("adarag.pipeline.rag")


class Resources:
    """One pipeline's engine, profile, store, cache and prompt builder, built on first use.

    Args:
        config: The pipeline's configuration.
        engine: A ready engine (shares its weights); built from ``config`` when None.
        engine_lock: The lock serialising engine work; a new one when None.
    """

    def __init__(
        self,
        config: AdaRagConfig,
        engine: Engine | None = None,
        engine_lock: threading.RLock | None = None,
    ) -> None:
        self.config = config
        self.engine_lock = engine_lock or threading.RLock()
        self._engine = engine
        self._store: LayeredKVStore | None = None
        self._variants: VariantIndex | None = None  # Cache-Craft's metadata, beside the store
        self._cache: TieredCache | None = None
        self._profile: ModelProfile | None = None
        self._learned: LearnedControls | None = None
        self._system: ChunkKV | None = None

    def _once(self, attribute: str, build: Callable[[], T]) -> T:
        """``self.<attribute>``, built on first use under the engine lock.

        Requests arriving together on a fresh pipeline must share one engine, profile and cache.
        """
        value = getattr(self, attribute)
        if value is None:
            with self.engine_lock:
                value = getattr(self, attribute)
                if value is None:
                    value = build()
                    setattr(self, attribute, value)
        return value

    @property
    def engine(self) -> Engine:
        """The backend engine (loaded on first use)."""
        config = self.config
        return self._once(
            "_engine", lambda: load_engine(config.engine, config.kernels, config.home)
        )

    @property
    def profile(self) -> ModelProfile:
        """The model's attention-sink profile and calibration (generic when never profiled)."""
        return self._once("_profile", self._find_profile)

    def _find_profile(self) -> ModelProfile:
        engine, home = self.engine, self.config.home
        checkpoint = engine.checkpoint
        name, num_layers = checkpoint.name, engine.spec.num_layers
        found = find_profile(
            name,
            engine.fingerprint,
            num_layers,
            [home / "profiles"],
            lambda: checkpoint.weights_fingerprint(home / HASH_CACHE_FILE),
        )
        if found is None:
            logger.warning("no attention profile for %s; run `adarag profile`", name)
            found = generic_profile(name, engine.fingerprint, num_layers)
        return found

    @property
    def learned(self) -> LearnedControls:
        """The profile's learned controls this config asks for (resolved, and logged, once)."""
        return self._once(
            "_learned",
            lambda: learned_controls(
                self.config.cache.recompute, self.profile, self.config.engine.backend
            ),
        )

    @property
    def kv_namespace(self) -> str:
        """The checkpoint, the dtype KV is computed in and the dtype it is stored in.

        With a trailer, the packet's digest too: an entry prefilled with another packet (or
        none) is never found, so it is computed again, never mixed.
        """
        engine_dtype = self.config.engine.dtype
        storage = self.config.cache.store.storage_dtype
        namespace = f"{self.engine.fingerprint}-{engine_dtype}-{storage}"
        learned = self.learned
        if learned.trailer_tokens and learned.packet_digest:
            namespace += f"-packet{learned.packet_digest[:12]}"
        return namespace

    @property
    def trailer_ids(self) -> tuple[int, ...]:
        """The packet tokens every chunk's entry ends with (the profile's trailer); () if none."""
        return self.learned.trailer_ids(self.engine.spec.vocab_size)

    @property
    def cache(self) -> TieredCache:
        """The three-tier chunk-KV cache of this model (opened on first use).

        One per pipeline: otherwise the entries and counts of all but one of the requests that
        arrived together first would be lost.
        """
        return self._once(
            "_cache",
            lambda: TieredCache(
                self.config.cache,
                self.open_store(),
                self.kv_namespace,
                self.prompts.system_ids,
                self.profile.sink_chunk_idx,
                self._variants,
                self.config.experimental,
            ),
        )

    @property
    def opened_cache(self) -> TieredCache | None:
        """The cache when opened already, else None (opens nothing)."""
        return self._cache

    @property
    def opened_store(self) -> LayeredKVStore | None:
        """The store when opened already, else None (opens nothing)."""
        return self._store

    @property
    def kv_directory(self) -> Path:
        """The disk tier's directory: ``<cache.store.directory or home/kv>/<kv_namespace>``."""
        root = self.config.cache.store.directory or self.config.home / "kv"
        return root / self.kv_namespace

    def open_store(self) -> LayeredKVStore:
        """The store of this pipeline's cache (opened on first use)."""
        with self.engine_lock:  # one store per pipeline, also when first used concurrently
            if self._store is None:
                spec = self.engine.spec
                # the model's positions (not this run's context cap, which may change)
                max_positions = max(spec.max_position_embeddings, self.engine.max_context_tokens)
                layout = TokenLayout(
                    spec.num_layers, spec.num_kv_heads, spec.head_dim, max_positions
                )
                self._store = LayeredKVStore(
                    self.config.cache.store, self.kv_directory, self.kv_namespace, layout
                )
            return self._store

    @cached_property
    def prompts(self) -> PromptBuilder:
        """The prompt builder for ``config.prompt`` (the only layout maker)."""
        return PromptBuilder(self.engine.tokenizer, self.config.prompt)

    def derive(self, config: AdaRagConfig) -> Resources:
        """Resources for ``config`` sharing this engine, engine lock and (same config) store."""
        derived = Resources(config, self.engine, self.engine_lock)
        if config.cache.store == self.config.cache.store:
            derived._store = self.open_store()  # one store per directory: entries and stats shared
            if config.experimental.variants == self.config.experimental.variants:
                derived._variants = self.cache.variants  # the variants whose KV that store holds
        return derived

    def system_kv(self) -> ChunkKV:
        """The system prefix's exact KV, computed once per process (and kept in the store).

        Every process computes it in the engine's dtype rather than reading the stored copy,
        which the storage format may round (bfloat16 by default): a prompt computed at ratio 1.0
        then equals a full prefill token for token, and a restarted process computes what this
        one did.
        """
        return self._once("_system", self._computed_system_kv)

    def _computed_system_kv(self) -> ChunkKV:
        system_ids = self.prompts.system_ids
        output = self.engine.prefill(PrefillRequest(PromptLayout((), (), system_ids)))
        computed = output.kv.segment(0, len(system_ids))
        cache = self.cache
        if cache.system_kv() is None:
            cache.put_system(computed)
        return computed

    def independent_kv(self, ids: tuple[int, ...]) -> ChunkKV:
        """A chunk's independent KV, computed and stored when absent."""
        cache = self.cache
        with self.engine_lock:
            kv = cache.independent_kv(ids)
            if kv is None:
                system_ids, system_kv = self.prompts.system_ids, self.system_kv()
                kv = self.engine.compute_chunk(
                    system_ids, ids, system_kv, packet=self.learned.packet
                )
                cache.put_independent(ids, kv)
            return kv
