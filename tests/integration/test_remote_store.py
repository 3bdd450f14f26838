"""The shared KV tier with the real model, a real Valkey server and a second real process.

Process A (a subprocess) warms chunks into the server; the test process answers from an empty
local cache directory and must take those chunks from the server. A server killed mid-run and a
damaged value on the server must leave every answer what it would have been without the fault.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from adarag import AdaRAG, AdaRagConfig
from adarag.schema import GenerationParams
from tests.remote_server import client_of, running_server, url_of

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PARAMS = GenerationParams(max_new_tokens=4)
# Demo-corpus passages of a few dozen words each (the long one at index 6 is left out).
PASSAGES = [
    json.loads(line)["text"]
    for idx, line in enumerate(
        resources.files("adarag.data").joinpath("demo_corpus.jsonl").read_text().splitlines()
    )
    if idx in (0, 1, 2, 3, 4, 5, 7)
]
QUESTION = "When did Lothair Ii's mother die?"


@pytest.fixture(scope="module")
def seed_server(real_config, tmp_path_factory):
    """A server holding every passage's KV, warmed by another process (once per module)."""
    with running_server() as running:
        _warm_in_another_process(real_config, tmp_path_factory.mktemp("a"), url_of(running))
        yield running


@pytest.fixture()
def server(seed_server):
    """A server of this test's own, holding a copy of what process A warmed."""
    with running_server() as running:
        source, target = client_of(seed_server), client_of(running)
        for name in source.keys("*"):
            target.set(name, source.get(name), ex=source.ttl(name))
        yield running


def _config(real_config, directory: Path, url: str | None) -> AdaRagConfig:
    return AdaRagConfig.build(
        real_config,
        augment={"enabled": False},  # one static step: each chunk's tier shows in the trace
        cache={"store": {"directory": str(directory), "remote_url": url}},
    )


def _pipeline(real_config, engine, directory: Path, url: str | None) -> AdaRAG:
    return AdaRAG(_config(real_config, directory, url), loaded_engine=engine)


@pytest.fixture(scope="module")
def engine(real_config):
    return AdaRAG(real_config).engine


def _warm_in_another_process(real_config, tmp_path: Path, url: str) -> None:
    config_path = tmp_path / "process-a.json"
    config = _config(real_config, tmp_path / "process-a-kv", url)
    config_path.write_text(json.dumps(config.model_dump(mode="json")))
    passages_path = tmp_path / "passages.json"
    passages_path.write_text(json.dumps(PASSAGES))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.integration.remote_child",
            str(config_path),
            str(passages_path),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["computed"] == len(PASSAGES)
    assert report["store"]["remote_writes"] == len(PASSAGES) + 1  # the chunks and the system


def _remote_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "adarag.cache.remote" and r.levelno >= logging.WARNING
    ]


def test_chunks_warmed_by_another_process_are_served_from_the_server(
    real_config, engine, server, tmp_path
):
    chunks = PASSAGES[:3]

    rag = _pipeline(real_config, engine, tmp_path / "process-b-kv", url_of(server))
    answer = rag.query(QUESTION, chunks=chunks, params=PARAMS)
    # the first chunk's KV computed alone is also its exact (hard) KV at the prompt's start
    assert answer.trace.steps[-1].tiers == ("hard", "independent", "independent")
    report = rag.cache_stats()
    assert report.tiers.hits["miss"] == 0  # no chunk's KV was computed in this process
    assert report.store.remote_hits == 3 + 1  # the chunks and the system prefix
    assert report.store.remote_read_bytes > 0

    # the same KV warmed locally in this process gives the same answer
    local = _pipeline(real_config, engine, tmp_path / "local-kv", None)
    assert local.warm(chunks) == 3
    reference = local.query(QUESTION, chunks=chunks, params=PARAMS)
    assert reference.trace.steps[-1].tiers == answer.trace.steps[-1].tiers
    assert answer.text == reference.text


def test_a_server_killed_mid_run_leaves_the_answers_unchanged(
    real_config, engine, server, tmp_path, caplog
):
    # the first question brings its chunks into the local tiers; the second reorders them
    contexts = [[0, 1, 2], [2, 0, 1]]
    questions = [(QUESTION, [PASSAGES[idx] for idx in context]) for context in contexts]

    up = _pipeline(real_config, engine, tmp_path / "up-kv", url_of(server))
    expected = [up.query(q, chunks=chunks, params=PARAMS) for q, chunks in questions]
    assert up.cache_stats().store.remote_failures == 0

    killed = _pipeline(real_config, engine, tmp_path / "killed-kv", url_of(server))
    with caplog.at_level(logging.WARNING, logger="adarag.cache.remote"):
        answers = [killed.query(q, chunks=chunks, params=PARAMS) for q, chunks in questions[:1]]
        server.terminate()  # SIGKILL, mid-run
        answers += [killed.query(q, chunks=chunks, params=PARAMS) for q, chunks in questions[1:]]
        # a chunk the server holds but this process never fetched is recomputed
        unseen = killed.query(QUESTION, chunks=[PASSAGES[6]], params=PARAMS)
        killed.close()
    assert [a.text for a in answers] == [a.text for a in expected]
    assert [a.trace.steps[-1].tiers for a in answers] == [a.trace.steps[-1].tiers for a in expected]
    assert unseen.trace.steps[-1].tiers == ("miss",) and unseen.text
    warnings = _remote_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "local tiers only" in warnings[0]


def test_a_damaged_value_on_the_server_is_dropped_and_recomputed(
    real_config, engine, server, tmp_path, caplog
):
    chunks = PASSAGES[:3]
    rag = _pipeline(real_config, engine, tmp_path / "process-b-kv", url_of(server))
    remote = rag.cache.store.remote
    independent_key = rag.cache.keys([rag.prompts.chunk_ids(chunks[1])]).independent[0]
    client = client_of(server)
    entry_name = remote.entry_name(client.get(remote.key_name(independent_key)).decode())
    value = bytearray(client.get(entry_name))
    value[len(value) // 2] ^= 0x01  # one bit of the tensor data
    client.set(entry_name, bytes(value))

    with caplog.at_level(logging.WARNING, logger="adarag.cache.remote"):
        answer = rag.query(QUESTION, chunks=chunks, params=PARAMS)
    assert answer.trace.steps[-1].tiers == ("hard", "miss", "independent")
    assert any("dropping entry" in message for message in _remote_warnings(caplog))
    assert not client.exists(entry_name)
    assert not client.exists(remote.key_name(independent_key))

    # the answer is the one computed with that chunk recomputed and the others reused
    local = _pipeline(real_config, engine, tmp_path / "local-kv", None)
    local.warm([chunks[0], chunks[2]])
    reference = local.query(QUESTION, chunks=chunks, params=PARAMS)
    assert reference.trace.steps[-1].tiers == ("hard", "miss", "independent")
    assert answer.text == reference.text

    # recomputed once here, the chunk is on probation (cache.store.admission): kept out of the
    # shared tier until it is written back again
    rag.close()
    assert not client.exists(remote.key_name(independent_key))
