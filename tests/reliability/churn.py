"""Value-coded chunk-KV entries for churn tests: every entry's numbers follow from its key.

Run as a script (``python -m tests.reliability.churn DIR SEED OPS``), it churns a store on DIR
with small caps and prints one JSON line: operations, wrong entries read, hits.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path

import torch

from adarag.cache.codec import TokenLayout
from adarag.cache.store import LayeredKVStore
from adarag.config import StoreConfig
from adarag.kv import ChunkKV

LAYOUT = TokenLayout(num_layers=2, num_kv_heads=2, head_dim=8)
NAMESPACE = "churn-model-float32-float32"


def entry_for(key: str) -> ChunkKV:
    """The one entry ``key`` may hold: its size and numbers derive from the key."""
    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "little")
    num_tokens = 4 + seed % 29
    shape = (LAYOUT.num_layers, num_tokens, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    rng = torch.Generator().manual_seed(seed)
    k = torch.randn(shape, generator=rng)
    return ChunkKV(k, -k, seed % 1000)


def is_intact(key: str, kv: ChunkKV) -> bool:
    """Whether ``kv`` is exactly the entry of ``key``."""
    expected = entry_for(key)
    return (
        kv.start_position == expected.start_position
        and torch.equal(kv.k, expected.k)
        and torch.equal(kv.v, expected.v)
    )


def open_store(directory: Path, memory_bytes: int, disk_bytes: int) -> LayeredKVStore:
    """A churn store on ``directory``."""
    config = StoreConfig(
        memory_capacity_bytes=memory_bytes, disk_capacity_bytes=disk_bytes, storage_dtype="float32"
    )
    return LayeredKVStore(config, directory, NAMESPACE, LAYOUT)


def churn(store: LayeredKVStore, seed: int, num_ops: int, num_keys: int) -> dict[str, int]:
    """Random puts (some persisted) and gets over ``num_keys`` keys; counts wrong reads."""
    rng = random.Random(seed)
    wrong = hits = 0
    for _ in range(num_ops):
        key = f"key-{rng.randrange(num_keys)}"
        if rng.random() < 0.5:
            store.put([key], entry_for(key), persist=rng.random() < 0.3)
        elif (kv := store.get(key)) is not None:
            hits += 1
            wrong += not is_intact(key, kv)
    return {"ops": num_ops, "hits": hits, "wrong": wrong}


if __name__ == "__main__":
    directory, seed, num_ops = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    store = open_store(directory, memory_bytes=40_000, disk_bytes=200_000)
    result = churn(store, seed, num_ops, num_keys=60)
    store.flush()
    sys.stdout.write(json.dumps(result) + "\n")
