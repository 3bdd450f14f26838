"""The hand-over of fused KV through a real Valkey server, for replicas on other machines."""

from __future__ import annotations

import logging
import time
import uuid

import pytest
import torch

from adarag.engine.vllm.handoff import FusedContext
from adarag.engine.vllm.handoff_files import HandoffFiles
from adarag.engine.vllm.handoff_redis import KEY_PREFIX, HandoffRedis
from adarag.engine.vllm.handoff_store import open_handoff
from tests.remote_server import client_of, running_server, url_of


@pytest.fixture(scope="module")
def server():
    with running_server() as handle:
        yield handle


def _context() -> FusedContext:
    k = torch.randn(3, 5, 4, 8, generator=torch.Generator().manual_seed(0))
    return FusedContext(k, k * 2 - 1)


def test_the_location_picks_the_store(server, tmp_path):
    assert isinstance(open_handoff(url_of(server)), HandoffRedis)
    assert isinstance(open_handoff(str(tmp_path)), HandoffFiles)


def test_round_trip_and_a_ranks_heads(server):
    store, handoff_id, context = HandoffRedis(url_of(server), 60.0), uuid.uuid4().hex, _context()
    store.write(handoff_id, context)
    assert store.exists(handoff_id)
    whole, heads = store.read(handoff_id), store.read(handoff_id, range(1, 3))
    assert whole is not None and torch.equal(whole.k, context.k) and torch.equal(whole.v, context.v)
    assert heads is not None and torch.equal(heads.k, context.k[:, :, 1:3])
    store.remove(handoff_id)
    assert not store.exists(handoff_id)


def test_a_value_nobody_deleted_expires(server):
    store, handoff_id = HandoffRedis(url_of(server), 0.2), uuid.uuid4().hex
    store.write(handoff_id, _context())
    assert 0 < client_of(server).pttl(f"{KEY_PREFIX}{handoff_id}") <= 200
    time.sleep(0.4)
    assert not store.exists(handoff_id)


def test_missing_damaged_and_unreachable_read_as_none(server, caplog):
    caplog.set_level(logging.WARNING)
    store, missing, damaged = HandoffRedis(url_of(server), 60.0), uuid.uuid4().hex, uuid.uuid4().hex
    assert store.read(missing) is None and f"no fused KV under handoff {missing}" in caplog.text
    client_of(server).set(f"{KEY_PREFIX}{damaged}", b"not safetensors")
    assert store.read(damaged) is None and "unreadable" in caplog.text
    down = HandoffRedis("redis://127.0.0.1:9/0", 60.0, timeout_s=0.5)
    assert not down.exists(missing) and down.read(missing) is None
    assert "unreachable" in caplog.text
    with pytest.raises(ConnectionError, match="cannot store fused KV"):
        down.write(missing, _context())


def test_ids_never_name_another_key(server):
    store = HandoffRedis(url_of(server), 60.0)
    assert not store.exists("*")
    with pytest.raises(ValueError, match="32 lowercase hex digits"):
        store.key("adarag:other")
