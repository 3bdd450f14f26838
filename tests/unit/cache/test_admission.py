"""Admission of written-back chunk KV: one-offs on probation, popular chunks kept."""

from __future__ import annotations

import random

import pytest
import torch

from adarag.cache.admission import CountMinSketch, FrequencyAdmission
from adarag.cache.store import LayeredKVStore
from adarag.cache.tiers import TieredCache
from adarag.config import CacheConfig
from adarag.kv import ChunkKV

NUM_TOKENS = 8
ENTRY_BYTES = 2 * (2 * NUM_TOKENS * 2 * 4) * 4  # k and v: layers x tokens x heads x dim, fp32
SYSTEM_IDS = [1, 2, 3]


def _chunk(chunk_id: int) -> list[int]:
    return [1000 + chunk_id] * NUM_TOKENS


def _kv(num_tokens: int) -> ChunkKV:
    shape = (2, num_tokens, 2, 4)
    return ChunkKV(torch.randn(shape), torch.randn(shape), 0)


def _cache(tmp_path, admission: str, memory_entries: int, disk_entries: int = 0) -> TieredCache:
    config = CacheConfig.model_validate(
        {
            "store": {
                "admission": admission,
                "eviction_policy": "lru",  # plain LRU: what admission has to protect against
                "storage_dtype": "float32",
                "memory_capacity_bytes": memory_entries * ENTRY_BYTES,
                "disk_capacity_bytes": disk_entries * (ENTRY_BYTES + 4096),  # + file header
            }
        }
    )
    store = LayeredKVStore(config.store, tmp_path / "kv", "model-a")
    return TieredCache(config, store, "model-a", SYSTEM_IDS, sink_chunk_idx=None)


def _serve(cache: TieredCache, chunk_ids: list[int]) -> list[str]:
    """One prompt of these chunks: look up, then write back (as after a prefill)."""
    chunks = [_chunk(chunk_id) for chunk_id in chunk_ids]
    hits = cache.lookup(chunks)
    cache.write_back(chunks, hits, [_kv(len(chunk)) for chunk in chunks])
    return [hit.tier for hit in hits]


def test_a_one_off_key_is_not_admitted_and_a_key_seen_twice_is():
    admission = FrequencyAdmission(threshold=2)
    assert admission.record("once") is False
    assert admission.record("twice") is False
    assert admission.record("twice") is True
    assert admission.record("once-more") is False


def test_sketch_never_underestimates_and_halves_with_age():
    sketch = CountMinSketch(width=64, depth=4)  # narrow: keys collide
    rng = random.Random(0)
    counts: dict[str, int] = {}
    for _ in range(2000):
        key = f"key-{int(rng.paretovariate(1.0))}"
        counts[key] = counts.get(key, 0) + 1
        sketch.add(key)
    assert all(sketch.estimate(key) >= count for key, count in counts.items())
    aging = CountMinSketch(width=1024, depth=4, reset_after=8)
    for _ in range(7):
        assert aging.add("hot") >= 1
    assert aging.estimate("hot") == 7
    aging.add("hot")  # the 8th record halves every counter
    assert aging.estimate("hot") == 4


@pytest.mark.parametrize(
    ("admission", "popular_tier"), [("always", "miss"), ("frequency", "independent")]
)
def test_popular_chunk_survives_a_burst_of_one_offs_only_with_frequency_admission(
    tmp_path, admission, popular_tier
):
    cache = _cache(tmp_path, admission, memory_entries=6)
    popular = 0
    assert _serve(cache, [1, popular]) == ["miss", "miss"]
    assert _serve(cache, [2, popular]) == ["miss", "independent"]  # seen twice: it lasts now
    for one_off in range(100, 140):  # plain LRU: these evict everything older
        _serve(cache, [one_off, one_off + 1000])
    assert _serve(cache, [3, popular])[1] == popular_tier
    stats = cache.store.snapshot()
    assert stats.memory_bytes <= 6 * ENTRY_BYTES
    if admission == "frequency":
        assert cache.stats.num_probation_writes >= 80
    else:
        assert cache.stats.num_probation_writes == 0


def test_an_entry_on_probation_is_reused_by_the_next_step_of_its_request(tmp_path):
    cache = _cache(tmp_path, "frequency", memory_entries=6)
    assert _serve(cache, [1, 2]) == ["miss", "miss"]  # one-offs: kept on probation
    assert cache.stats.num_probation_writes == 2
    assert _serve(cache, [1, 2, 3]) == ["hard", "hard", "miss"]  # the next augmentation step


def test_probation_entries_are_not_spilled_and_flush_only_into_free_disk_room(tmp_path):
    cache = _cache(tmp_path, "frequency", memory_entries=2, disk_entries=3)
    _serve(cache, [7])
    _serve(cache, [8, 7])  # chunk 7 seen twice: its independent entry lasts
    for one_off in range(20, 26):
        _serve(cache, [one_off])
    stats = cache.store.snapshot()
    assert stats.disk_entries == 0  # evicted one-offs are dropped, not written to disk
    assert stats.memory_evictions >= 4
    cache.store.flush()
    stats = cache.store.snapshot()
    assert 1 <= stats.disk_entries <= 3 and stats.disk_evictions == 0
    assert cache.store.contains(cache.keys([_chunk(7)]).independent[0])


def test_threshold_one_keeps_every_write_back(tmp_path):
    config = CacheConfig.model_validate({"store": {"admission_threshold": 1}})
    store = LayeredKVStore(config.store, None, "model-a")
    cache = TieredCache(config, store, "model-a", SYSTEM_IDS, sink_chunk_idx=None)
    for chunk_id in range(5):
        _serve(cache, [chunk_id])
    assert cache.stats.num_probation_writes == 0
