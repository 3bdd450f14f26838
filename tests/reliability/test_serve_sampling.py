"""Sampling options at the edges of what validation lets through, sent to a server over HTTP.

A temperature of 1e-300, 5e-324 (the smallest float) or 1e-40 once overflowed the scaled logits
into inf and NaN, and a top_p of 1e-300 rounded to 0 in float32 and dropped every token: 500
for a whole answer, and a stream that stopped after its first event with no error and no
``[DONE]``. A seed of 2**64 or more overflowed the engine's seed: 500. Now a tiny temperature
or top_p samples the most likely token (greedy decoding is their limit), a seed outside a 64-bit
engine's range is refused with 400 naming ``seed``, and any failure mid-stream ends the
stream with an error event and ``[DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from adarag.engine import decoding
from tests.reliability.http_server import AUTH, Served, serving, tiny_rag

PROMPT = "the capital of france is"
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def rag(tiny_checkpoints, tmp_path_factory):
    return tiny_rag(tiny_checkpoints["llama"], tmp_path_factory.mktemp("sampling-home"))


@pytest.fixture(scope="module")
def server(rag) -> Iterator[Served]:
    with serving(rag) as served:
        yield served


def complete(server: Served, stream: bool = False, **options) -> httpx.Response:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
        "rag": False,
        "stream": stream,
        **options,
    }
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=120)


def events(reply: httpx.Response) -> list:
    """The stream's events: JSON bodies, and the string ``[DONE]``."""
    data = [line.removeprefix("data: ") for line in reply.text.splitlines() if line]
    return [item if item == "[DONE]" else json.loads(item) for item in data]


def streamed_text(items: list) -> str:
    return "".join(
        item["choices"][0]["delta"].get("content") or ""
        for item in items
        if isinstance(item, dict) and item.get("choices")
    )


EXTREMES = [
    pytest.param({"temperature": 1e-300}, id="temperature=1e-300"),
    pytest.param({"temperature": 5e-324}, id="temperature=5e-324"),
    pytest.param({"temperature": 1e-40}, id="temperature=1e-40"),
    pytest.param({"temperature": 0.7, "top_p": 1e-300}, id="top_p=1e-300"),
    pytest.param({"temperature": 2.0, "top_p": 5e-324, "seed": 2**64 - 1}, id="top_p=5e-324"),
]


@pytest.mark.parametrize("options", EXTREMES)
def test_a_tiny_temperature_or_top_p_answers_as_greedy_decoding(server, options, ledger):
    greedy = complete(server, temperature=0)
    assert greedy.status_code == 200
    expected = greedy.json()["choices"][0]["message"]["content"]
    whole = complete(server, **options)
    assert whole.status_code == 200, whole.text
    assert whole.json()["choices"][0]["message"]["content"] == expected
    streamed = complete(server, stream=True, **options)
    assert streamed.status_code == 200
    items = events(streamed)
    assert items[-1] == "[DONE]" and items[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert not any("error" in item for item in items if isinstance(item, dict))
    assert streamed_text(items).strip() == expected
    ledger.record("HTTP: extreme sampling options", cases=2)


@pytest.mark.parametrize("seed", [2**64, 2**200, -(2**63) - 1])
def test_a_seed_outside_64_bits_is_refused_naming_it(server, seed, ledger):
    for stream in (False, True):
        reply = complete(server, stream=stream, temperature=0.7, seed=seed)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == "seed" and error["type"] == "invalid_request_error"
    query = {"question": PROMPT, "chunks": ["a passage."], "temperature": 0.7, "seed": seed}
    reply = httpx.post(f"{server.url}/v1/rag/query", json=query, headers=AUTH, timeout=120)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "seed"
    ledger.record("HTTP: extreme sampling options", cases=3)


@pytest.mark.parametrize("seed", [2**64 - 1, -(2**63), 0])
def test_seeds_at_the_ends_of_the_range_sample_reproducibly(server, seed):
    first = complete(server, temperature=1.5, seed=seed)
    again = complete(server, temperature=1.5, seed=seed)
    assert first.status_code == again.status_code == 200, first.text
    assert first.json()["choices"][0]["message"] == again.json()["choices"][0]["message"]


def test_a_failure_mid_stream_ends_it_with_an_error_event_and_done(server, monkeypatch, ledger):
    calls: list[int] = []
    sample_token = decoding.sample_token

    def failing_on_the_third(*args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("a fault in the engine")
        return sample_token(*args)

    monkeypatch.setattr(decoding, "sample_token", failing_on_the_third)
    reply = complete(server, stream=True, temperature=0)
    assert reply.status_code == 200
    items = events(reply)
    assert items[-1] == "[DONE]"
    error = items[-2]["error"]
    assert error["type"] == "server_error" and "RuntimeError" in error["message"]
    assert streamed_text(items)  # the deltas before the failure were sent
    calls.clear()
    whole = complete(server, temperature=0)
    assert whole.status_code == 500 and "RuntimeError" in whole.json()["error"]["message"]
    health = server.health()
    assert health["active_requests"] == 0 and health["status"] == "ok"
    ledger.record("HTTP: failure mid-stream", cases=2)
