"""Storage codecs: float dtypes as stored; int8 with KIVI-style scales, bounded error, checked."""

from __future__ import annotations

import pytest
import torch

from adarag.cache.codec import InvalidEntry, KVCodec, StoredKV, TokenLayout
from adarag.cache.store import LayeredKVStore
from adarag.config import StoreConfig
from adarag.kv import ChunkKV

LAYOUT = TokenLayout(num_layers=3, num_kv_heads=2, head_dim=16)


def _kv(num_tokens: int = 40) -> ChunkKV:
    shape = (LAYOUT.num_layers, num_tokens, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    return ChunkKV(torch.randn(shape) * 3, torch.randn(shape), 5)


def test_int8_error_is_within_half_a_step_of_each_slice():
    codec = KVCodec("int8", LAYOUT)
    kv = _kv()
    stored = codec.encode(kv)
    decoded = codec.decode(stored)
    assert decoded.start_position == 5 and decoded.k.shape == kv.k.shape
    k_step = stored.tensors["k_scale"].float()  # per channel: [layers, 1, heads, dim]
    v_step = stored.tensors["v_scale"].float()  # per token: [layers, tokens, heads, 1]
    assert torch.all((decoded.k - kv.k).abs() <= k_step * 0.5 + 2e-3 * kv.k.abs().amax())
    assert torch.all((decoded.v - kv.v).abs() <= v_step * 0.5 + 2e-3 * kv.v.abs().amax())
    assert not torch.equal(decoded.k, kv.k)  # lossy: not a float copy


def test_keys_are_scaled_per_channel_so_an_outlier_channel_costs_only_itself():
    codec = KVCodec("int8", LAYOUT)
    kv = _kv()
    k = kv.k.clone()
    k[..., 0] *= 100  # a key outlier channel, as real models have
    decoded = codec.decode(codec.encode(ChunkKV(k, kv.v, 0)))
    others = (decoded.k[..., 1:] - k[..., 1:]).abs().max()
    assert others < 0.05  # unaffected by channel 0's range


def test_int8_is_about_four_times_smaller_than_float32():
    kv = _kv(num_tokens=256)
    full = KVCodec("float32", LAYOUT).encode(kv).nbytes
    half = KVCodec("float16", LAYOUT).encode(kv).nbytes
    eight = KVCodec("int8", LAYOUT).encode(kv).nbytes
    assert full == 2 * half
    assert 3.5 < full / eight < 4.0


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda t: t.pop("v_scale"), "tensors"),
        (lambda t: t.__setitem__("k_scale", t["k_scale"][:, :, :1]), "scales of shape"),
        (lambda t: t.__setitem__("k_q", t["k_q"].to(torch.int16)), "dtypes"),
        (lambda t: t.__setitem__("v_q", t["v_q"][:, :-1]), "scales of shape"),
    ],
    ids=["missing-scale", "scale-shape", "code-dtype", "token-count"],
)
def test_a_malformed_int8_entry_is_refused(damage, match):
    codec = KVCodec("int8", LAYOUT)
    stored = codec.encode(_kv())
    tensors = dict(stored.tensors)
    damage(tensors)
    with pytest.raises(InvalidEntry, match=match):
        codec.decode(StoredKV(tensors, 0))


def test_an_int8_store_survives_a_restart_and_counts_encoded_bytes(tmp_path):
    config = StoreConfig(storage_dtype="int8")
    store = LayeredKVStore(config, tmp_path / "kv", "model-a", LAYOUT)
    kv = _kv()
    store.put(["key"], kv, persist=True)
    assert store.snapshot().memory_bytes == KVCodec("int8").encode(kv).nbytes
    reopened = LayeredKVStore(config, tmp_path / "kv", "model-a", LAYOUT)
    loaded = reopened.get("key")
    assert loaded is not None and torch.allclose(loaded.k, kv.k, atol=0.1)
    assert torch.equal(loaded.k, store.get("key").k)  # the same codes decode the same
