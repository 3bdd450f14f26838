"""The shared tier on a real Valkey server: sharing, promotion, idempotent writes, bad entries,
unreachable and failing servers, and the settings' checks."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch

from adarag.cache.codec import TokenLayout
from adarag.cache.disk import SUFFIX
from adarag.cache.store import LayeredKVStore
from adarag.config import AdaRagConfig, StoreConfig
from adarag.errors import ConfigError
from adarag.kv import ChunkKV
from tests.remote_server import client_of, free_port, running_server, url_of

SHAPE = (2, 8, 2, 4)  # layers, tokens, kv heads, head dim
LAYOUT = TokenLayout(2, 2, 4)
NAMESPACE = "model-a"


def _kv(seed: int, shape: tuple[int, ...] = SHAPE) -> ChunkKV:
    rng = torch.Generator().manual_seed(seed)
    k, v = torch.randn(shape, generator=rng), torch.randn(shape, generator=rng)
    return ChunkKV(k, v, 3)


def _store(directory, url: str, layout: TokenLayout = LAYOUT, **config) -> LayeredKVStore:
    config.setdefault("storage_dtype", "float32")  # bit-exact round trips
    return LayeredKVStore(StoreConfig(remote_url=url, **config), directory, NAMESPACE, layout)


def _remote_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "adarag.cache.remote"]


@pytest.fixture()
def server():
    with running_server() as running:
        yield running


def test_an_entry_written_by_one_store_is_served_to_another_and_promoted(tmp_path, server):
    writer = _store(tmp_path / "a", url_of(server))
    kv = _kv(1)
    writer.put(["hard", "soft"], kv, persist=True)
    reader = _store(tmp_path / "b", url_of(server))
    assert reader.contains("soft") and not reader.contains("other")
    loaded = reader.get("soft")
    assert torch.equal(loaded.k, kv.k) and torch.equal(loaded.v, kv.v)
    assert loaded.start_position == 3
    # promoted with every key of the entry: later reads are local
    assert torch.equal(reader.get("hard").k, kv.k)
    stats = reader.snapshot()
    assert stats.remote_hits == 1 and stats.memory_entries == 1
    # it reaches the reader's disk when spilled, and is not sent back to the server
    reader.flush()
    assert len(list((tmp_path / "b").glob(f"*{SUFFIX}"))) == 1
    assert reader.snapshot().remote_writes == 0


def test_writes_are_idempotent_and_expire(tmp_path, server):
    first = _store(tmp_path / "a", url_of(server), remote_ttl_seconds=600)
    second = _store(tmp_path / "b", url_of(server), remote_ttl_seconds=600)
    first.put(["key"], _kv(1), persist=True)
    second.put(["key"], _kv(2), persist=True)  # the first writer's entry stays
    client = client_of(server)
    names = sorted(client.keys("*"))
    assert len(names) == 2  # one entry, one key
    assert all(0 < client.ttl(name) <= 600 for name in names)
    assert first.snapshot().remote_writes == 1 and second.snapshot().remote_writes == 0
    third = _store(tmp_path / "c", url_of(server))
    assert torch.equal(third.get("key").k, _kv(1).k)


def test_memory_only_entries_reach_the_server_when_evicted_or_flushed(tmp_path, server):
    entry_bytes = 2 * 4 * 2 * 8 * 2 * 4
    store = _store(tmp_path / "a", url_of(server), memory_capacity_bytes=entry_bytes)
    store.put(["first"], _kv(1))
    assert store.snapshot().remote_writes == 0  # not persisted yet
    store.put(["second"], _kv(2))  # evicts "first": spilled to disk and the server
    assert store.snapshot().remote_writes == 1
    store.flush()
    assert store.snapshot().remote_writes == 2
    reader = _store(tmp_path / "b", url_of(server), disk_capacity_bytes=0)
    assert reader.get("first") is not None and reader.get("second") is not None


def test_entries_on_probation_never_reach_the_server(tmp_path, server):
    entry_bytes = 2 * 4 * 2 * 8 * 2 * 4
    store = _store(tmp_path / "a", url_of(server), memory_capacity_bytes=entry_bytes)
    store.put(["one-off"], _kv(1), probation=True)
    store.put(["lasting"], _kv(2))  # evicts the one-off: dropped, not spilled
    store.put(["later one-off"], _kv(3), probation=True)  # evicted before "lasting"
    store.flush()
    reader = _store(tmp_path / "b", url_of(server), disk_capacity_bytes=0)
    assert reader.get("lasting") is not None
    assert reader.get("one-off") is None and reader.get("later one-off") is None


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "not an entry", "wrong layout"])
def test_a_bad_entry_on_the_server_is_dropped_and_recomputed(tmp_path, server, caplog, damage):
    writer = _store(tmp_path / "a", url_of(server))
    writer.put(["key"], _kv(1), persist=True)
    client = client_of(server)
    remote = writer.remote
    entry_name = remote.entry_name(client.get(remote.key_name("key")).decode())
    data = bytearray(client.get(entry_name))
    if damage == "flipped byte":
        data[-5] ^= 0xFF
    elif damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "not an entry":
        data = bytearray(b"hello")
    if damage != "wrong layout":
        client.set(entry_name, bytes(data))
    layout = TokenLayout(2, 1, 8) if damage == "wrong layout" else LAYOUT
    reader = _store(tmp_path / "b", url_of(server), layout=layout)
    with caplog.at_level(logging.WARNING, logger="adarag.cache.remote"):
        assert reader.get("key") is None
    assert any("dropping entry" in message for message in _remote_warnings(caplog))
    assert client.keys("*") == []  # the entry and its key are gone from the server
    assert reader.snapshot().remote_dropped == 1
    recomputed = _kv(1, (2, 8, layout.num_kv_heads, layout.head_dim))
    reader.put(["key"], recomputed, persist=True)  # shared again
    assert torch.equal(
        _store(tmp_path / "c", url_of(server), layout=layout).get("key").k, recomputed.k
    )


def test_a_key_whose_entry_expired_is_a_miss_and_is_removed(tmp_path, server):
    writer = _store(tmp_path / "a", url_of(server))
    writer.put(["key"], _kv(1), persist=True)
    client = client_of(server)
    remote = writer.remote
    client.delete(remote.entry_name(client.get(remote.key_name("key")).decode()))
    reader = _store(tmp_path / "b", url_of(server))
    assert reader.get("key") is None
    assert client.keys("*") == []


def test_a_pointer_to_an_entry_that_does_not_claim_the_key_is_never_served(tmp_path, server):
    writer = _store(tmp_path / "a", url_of(server))
    writer.put(["one"], _kv(1), persist=True)
    writer.put(["two"], _kv(2), persist=True)
    client = client_of(server)
    remote = writer.remote
    client.set(remote.key_name("two"), client.get(remote.key_name("one")))  # swapped
    reader = _store(tmp_path / "b", url_of(server))
    assert reader.get("two") is None
    assert torch.equal(reader.get("one").k, _kv(1).k)


def test_stores_of_another_namespace_or_prefix_share_nothing(tmp_path, server):
    _store(tmp_path / "a", url_of(server)).put(["key"], _kv(1), persist=True)
    other_model = LayeredKVStore(
        StoreConfig(remote_url=url_of(server), storage_dtype="float32"),
        tmp_path / "b",
        "model-b",
        LAYOUT,
    )
    assert other_model.get("key") is None
    assert _store(tmp_path / "c", url_of(server), remote_key_prefix="other").get("key") is None
    assert _store(tmp_path / "d", url_of(server, db=1)).get("key") is None


def test_an_unreachable_server_warns_once_and_the_local_tiers_serve(tmp_path, caplog):
    url = f"redis://127.0.0.1:{free_port()}/0"
    with caplog.at_level(logging.WARNING, logger="adarag.cache.remote"):
        store = _store(tmp_path / "a", url, remote_timeout_s=0.5, remote_retry_s=0)
        store.put(["key"], _kv(1), persist=True)
        assert torch.equal(store.get("key").k, _kv(1).k)
        assert store.get("missing") is None and not store.contains("missing")
        store.flush()
    warnings = _remote_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert url in warnings[0] and "local tiers only" in warnings[0]
    assert store.snapshot().remote_failures >= 2  # retried (remote_retry_s=0), warned once


def test_a_server_killed_mid_run_warns_once_and_local_entries_still_serve(tmp_path, server, caplog):
    store = _store(tmp_path / "a", url_of(server))
    store.put(["key"], _kv(1), persist=True)
    server.terminate()  # SIGKILL
    with caplog.at_level(logging.WARNING, logger="adarag.cache.remote"):
        for _ in range(3):
            assert store.get("absent") is None
            assert torch.equal(store.get("key").k, _kv(1).k)
        store.put(["new"], _kv(2), persist=True)
    assert len(_remote_warnings(caplog)) == 1
    assert store.remote is not None and not store.remote.is_available


def test_a_password_protected_server(tmp_path, caplog):
    with running_server() as server:
        client_of(server).config_set("requirepass", "s3cret")
        good = _store(tmp_path / "a", url_of(server), remote_password="s3cret")
        good.put(["key"], _kv(1), persist=True)
        with caplog.at_level(logging.WARNING, logger="adarag.cache.remote"):
            wrong = _store(tmp_path / "b", url_of(server), remote_password="wrong")
            assert wrong.get("key") is None
        warnings = _remote_warnings(caplog)
        assert len(warnings) == 1 and "wrong" not in warnings[0]
        assert (
            _store(tmp_path / "c", url_of(server), remote_password="s3cret").get("key") is not None
        )


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://localhost:6379/0", "unknown scheme http:"),
        ("localhost:6379", "unknown scheme localhost:"),
        ("redis:///0", "no host"),
        ("redis://localhost:99999/0", "Port out of range"),
        ("redis://localhost:6379/zero", "is not a number"),
    ],
)
def test_a_bad_url_is_a_config_error_naming_the_field(url, reason):
    with pytest.raises(ConfigError, match="cache.store.remote_url") as raised:
        AdaRagConfig.build(cache={"store": {"remote_url": url}})
    assert reason in str(raised.value)


def test_a_password_in_a_bad_url_is_not_echoed():
    with pytest.raises(ConfigError) as raised:
        AdaRagConfig.build(cache={"store": {"remote_url": "redis://user:hunter2@host:0/0"}})
    assert "hunter2" not in str(raised.value) and "***" in str(raised.value)


def test_tls_files_need_a_tls_url():
    with pytest.raises(ConfigError, match="rediss://"):
        AdaRagConfig.build(
            cache={"store": {"remote_url": "redis://h:6379/0", "remote_tls_ca_file": "/ca.pem"}}
        )


def test_the_password_is_kept_through_overrides_but_never_shown():
    store = {"remote_url": "redis://h:6379/0", "remote_password": "hunter2"}
    config = AdaRagConfig.build(cache={"store": store})
    rebuilt = AdaRagConfig.build(config, retrieval={"top_k": 3})
    assert rebuilt.cache.store.remote_password.get_secret_value() == "hunter2"
    assert "hunter2" not in repr(rebuilt) and "hunter2" not in str(rebuilt)


def test_a_slow_shared_tier_write_holds_up_no_other_lookup(tmp_path, server, monkeypatch):
    store = _store(tmp_path / "a", url_of(server), memory_capacity_bytes=1500)  # one entry fits
    store.put(["first"], _kv(1))
    started, release = threading.Event(), threading.Event()
    write = store.remote.write

    def slow_write(*args):
        started.set()
        release.wait(5.0)
        return write(*args)

    monkeypatch.setattr(store.remote, "write", slow_write)
    writer = threading.Thread(target=store.put, args=(["second"], _kv(2)))  # spills "first"
    writer.start()
    assert started.wait(5.0)
    began = time.perf_counter()
    assert store.get("second") is not None and store.contains("first")
    waited_s = time.perf_counter() - began
    release.set()
    writer.join()
    assert waited_s < 2.0, "a lookup waited for another thread's shared-tier write"
    assert store.snapshot().remote_writes == 1
