"""Chunk-KV storage: a byte-capped memory tier spilling to a byte-capped disk tier (and more).

Under them an optional shared tier lives on a Redis-protocol server (:mod:`adarag.cache.remote`).
An entry is one chunk's KV; several keys may point at it (a chunk's hard and soft keys share one
copy). Entries evicted from memory are written to disk and to the shared tier (where they are not
already); entries put with ``persist=True`` are written through at once;
:meth:`LayeredKVStore.flush` writes the rest. A key missing locally is looked up in the shared
tier; a verified hit there is promoted into memory (and reaches the disk when it is spilled).
Entries put on probation (see :mod:`adarag.cache.admission`) are evicted before all others and
dropped when evicted from memory (never spilled); :meth:`LayeredKVStore.flush` writes them only
into free disk room, after the lasting entries, and never to the shared tier.
Every method takes one lock, so threads of one process may share a store; entries are immutable
once stored, so readers never see a torn entry. Writes to the shared tier wait for the lock's
release: the call that caused them (``put``, ``get``, ``flush``) sends them before it returns, so
a slow server holds up only that call, never another thread's lookup.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from adarag.cache.codec import InvalidEntry, KVCodec, StoredKV, TokenLayout
from adarag.cache.disk import DiskTier, EntrySignedElsewhere, EntryUnreadable
from adarag.cache.entry_format import encode_entry
from adarag.cache.eviction import EntryUsage, make_policy
from adarag.cache.keys import digest
from adarag.cache.remote import RemoteHit, RemoteTier
from adarag.config import StoreConfig
from adarag.kv import ChunkKV

logger = logging.getLogger(__name__)


class KVStore(Protocol):
    """Key-value storage of chunk KV."""

    def get(self, key: str) -> ChunkKV | None:
        """The entry under ``key``, or None (a miss is normal flow)."""
        ...

    def contains(self, key: str) -> bool:
        """Whether ``key`` is stored (in memory, on disk or in a shared tier)."""
        ...

    def put(
        self, keys: Sequence[str], kv: ChunkKV, *, persist: bool = False, probation: bool = False
    ) -> None:
        """Store ``kv`` under every key in ``keys`` (replacing what they pointed at)."""
        ...

    def protect(self, key: str) -> None:
        """Take the entry under ``key`` off probation (no-op when absent or not on it)."""
        ...

    def discard(self, key: str) -> None:
        """Forget ``key`` (and delete its entry once no key points at it)."""
        ...


@dataclass
class StoreStats:
    """Sizes and events of a store."""

    memory_bytes: int = 0
    disk_bytes: int = 0
    memory_entries: int = 0
    disk_entries: int = 0
    memory_evictions: int = 0
    disk_evictions: int = 0
    disk_reads: int = 0
    disk_writes: int = 0
    disk_read_errors: int = 0  # reads that failed with an OS error (the file was kept)
    signature_failures: int = 0  # entries (disk and shared tier) whose signature failed
    remote_hits: int = 0
    remote_misses: int = 0
    remote_writes: int = 0
    remote_read_bytes: int = 0
    remote_write_bytes: int = 0
    remote_dropped: int = 0
    remote_failures: int = 0
    remote_signature_failures: int = 0
    remote_oversized: int = 0


@dataclass
class _Entry:
    keys: set[str]  # the keys that point at it now (newer entries may have taken some)
    usage: EntryUsage
    created_keys: tuple[str, ...]  # the keys it was stored under: its id and its file's list
    stored: StoredKV | None = None  # None: on disk only
    memory_bytes: int = 0
    disk_bytes: int = 0  # 0: not on disk
    remote: bool = False  # sent to (or read from) the shared tier
    probation: bool = False  # evicted first, never spilled
    unreadable: bool = False  # its file could not be read last time (kept: it may be valid)


@dataclass
class _Index:
    entries: dict[str, _Entry] = field(default_factory=dict)
    key_to_entry: dict[str, str] = field(default_factory=dict)


class LayeredKVStore:
    """Memory tier spilling to a disk tier, both capped in bytes, with a pluggable eviction policy.

    This is the storage layered under :class:`~adarag.cache.tiers.TieredCache`: the cache's tiers
    decide under which key a chunk's KV is looked up, the store's layers where its bytes live.

    Args:
        config: Capacities, storage dtype, eviction policy.
        directory: The disk tier's directory for this model, or None for memory only.
        model_fingerprint: Tells this model's disk and shared entries from any other's.
        layout: The model's per-token KV layout; disk entries of another shape are never
            served (unchecked when None).

    Both local tiers stay within their byte caps at every moment: room is made before an entry
    is written, and an entry larger than a tier's cap is not kept in that tier. With
    ``config.remote_url`` a shared tier sits under them (its size is the server's to cap).
    With a signing key (``config.signing_key``) every entry written is signed, and an entry read
    from disk or the shared tier whose signature fails is refused and counted
    (``signature_failures``): deleted when it is unsigned or forged under this key, kept (and
    never overwritten) when another key signed it, so one process given a wrong key destroys
    nothing the others wrote. Without a key, the store trusts whoever can write its directory
    or server.

    A disk directory on a read-only or full file system leaves the store serving: the entries
    there are read, new ones stay in memory, and :attr:`disk_problem` says why.

    Raises:
        CacheError: The disk directory cannot be created or written (but for a read-only or
            full file system), or ``config.signing_key_file`` cannot be read.
        MissingDependencyError: ``remote_url`` is set and the ``redis`` package is missing.
    """

    def __init__(
        self,
        config: StoreConfig,
        directory: Path | None,
        model_fingerprint: str,
        layout: TokenLayout | None = None,
    ) -> None:
        self.config = config
        self.model_fingerprint = model_fingerprint
        self.codec = KVCodec(config.storage_dtype, layout)
        self.signing_key = config.signing_key_bytes()
        self.policy = make_policy(config.eviction_policy)
        self.stats = StoreStats()
        self._lock = threading.RLock()
        self._to_send: list[tuple[str, tuple[str, ...], bytes]] = []  # for the shared tier
        self._index = _Index()
        self.disk: DiskTier | None = None
        if directory is not None and config.disk_capacity_bytes > 0:
            self.disk = DiskTier(directory, model_fingerprint, self.codec, self.signing_key)
        if self.disk is not None:
            for header in self.disk.scan():  # oldest first: a newer file's keys win
                for key in header.keys:
                    self._unlink_key(key)
                created = header.created_ns / 1e9
                usage = EntryUsage(0, created, created)
                self._link(
                    header.entry_id,
                    _Entry(set(header.keys), usage, header.keys, disk_bytes=header.nbytes),
                )
                self.stats.disk_bytes += header.nbytes
            self._evict_disk()
        self.remote: RemoteTier | None = None
        if config.remote_url is not None:
            self.remote = RemoteTier(config, model_fingerprint, self.codec, self.signing_key)

    @property
    def disk_problem(self) -> str | None:
        """Why chunk KV is not written to disk now (read-only or full), or None when it is."""
        return None if self.disk is None else self.disk.write_problem

    def get(self, key: str) -> ChunkKV | None:
        """The entry under ``key`` (loaded from disk or the shared tier if needed), or None."""
        stored = self._get_local(key)
        if stored is None and self.remote is not None:
            hit = self.remote.fetch(key)  # outside the lock: other threads go on meanwhile
            if hit is not None:
                with self._lock:
                    self._promote(hit)
                stored = hit.stored
        self._send_to_remote()  # what making room in memory spilled
        if stored is None:
            return None
        try:
            return self.codec.decode(stored)
        except InvalidEntry as invalid:  # checked when read; never kept where it was found
            logger.warning("dropping KV cache entry under %s from every tier: %s", key, invalid)
            self._drop_everywhere(key)
            return None

    def _drop_everywhere(self, key: str) -> None:
        """Forget the entry under ``key`` with all its keys, in memory, on disk and shared."""
        with self._lock:
            entry_id = self._index.key_to_entry.get(key)
            keys = {key}
            if entry_id is not None:
                keys |= self._index.entries[entry_id].keys
                self._forget(entry_id)
        if self.remote is not None:
            for dropped in keys:
                self.remote.forget(dropped)

    def _get_local(self, key: str) -> StoredKV | None:
        """The stored entry under ``key`` in memory or on disk (read into memory), or None."""
        with self._lock:
            entry_id = self._index.key_to_entry.get(key)
            if entry_id is None:
                return None
            entry = self._index.entries[entry_id]
            entry.usage.num_hits += 1
            entry.usage.last_access = time.time()
            stored = entry.stored
            if stored is None:
                self.stats.disk_reads += 1
                try:
                    stored = self.disk.read(entry_id) if self.disk is not None else None
                except EntryUnreadable as unreadable:  # the file stays, this read misses
                    if not isinstance(unreadable, EntrySignedElsewhere):
                        self.stats.disk_read_errors += 1
                    entry.unreadable = True
                    return None
                if stored is None:  # corrupted or removed behind our back: a clean miss
                    self._forget(entry_id)
                    return None
                entry.unreadable = False
                entry.stored, entry.memory_bytes = stored, stored.nbytes
                self.stats.memory_bytes += stored.nbytes
                self._evict_memory(keep=entry_id)
            return stored

    def contains(self, key: str) -> bool:
        """Whether ``key`` is stored in either tier."""
        with self._lock:
            if key in self._index.key_to_entry:
                return True
        return self.remote is not None and self.remote.exists(key)

    def put(
        self, keys: Sequence[str], kv: ChunkKV, *, persist: bool = False, probation: bool = False
    ) -> None:
        """Store ``kv`` (encoded in the storage format) under ``keys``.

        Args:
            keys: Every key the entry answers to; they stop pointing at older entries.
            kv: The chunk's KV.
            persist: Write it to disk now, not only when it is evicted from memory.
            probation: Memory only, and evicted before every entry that is not on probation.
        """
        assert keys, "an entry needs at least one key"
        assert not (persist and probation), "an entry on probation is never written to disk"
        stored = self.codec.encode(kv)
        with self._lock:
            self._insert(keys, stored, persist=persist, probation=probation)
        self._send_to_remote()

    def protect(self, key: str) -> None:
        """Take the entry under ``key`` off probation (no-op when absent or not on it)."""
        with self._lock:
            entry_id = self._index.key_to_entry.get(key)
            if entry_id is not None:
                self._index.entries[entry_id].probation = False

    def discard(self, key: str) -> None:
        """Forget ``key`` (also in the shared tier); its entry goes once no key points at it."""
        with self._lock:
            self._unlink_key(key)
        if self.remote is not None:
            self.remote.forget(key)

    def flush(self) -> None:
        """Write every memory-only entry to disk and the shared tier (call before exiting).

        Entries on probation go last, to disk only and only into free room: they never evict a
        file and never reach the shared tier.
        """
        with self._lock:
            resident = [(i, e) for i, e in self._index.entries.items() if e.stored is not None]
            for entry_id, entry in sorted(resident, key=lambda item: item[1].probation):
                if not entry.probation:
                    self._spill(entry_id, entry)
                    continue
                room = self.config.disk_capacity_bytes - self.stats.disk_bytes
                if entry.memory_bytes <= room:
                    self._spill(entry_id, entry, to_remote=False)
        self._send_to_remote()

    def snapshot(self) -> StoreStats:
        """A copy of the current statistics."""
        with self._lock:
            entries = self._index.entries.values()
            self.stats.memory_entries = sum(1 for e in entries if e.stored is not None)
            self.stats.disk_entries = sum(1 for e in entries if e.disk_bytes)
            if self.remote is not None:
                for name, value in vars(self.remote.snapshot()).items():
                    setattr(self.stats, f"remote_{name}", value)
            self.stats.signature_failures = self.stats.remote_signature_failures + (
                self.disk.num_signature_failures if self.disk is not None else 0
            )
            return StoreStats(**vars(self.stats))

    # --- internals (called with the lock held)

    def _insert(
        self,
        keys: Sequence[str],
        stored: StoredKV,
        *,
        persist: bool,
        on_remote: bool = False,
        probation: bool = False,
    ) -> _Entry:
        entry_id = digest(*sorted(keys))
        previous = self._index.entries.get(entry_id)
        kept_file = 0
        if previous is not None and previous.unreadable and previous.disk_bytes:
            # The same keys name the same KV: a file that could not be read now (not proven
            # bad) stays as this entry's file instead of being deleted.
            kept_file, previous.disk_bytes = previous.disk_bytes, 0
            self.stats.disk_bytes -= kept_file
        for key in keys:
            self._unlink_key(key)
        if entry_id in self._index.entries:
            self._forget(entry_id)
        now = time.time()
        usage = EntryUsage(0, now, now)
        entry = _Entry(set(keys), usage, tuple(sorted(keys)), stored, stored.nbytes)
        entry.remote = on_remote
        entry.probation = probation
        entry.disk_bytes = kept_file
        self.stats.disk_bytes += kept_file
        self._link(entry_id, entry)
        self.stats.memory_bytes += stored.nbytes
        if persist:
            self._spill(entry_id, entry)
        self._evict_memory(keep=entry_id)
        return entry

    def _promote(self, hit: RemoteHit) -> None:
        """Keep an entry read from the shared tier in memory (it reaches disk when spilled)."""
        entry = self._insert(hit.keys, hit.stored, persist=False, on_remote=True)
        entry.usage.num_hits += 1

    def _spill(self, entry_id: str, entry: _Entry, *, to_remote: bool = True) -> None:
        """Write an entry to the tiers under memory that lack it (one encoding for both)."""
        stored = entry.stored
        to_disk = self.disk is not None and not entry.disk_bytes
        to_remote = to_remote and self.remote is not None and not entry.remote
        if stored is None or not (to_disk or to_remote):
            return
        created_ns = int(entry.usage.inserted * 1e9)
        data = encode_entry(
            self.model_fingerprint, entry.created_keys, stored, created_ns, self.signing_key
        )
        if to_disk:
            self._write_disk(entry_id, entry, data)
        if to_remote:  # sent once the lock is released (see _send_to_remote)
            entry.remote = True
            self._to_send.append((entry_id, entry.created_keys, data))

    def _send_to_remote(self) -> None:
        """Write the entries spilled for the shared tier (called without the lock held)."""
        if self.remote is None:
            return
        with self._lock:
            to_send, self._to_send = self._to_send, []
        for entry_id, keys, data in to_send:
            if not self.remote.write(entry_id, keys, data):
                with self._lock:  # not there after all: a later spill tries again
                    entry = self._index.entries.get(entry_id)
                    if entry is not None:
                        entry.remote = False

    def _link(self, entry_id: str, entry: _Entry) -> None:
        self._index.entries[entry_id] = entry
        for key in entry.keys:
            self._index.key_to_entry[key] = entry_id

    def _unlink_key(self, key: str) -> None:
        entry_id = self._index.key_to_entry.pop(key, None)
        if entry_id is None:
            return
        entry = self._index.entries[entry_id]
        entry.keys.discard(key)
        # A file keeps its old key list; on restart the newest file claiming a key wins.
        if not entry.keys:
            self._forget(entry_id)

    def _forget(self, entry_id: str) -> None:
        entry = self._index.entries.pop(entry_id)
        for key in entry.keys:
            if self._index.key_to_entry.get(key) == entry_id:
                del self._index.key_to_entry[key]
        self.stats.memory_bytes -= entry.memory_bytes
        if entry.disk_bytes and self.disk is not None:
            self.disk.remove(entry_id)
            self.stats.disk_bytes -= entry.disk_bytes

    def _write_disk(self, entry_id: str, entry: _Entry, data: bytes) -> None:
        if self.disk is None or entry.stored is None:
            return
        if entry.disk_bytes:  # replaced below (or dropped when it no longer fits)
            self.stats.disk_bytes -= entry.disk_bytes
            entry.disk_bytes = 0
            self.disk.remove(entry_id)
        if not self.disk.is_writable:
            return  # a read-only or full file system: memory only (the files there are kept)
        self._evict_disk(keep=entry_id, room=len(data))
        if self.stats.disk_bytes + len(data) > self.config.disk_capacity_bytes:
            return  # larger than the whole tier: memory only
        written = self.disk.write(entry_id, data)
        if written is None:
            return  # the write failed (logged by the tier): memory only
        entry.disk_bytes = written
        self.stats.disk_bytes += entry.disk_bytes
        self.stats.disk_writes += 1

    def _priority(self, item: tuple[str, _Entry]) -> tuple[float, ...]:
        entry = item[1]
        return (0.0 if entry.probation else 1.0, *self.policy.priority(entry.usage))

    def _evict_memory(self, keep: str) -> None:
        """Evict until the tier fits its cap; ``keep`` goes last (only if it alone is too big)."""
        capacity = self.config.memory_capacity_bytes
        while self.stats.memory_bytes > capacity:
            resident = [(i, e) for i, e in self._index.entries.items() if e.stored is not None]
            candidates = [(i, e) for i, e in resident if i != keep] or resident
            victim_id, victim = min(candidates, key=self._priority)
            if not victim.probation:
                self._spill(victim_id, victim)
            self.stats.memory_bytes -= victim.memory_bytes
            self.stats.memory_evictions += 1
            victim.stored, victim.memory_bytes = None, 0
            if not victim.disk_bytes:  # no disk tier (or it refused the entry): gone
                self._forget(victim_id)

    def _evict_disk(self, keep: str | None = None, room: int = 0) -> None:
        """Evict until the tier's files and ``room`` more bytes fit its cap."""
        if self.disk is None:
            return
        capacity = self.config.disk_capacity_bytes
        while self.stats.disk_bytes + room > capacity:
            on_disk = [(i, e) for i, e in self._index.entries.items() if e.disk_bytes and i != keep]
            if not on_disk:
                return
            victim_id, victim = min(on_disk, key=self._priority)
            self.disk.remove(victim_id)
            self.stats.disk_bytes -= victim.disk_bytes
            self.stats.disk_evictions += 1
            victim.disk_bytes = 0
            if victim.stored is None:
                self._forget(victim_id)
