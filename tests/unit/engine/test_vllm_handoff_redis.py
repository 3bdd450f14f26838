"""The hand-over of signed fused KV through a real Valkey server, for replicas on other machines."""

from __future__ import annotations

import logging
import time
import uuid

import pytest
import torch

from adarag.engine.vllm.handoff import FusedContext, HandoffBinding, prompt_digest
from adarag.engine.vllm.handoff_files import HandoffFiles
from adarag.engine.vllm.handoff_format import HandoffSigner
from adarag.engine.vllm.handoff_redis import KEY_PREFIX, HandoffRedis
from adarag.engine.vllm.handoff_store import open_handoff
from tests.remote_server import client_of, running_server, url_of

KEY = b"a-hand-over-key-of-32-bytes-long"
SIGNER = HandoffSigner(KEY)


@pytest.fixture(scope="module")
def server():
    with running_server() as handle:
        yield handle


def _context(seed: int = 0) -> FusedContext:
    k = torch.randn(3, 5, 4, 8, generator=torch.Generator().manual_seed(seed))
    return FusedContext(k, k * 2 - 1)


def _binding(prompt=(1, 2, 3, 4, 5)) -> HandoffBinding:
    return HandoffBinding(uuid.uuid4().hex, prompt_digest(prompt), len(prompt))


def test_the_location_picks_the_store(server, tmp_path):
    assert isinstance(open_handoff(url_of(server), KEY), HandoffRedis)
    assert isinstance(open_handoff(str(tmp_path), KEY), HandoffFiles)


def test_round_trip_and_a_ranks_heads(server):
    store, binding, context = HandoffRedis(url_of(server), SIGNER, 60.0), _binding(), _context()
    store.write(binding, context)
    assert store.check(binding) is None
    whole, heads = store.read(binding), store.read(binding, range(1, 3))
    assert whole is not None and torch.equal(whole.k, context.k) and torch.equal(whole.v, context.v)
    assert heads is not None and torch.equal(heads.k, context.k[:, :, 1:3])
    store.remove(binding.handoff_id)
    assert "no fused KV waits" in store.check(binding)


def test_a_value_nobody_deleted_expires(server):
    store, binding = HandoffRedis(url_of(server), SIGNER, 0.2), _binding()
    store.write(binding, _context())
    assert 0 < client_of(server).pttl(f"{KEY_PREFIX}{binding.handoff_id}") <= 200
    time.sleep(0.4)
    assert store.check(binding) is not None


def test_values_written_by_whoever_can_write_the_database_are_refused(server, caplog):
    """Regression (issue 45): a value of the right shape overwritten on the server was served."""
    caplog.set_level(logging.WARNING)
    client, store = client_of(server), HandoffRedis(url_of(server), SIGNER, 60.0)
    genuine, other = _binding(), _binding(prompt=(9, 9, 9, 9, 9))
    store.write(genuine, _context())
    store.write(other, _context(seed=1))
    key = f"{KEY_PREFIX}{genuine.handoff_id}"
    client.set(key, client.get(f"{KEY_PREFIX}{other.handoff_id}"))  # swapped
    assert store.read(genuine) is None and "written for handoff" in store.check(genuine)
    HandoffRedis(url_of(server), HandoffSigner(b"the-attacker's-own-key-16+"), 60.0).write(
        genuine, _context()
    )
    assert store.read(genuine) is None and "another key" in store.check(genuine)
    store.write(genuine, _context())
    client.setrange(key, len(client.get(key)) - 4, b"\x00\x00\x80\x7f")  # forged bytes
    assert store.read(genuine) is None and "signature does not verify" in caplog.text
    client.set(key, client.get(key)[:-64])  # truncated
    assert store.read(genuine) is None


def test_missing_damaged_and_unreachable_read_as_none(server, caplog):
    caplog.set_level(logging.WARNING)
    store = HandoffRedis(url_of(server), SIGNER, 60.0)
    missing, damaged = _binding(), _binding()
    assert store.read(missing) is None
    assert f"no fused KV under handoff {missing.handoff_id}" in caplog.text
    client_of(server).set(f"{KEY_PREFIX}{damaged.handoff_id}", b"not safetensors")
    assert store.read(damaged) is None and "refused" in caplog.text
    down = HandoffRedis("redis://127.0.0.1:9/0", SIGNER, 60.0, timeout_s=0.5)
    assert "failed" in down.check(missing) and down.read(missing) is None
    assert "unreachable" in caplog.text
    with pytest.raises(ConnectionError, match="cannot store fused KV"):
        down.write(missing, _context())


def test_the_password_goes_apart_from_the_url(server):
    store = HandoffRedis(url_of(server), SIGNER, 60.0, password="not-in-the-url")
    assert store._client.connection_pool.connection_kwargs["password"] == "not-in-the-url"
    assert "not-in-the-url" not in store.location


def test_ids_never_name_another_key(server):
    store = HandoffRedis(url_of(server), SIGNER, 60.0)
    bad = HandoffBinding("*", prompt_digest([1]), 1)
    assert store.check(bad) is not None and store.read(bad) is None
    with pytest.raises(ValueError, match="32 lowercase hex digits"):
        store.key("adarag:other")
