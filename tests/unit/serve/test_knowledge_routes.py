"""``/metrics``, ``/v1/embeddings`` and the chat page on a tiny model, in-process."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.unit.retrievers.test_knowledge_base import WordEmbedder  # noqa: E402
from tests.unit.serve.conftest import AUTH  # noqa: E402


def scrape(client) -> dict[tuple[str, tuple], float]:
    reply = client.get("/metrics", headers=AUTH)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(reply.text)
        for sample in family.samples
    }


def chat(client, content: str, **body):
    message = {"role": "user", "content": content}
    return client.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [message], "max_tokens": 2, **body},
        headers=AUTH,
    )


def test_metrics_count_answers_outcomes_ttft_tiers_and_store_bytes(served):
    client = served[0]
    before = scrape(client)
    for _ in range(3):
        assert chat(client, "when does the gate close?").status_code == 200
    streamed = chat(client, "when does the lodge close?", stream=True)
    assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
    assert chat(client, "").status_code == 400
    after = scrape(client)

    def moved(name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert moved("adarag_requests_total", route="chat", outcome="ok") == 4
    assert moved("adarag_requests_total", route="chat", outcome="invalid") == 1
    assert moved("adarag_time_to_first_token_seconds_count") == 4
    assert moved("adarag_time_to_first_token_seconds_sum") > 0
    assert moved("adarag_recomputed_ratio_count") == 4
    lookups = sum(
        moved("adarag_kv_lookups_total", tier=tier)
        for tier in ("hard", "miss", "independent", "soft")
    )
    assert lookups >= 4  # at least one chunk per answer
    assert moved("adarag_prompt_tokens_total") > 0
    assert after[("adarag_kv_store_bytes", (("layer", "memory"),))] > 0
    assert after[("adarag_queued_requests", ())] == 0 and after[("adarag_active_requests", ())] == 0
    assert client.get("/metrics").status_code == 401


def test_metrics_time_each_answer_end_to_end_and_per_output_token(served):
    client = served[0]
    before = scrape(client)
    tokens = []  # each answer's completion tokens
    for question in ("when does the gate close?", "is the lodge shut at night?"):
        reply = chat(client, question, max_tokens=4)
        assert reply.status_code == 200
        tokens.append(reply.json()["usage"]["completion_tokens"])
    options = {"stream": True, "stream_options": {"include_usage": True}}
    streamed = chat(client, "when is the gate shut?", max_tokens=4, **options)
    usage = [json.loads(line[6:]) for line in streamed.text.splitlines() if '"usage"' in line]
    tokens.append(usage[-1]["usage"]["completion_tokens"])
    plain = chat(client, "count to ten", max_tokens=3, rag=False)
    tokens.append(plain.json()["usage"]["completion_tokens"])
    assert chat(client, "").status_code == 400  # refused: not an answer
    after = scrape(client)

    def moved(name: str) -> float:
        return after.get((name, ()), 0.0) - before.get((name, ()), 0.0)

    assert moved("adarag_e2e_request_latency_seconds_count") == 4
    assert moved("adarag_e2e_request_latency_seconds_sum") > 0
    assert moved("adarag_generation_tokens_total") == sum(tokens) > 0
    decoded = sum(1 for count in tokens if count >= 2)  # the first token comes with prefill
    assert moved("adarag_time_per_output_token_seconds_count") == decoded
    assert (moved("adarag_time_per_output_token_seconds_sum") > 0) == (decoded > 0)


def test_embeddings_are_the_knowledge_base_model_s_as_floats_or_base64(served):
    client = served[0]
    texts = ["the gate stays shut", "bins go out on monday"]
    body = {"model": "any", "input": texts}
    floats = client.post("/v1/embeddings", json=body, headers=AUTH).json()
    expected = WordEmbedder().embed_documents(texts)
    assert floats["model"] == WordEmbedder.name and floats["object"] == "list"
    assert [item["index"] for item in floats["data"]] == [0, 1]
    np.testing.assert_allclose([item["embedding"] for item in floats["data"]], expected)
    packed = client.post("/v1/embeddings", json={**body, "encoding_format": "base64"}, headers=AUTH)
    decoded = [
        np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4").tolist()
        for item in packed.json()["data"]
    ]
    np.testing.assert_allclose(decoded, expected, atol=1e-6)
    one = client.post("/v1/embeddings", json={"model": "m", "input": texts[0]}, headers=AUTH)
    np.testing.assert_allclose(one.json()["data"][0]["embedding"], expected[0])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": [[101, 202]]}, "token ids are not accepted"),
        ({"input": []}, "at least one text"),
        ({"input": ["ok", " "]}, "non-empty"),
        ({"input": "ok", "dimensions": 7}, "have 16 dimensions"),
    ],
)
def test_embedding_requests_it_cannot_serve_are_refused_with_the_fix(served, body, message):
    reply = served[0].post("/v1/embeddings", json={"model": "m", **body}, headers=AUTH)
    assert reply.status_code == 400 and message in reply.json()["error"]["message"]


def test_the_chat_page_is_served_without_the_key_and_locked_to_its_own_files(served):
    client = served[0]
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="/chat.js"' in page.text and 'id="upload"' in page.text
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy
    script = client.get("/chat.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "/v1/chat/completions" in script.text and "innerHTML" not in script.text
    assert client.get("/chat.css").status_code == 200
    assert client.get("/v1/models").status_code == 401  # the API still needs the key
