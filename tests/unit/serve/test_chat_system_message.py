"""A RAG chat's system message applies to its answer, after the cached context."""

from __future__ import annotations

import pytest

pytest.importorskip("chromadb")

from tests.unit.serve.conftest import AUTH  # noqa: E402

QUESTION = "when does the lodge close?"


def chat(client, *messages: tuple[str, str]) -> dict:
    body = {
        "model": "m",
        "messages": [{"role": role, "content": text} for role, text in messages],
        "max_tokens": 2,
    }
    reply = client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_system_message_goes_into_the_prompt_and_leaves_retrieval_alone(served):
    client, rag = served[0], served[1]
    chat(client, ("user", QUESTION))  # caches the context as the answers below find it
    plain = chat(client, ("user", QUESTION))
    french = chat(client, ("system", "Always answer in French."), ("user", QUESTION))
    instruction_ids = rag.prompts.text_ids("Always answer in French.\n")
    added = french["usage"]["prompt_tokens"] - plain["usage"]["prompt_tokens"]
    assert added >= len(instruction_ids) - 1  # a token may merge across the line break
    assert french["adarag"]["sources"] == plain["adarag"]["sources"]
    # the system prefix and the chunk stay cached: as many cached tokens as the plain request
    assert (
        french["usage"]["prompt_tokens_details"]["cached_tokens"]
        == (plain["usage"]["prompt_tokens_details"]["cached_tokens"])
    )
    developer = chat(client, ("developer", "Always answer in French."), ("user", QUESTION))
    assert developer["usage"]["prompt_tokens"] == french["usage"]["prompt_tokens"]


def test_a_system_message_the_prompt_cannot_hold_is_refused(served):
    client = served[0]
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "answer\x02 in French"},
            {"role": "user", "content": QUESTION},
        ],
        "max_tokens": 2,
    }
    reply = client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert reply.status_code == 400 and "U+0002" in reply.json()["error"]["message"]
