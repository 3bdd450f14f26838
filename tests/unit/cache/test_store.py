"""The tiered store: round trips, caps, eviction, persistence, corruption, threads."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest
import torch

from adarag.cache.disk import SUFFIX
from adarag.cache.staging import STAGING_MAX_AGE_S
from adarag.cache.store import LayeredKVStore
from adarag.config import StoreConfig
from adarag.errors import CacheError
from adarag.kv import ChunkKV

SHAPE = (2, 8, 2, 4)  # layers, tokens, kv heads, head dim
ENTRY_BYTES = 2 * 4 * 2 * 8 * 2 * 4


def _kv(value: float, start: int = 3) -> ChunkKV:
    return ChunkKV(torch.full(SHAPE, value), torch.full(SHAPE, -value), start)


def _store(tmp_path, **config) -> LayeredKVStore:
    config.setdefault("storage_dtype", "float32")  # bit-exact round trips
    return LayeredKVStore(StoreConfig(**config), tmp_path / "kv", "model-a")


def test_round_trip_is_bit_exact(tmp_path):
    store = _store(tmp_path)
    kv = ChunkKV(torch.randn(SHAPE), torch.randn(SHAPE), 5)
    store.put(["key"], kv)
    loaded = store.get("key")
    assert torch.equal(loaded.k, kv.k) and torch.equal(loaded.v, kv.v)
    assert loaded.start_position == 5
    assert store.get("other") is None


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_storage_dtype_is_applied(tmp_path, dtype):
    store = _store(tmp_path, storage_dtype=dtype)
    store.put(["key"], _kv(0.5))
    assert store.get("key").k.dtype == getattr(torch, dtype)


def test_memory_tier_never_exceeds_its_cap(tmp_path):
    store = _store(tmp_path, memory_capacity_bytes=3 * ENTRY_BYTES)
    for idx in range(10):
        store.put([f"key-{idx}"], _kv(float(idx)))
        assert store.snapshot().memory_bytes <= 3 * ENTRY_BYTES
    assert store.snapshot().memory_evictions == 7


def test_evicted_entries_spill_to_disk_and_come_back(tmp_path):
    store = _store(tmp_path, memory_capacity_bytes=ENTRY_BYTES)
    store.put(["first"], _kv(1.0))
    store.put(["second"], _kv(2.0))
    stats = store.snapshot()
    assert stats.memory_entries == 1 and stats.disk_entries == 1
    assert float(store.get("first").k[0, 0, 0, 0]) == 1.0


@pytest.mark.parametrize(("policy", "evicted"), [("lru", "b"), ("lfu", "c")], ids=["lru", "lfu"])
def test_eviction_order_follows_the_policy(tmp_path, policy, evicted):
    store = _store(
        tmp_path,
        memory_capacity_bytes=3 * ENTRY_BYTES,
        disk_capacity_bytes=0,
        eviction_policy=policy,
    )
    store.put(["a"], _kv(1.0))
    store.put(["b"], _kv(2.0))
    store.put(["c"], _kv(3.0))
    for _ in range(3):
        store.get("b")  # b is popular ...
    store.get("a")  # ... but a was used last; c is neither
    store.get("c")
    store.get("a")
    store.put(["d"], _kv(4.0))
    remaining = {key for key in "abcd" if store.contains(key)}
    assert remaining == set("abcd") - {evicted}


def test_disk_tier_is_capped_too(tmp_path):
    store = _store(tmp_path, memory_capacity_bytes=0, disk_capacity_bytes=int(2.5 * ENTRY_BYTES))
    for idx in range(5):
        store.put([f"key-{idx}"], _kv(float(idx)), persist=True)
    stats = store.snapshot()
    assert stats.disk_bytes <= 2.5 * ENTRY_BYTES
    assert stats.disk_evictions >= 3


def test_entries_survive_a_restart(tmp_path):
    first = _store(tmp_path)
    kv = ChunkKV(torch.randn(SHAPE), torch.randn(SHAPE), 7)
    first.put(["hard", "soft"], kv)
    first.flush()
    second = _store(tmp_path)
    for key in ("hard", "soft"):
        loaded = second.get(key)
        assert torch.equal(loaded.k, kv.k) and loaded.start_position == 7


def test_newest_file_wins_a_key_after_restart(tmp_path):
    first = _store(tmp_path)
    first.put(["hard-1", "soft"], _kv(1.0), persist=True)
    first.put(["hard-2", "soft"], _kv(2.0), persist=True)
    second = _store(tmp_path)
    assert float(second.get("soft").k.flatten()[0]) == 2.0
    assert float(second.get("hard-1").k.flatten()[0]) == 1.0


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupted_file_is_dropped_with_a_warning(tmp_path, caplog, damage):
    store = _store(tmp_path)
    store.put(["key"], _kv(1.0), persist=True)
    (path,) = (tmp_path / "kv").glob(f"*{SUFFIX}")
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[-5] ^= 0xFF
        path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        reopened = _store(tmp_path)
        assert reopened.get("key") is None
    assert "corrupted KV cache file" in caplog.text
    assert not path.exists()


def test_half_written_file_is_never_visible(tmp_path):
    store = _store(tmp_path)
    store.put(["key"], _kv(1.0), persist=True)
    staging = tmp_path / "kv" / ".tmp-deadbeef-1"  # not this namespace's: removed by age
    staging.write_bytes(b"partial")
    old = time.time() - STAGING_MAX_AGE_S - 1
    os.utime(staging, (old, old))
    reopened = _store(tmp_path)
    assert reopened.snapshot().disk_entries == 1
    assert not list((tmp_path / "kv").glob(".tmp-*"))


def test_entries_of_another_model_are_a_clean_miss_and_quarantined(tmp_path):
    store = _store(tmp_path)
    store.put(["key"], _kv(1.0), persist=True)
    (path,) = (tmp_path / "kv").glob(f"*{SUFFIX}")
    other = LayeredKVStore(StoreConfig(), tmp_path / "kv", "model-b")
    assert other.get("key") is None
    assert not path.exists() and (tmp_path / "kv" / "quarantine" / path.name).is_file()
    assert store.get("key") is not None  # still in the first store's memory


def test_unwritable_directory_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(CacheError, match="not writable.*cache.store.directory"):
        LayeredKVStore(StoreConfig(), blocker / "kv", "model-a")


def test_concurrent_readers_and_writers_never_see_a_torn_entry(tmp_path):
    store = _store(tmp_path, memory_capacity_bytes=4 * ENTRY_BYTES)
    errors: list[str] = []

    def writer(offset: int) -> None:
        for step in range(40):
            value = float(offset * 1000 + step % 8)
            store.put([f"key-{step % 8}-{offset}"], _kv(value))

    def reader(offset: int) -> None:
        for step in range(80):
            kv = store.get(f"key-{step % 8}-{offset}")
            if kv is None:
                continue
            value = float(kv.k.flatten()[0])
            if not (torch.all(kv.k == value) and torch.all(kv.v == -value)):
                errors.append(f"torn entry for offset {offset}")
            if value != float(offset * 1000 + step % 8):
                errors.append(f"wrong entry {value} for key-{step % 8}-{offset}")

    threads = [threading.Thread(target=fn, args=(i,)) for i in range(3) for fn in (writer, reader)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_an_entry_that_lost_a_key_to_a_newer_one_still_spills_and_restarts(tmp_path):
    store = _store(tmp_path, memory_capacity_bytes=2 * ENTRY_BYTES)
    store.put(["hard", "soft"], _kv(1.0))
    store.put(["soft"], _kv(2.0))  # the older entry keeps only "hard"
    store.put(["other"], _kv(3.0))  # spills the older entry to disk
    assert float(store.get("hard").k.flatten()[0]) == 1.0
    assert float(store.get("soft").k.flatten()[0]) == 2.0
    store.flush()
    reopened = _store(tmp_path)
    assert float(reopened.get("hard").k.flatten()[0]) == 1.0
    assert float(reopened.get("soft").k.flatten()[0]) == 2.0  # the newer file wins its key
