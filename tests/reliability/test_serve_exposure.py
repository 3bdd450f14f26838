"""What a client learns about the server: source files by name only, never where they are kept.

An ingested chunk's metadata holds the absolute path of its file (``source``); the server once
returned it as is in every answer's sources, showing clients its directory layout. Now the
sources name the file only, in whole answers, in a stream's first event and in ``/v1/rag/query``.
(The docs and the OpenAI schema needing the API key are tested in
``tests/unit/serve/test_limits.py``.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.reliability.http_server import AUTH, SOURCE_DIR, Served, serving, tiny_rag

QUESTION = "what is the capital of france?"


@pytest.fixture(scope="module")
def server(tiny_checkpoints, tmp_path_factory) -> Iterator[Served]:
    rag = tiny_rag(tiny_checkpoints["llama"], tmp_path_factory.mktemp("exposure-home"))
    with serving(rag) as served:
        yield served


def post(server: Served, route: str, body: dict) -> httpx.Response:
    reply = httpx.post(f"{server.url}/v1/{route}", json=body, headers=AUTH, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply


def check_sources(sources: list[dict]) -> None:
    assert sources, "the question retrieved nothing"
    for source in sources:
        assert source["metadata"]["source"] in ("file0.md", "file1.md")


def test_answers_name_their_source_files_without_the_servers_paths(server, ledger):
    chat = {"model": "m", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 2}
    whole = post(server, "chat/completions", chat)
    check_sources(whole.json()["adarag"]["sources"])
    streamed = post(server, "chat/completions", {**chat, "stream": True})
    first = json.loads(streamed.text.split("\n\n")[0].removeprefix("data: "))
    check_sources(first["adarag"]["sources"])
    text = {"model": "m", "prompt": QUESTION, "max_tokens": 2, "rag": True}
    check_sources(post(server, "completions", text).json()["adarag"]["sources"])
    query = post(server, "rag/query", {"question": QUESTION, "max_new_tokens": 2})
    check_sources(query.json()["sources"])
    for reply in (whole, streamed, query):
        assert SOURCE_DIR not in reply.text
    ledger.record("HTTP: server paths in answers", cases=4)
