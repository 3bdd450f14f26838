"""Hostile values in the shared tier (a real Valkey server) and secrets in its settings.

- An entry consistent in every check (checksum recomputed) but with ``start_position = 10**20``
  made every query using the chunk raise OverflowError, also after the value was fixed (the
  bad entry stayed in memory): it is now refused before use and dropped from every tier.
- A 300 MB junk value was fetched whole: a read is bounded by ``remote_max_entry_bytes``
  (measured as the bytes the server sent).
- A key of another Redis type disabled the tier for ``remote_retry_s``: it is a bad key now.
- A password in the URL (``redis://:secret@``, ``?password=``, with ``/`` in it) or given as a
  number was printed in the store's warning and in configuration errors: never now.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load, save

from adarag import AdaRAG
from adarag.cache.entry_format import entry_digests
from adarag.cache.keys import digest
from adarag.cache.store import LayeredKVStore
from adarag.config import AdaRagConfig, StoreConfig
from adarag.errors import ConfigError
from adarag.kv import ChunkKV
from adarag.schema import GenerationParams
from tests.reliability.conftest import scale
from tests.remote_server import client_of, free_port, running_server, url_of
from tests.unit.engine.helpers import CHUNKS, QUESTION, load_engine

PARAMS = GenerationParams(max_new_tokens=6)
SECRET = "s3cr3t/pa?ss#word"


@pytest.fixture()
def server():
    with running_server() as running:
        yield running


def _metadata(data: bytes) -> dict[str, str]:
    length = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + length])["__metadata__"]


@pytest.fixture(scope="module")
def engine(tiny_checkpoints, tmp_path_factory):
    home = tmp_path_factory.mktemp("gen-home")
    config = AdaRagConfig.build(home=home, engine={"model": str(tiny_checkpoints["llama"])})
    return load_engine(config)


def test_an_entry_with_an_absurd_start_position_is_dropped_from_every_tier(
    engine, tiny_checkpoints, tiny_config, server, ledger
):
    store = {"remote_url": url_of(server), "disk_capacity_bytes": 0}
    config = tiny_config(
        tiny_checkpoints["llama"], augment={"enabled": False}, cache={"store": store}
    )
    clean = AdaRAG(config, loaded_engine=engine)
    clean.warm(CHUNKS)
    keys = clean.cache.keys([clean.prompts.chunk_ids(CHUNKS[0])])
    client = client_of(server)
    (name,) = client.keys(f"*:e:{digest(*sorted([keys.independent[0], keys.alone[0]]))}")
    genuine = client.get(name)
    metadata = {**_metadata(genuine), "start_position": str(10**20)}
    tensors = load(genuine)
    checksum, _ = entry_digests(metadata, tensors, None)
    client.set(name, save(tensors, metadata={**metadata, "checksum": checksum}))

    rag = AdaRAG(config, loaded_engine=engine)
    answers, errors = [], []
    for _ in range(2):
        try:
            answer = rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
            answers.append(answer.trace.steps[-1].tiers[0])
        except (OverflowError, RuntimeError) as err:
            errors.append(err)
    dropped = not client.exists(name) or client.get(name) != genuine  # gone, or rewritten
    client.set(name, genuine)  # the value fixed on the server
    fresh = AdaRAG(config, loaded_engine=engine).query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    ledger.record(
        "shared-tier entry with an absurd start position",
        cases=2,
        detected=2 - len(errors),
        wrong_answers=len(errors),
    )
    assert not errors, errors
    assert answers[0] == "miss" and dropped
    assert rag.cache.store.snapshot().remote_dropped >= 1
    assert fresh.text  # the fixed value is served again


def _kv(num_tokens: int) -> ChunkKV:
    shape = (2, num_tokens, 2, 4)
    return ChunkKV(torch.ones(shape), torch.ones(shape), 0)


def _store(server, directory, **config) -> LayeredKVStore:
    settings = StoreConfig(remote_url=url_of(server), storage_dtype="float32", **config)
    return LayeredKVStore(settings, directory, "model-a")


def _bytes_sent(client) -> int:
    return int(client.info("stats")["total_net_output_bytes"])


def test_a_huge_junk_value_is_never_fetched_whole(server, tmp_path, ledger):
    writer = _store(server, None)
    writer.put(["key"], _kv(4), persist=True)
    client = client_of(server)
    entry_name = writer.remote.entry_name(client.get(writer.remote.key_name("key")).decode())
    junk_bytes = scale(8, 300) * 1024**2
    client.setrange(entry_name, junk_bytes - 1, b"\0")  # the entry's bytes, then zeros
    bound = 1024**2
    reader = _store(server, None, remote_max_entry_bytes=bound)
    before = _bytes_sent(client)
    got = reader.get("key")
    sent = _bytes_sent(client) - before
    stats = reader.snapshot()
    ledger.record(
        "oversized value in the shared tier",
        detected=int(got is None and sent < 2 * bound and stats.remote_oversized == 1),
    )
    assert got is None and stats.remote_oversized == 1
    assert sent < 2 * bound, f"{sent} bytes fetched for a {junk_bytes}-byte value"
    assert not client.exists(entry_name)  # dropped


def test_a_key_of_another_type_is_a_bad_key_not_a_server_failure(server, tmp_path, ledger):
    writer = _store(server, None)
    writer.put(["good"], _kv(4), persist=True)
    client = client_of(server)
    client.lpush(writer.remote.key_name("listed"), "x")  # a list where a string belongs
    reader = _store(server, None)
    assert reader.get("listed") is None
    still_up = reader.remote.is_available and reader.get("good") is not None
    stats = reader.snapshot()
    ledger.record("shared-tier key of another type", detected=int(still_up))
    assert still_up, "the tier went down over one bad key"
    assert stats.remote_failures == 0 and stats.remote_dropped == 1
    assert not client.exists(writer.remote.key_name("listed"))


@pytest.mark.parametrize(
    "settings",
    [
        {"remote_url": "redis://:s3cr3t@127.0.0.1:{port}/0"},
        {"remote_url": f"redis://:{SECRET}@127.0.0.1:{{port}}/0"},
        {"remote_url": f"redis://admin:{SECRET}@127.0.0.1:{{port}}/0"},
        {"remote_url": f"redis://127.0.0.1:{{port}}/0?password={SECRET}"},
    ],
    ids=["plain userinfo", "userinfo", "user and password", "query"],
)
def test_a_password_in_the_url_never_reaches_a_log_or_an_error(settings, tmp_path, caplog, ledger):
    url = settings["remote_url"].replace("{port}", str(free_port()))  # nothing listens there
    shown: list[str] = []
    with caplog.at_level(logging.DEBUG):
        try:
            store = LayeredKVStore(StoreConfig(remote_url=url), None, "model-a")
            store.get("key")
        except ValueError as err:  # a URL the client cannot parse: refused by the settings
            shown.append(str(err))
    try:
        AdaRagConfig.build(cache={"store": {"remote_url": url, "remote_ttl_seconds": "soon"}})
    except ConfigError as err:
        shown.append(str(err))
    try:  # a URL the client cannot parse is reported without its password
        AdaRagConfig.build(cache={"store": {"remote_url": url.replace("127.0.0.1", "[bad")}})
    except ConfigError as err:
        shown.append(str(err))
    text = caplog.text + "\n".join(shown)
    leaked = any(part in text for part in ("s3cr3t", "pa?ss", "#word"))
    ledger.record("password in the shared tier's URL", detected=int(not leaked))
    assert not leaked, text
    assert "failed" in caplog.text or "cannot be read" in text  # warned, or refused


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("remote_password", 1234567890123456789),
        ("remote_password", ["s3cr3t-s3cr3t-s3cr3t"]),
        ("signing_key", 1234567890123456789),
        ("signing_key", ["s3cr3t-s3cr3t-s3cr3t"]),
        ("signing_key", "s3cr3t"),  # too short
    ],
)
def test_a_secret_of_the_wrong_type_or_length_is_never_echoed(field, value, ledger):
    with pytest.raises(ConfigError) as raised:
        AdaRagConfig.build(cache={"store": {field: value}})
    message = str(raised.value)
    leaked = "s3cr3t" in message or "1234567890" in message
    ledger.record("secret setting of a bad type", detected=int(not leaked and field in message))
    assert not leaked and field in message, message
