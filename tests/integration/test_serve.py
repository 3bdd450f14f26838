"""``adarag serve`` on loopback with the real model and knowledge base, called by real clients.

The servers answer from the shared knowledge base with cache tiers under which what is cached
cannot change an answer (``tests/reliability/workload.py``), so a concurrent or streamed answer
must equal a serial one token for token under greedy decoding.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import openai
import pytest

from adarag import AdaRagConfig
from adarag.schema import GenerationParams
from tests.integration.conftest import (
    FILM_QUESTION,
    LOTHAIR_QUESTION,
    UNRELATED_QUESTION,
    config_file_with_knowledge_base,
)
from tests.reliability.http_server import Served, serving
from tests.reliability.workload import EXACT_STORE, EXACT_TIERS

pytestmark = pytest.mark.integration
API_KEY = "test-key"
MAX_TOKENS = 8
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"  # the model goes on counting: a long answer
QUESTIONS = (
    LOTHAIR_QUESTION,
    FILM_QUESTION,
    "Who was the mother of Lothair II?",
    "Where was Andy Summers born?",
    "In which country is Marufabad?",
    "Who sang Changed It?",
    "Who was Aivar Kuusmaa?",
    "Who was Theodred II?",
)


def openai_client(served: Served, **options) -> openai.OpenAI:
    """An OpenAI client of ``served`` with the key."""
    return openai.OpenAI(base_url=served.base_url, api_key=API_KEY, max_retries=0, **options)


def running(rag, **serve) -> AbstractContextManager[Served]:
    """A server over ``rag`` with the key, in a thread of this process."""
    return serving(rag, API_KEY, **serve)


@pytest.fixture(scope="module")
def serve_rag(kb_rag, tmp_path_factory):
    """The shared model and knowledge base, with a float32 store of its own and exact tiers."""
    directory = tmp_path_factory.mktemp("serve-kv")
    store = {**EXACT_STORE, "directory": str(directory)}
    return kb_rag.with_config(cache={**EXACT_TIERS, "store": store}, augment={"enabled": False})


@pytest.fixture(scope="module")
def server(serve_rag) -> Iterator[Served]:
    with running(serve_rag, max_active_requests=4, max_queued_requests=32) as handle:
        yield handle


def ask(client: openai.OpenAI, question: str, **options):
    return client.chat.completions.create(
        model="adarag",
        messages=[{"role": "user", "content": question}],
        max_tokens=options.pop("max_tokens", MAX_TOKENS),
        **options,
    )


def source_titles(response) -> list[str]:
    return [s["metadata"]["title"] for s in response.model_extra["adarag"]["sources"]]


# --- OpenAI's client


def test_chat_answers_as_the_pipeline_with_sources_and_usage(server, serve_rag):
    response = ask(openai_client(server), LOTHAIR_QUESTION)
    expected = serve_rag.query(LOTHAIR_QUESTION, params=GenerationParams(max_new_tokens=MAX_TOKENS))
    assert response.choices[0].message.content == expected.text
    assert source_titles(response) == [c.metadata["title"] for c in expected.chunks]
    usage = response.usage
    assert usage.prompt_tokens == expected.trace.num_prompt_tokens
    assert usage.completion_tokens == expected.num_completion_tokens <= MAX_TOKENS
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert 0 < usage.prompt_tokens_details.cached_tokens <= usage.prompt_tokens
    finish = "length" if usage.completion_tokens == MAX_TOKENS else "stop"
    assert response.choices[0].finish_reason == finish
    assert response.model == openai_client(server).models.list().data[0].id


def test_a_stream_equals_the_whole_answer_and_ends_with_usage(server):
    client = openai_client(server)
    whole = ask(client, FILM_QUESTION)
    chunks = list(ask(client, FILM_QUESTION, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert source_titles(chunks[0]) == source_titles(whole)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    # asked a second time: more of its prompt comes from the cache (the hard tier)
    assert (
        usage.prompt_tokens_details.cached_tokens > whole.usage.prompt_tokens_details.cached_tokens
    )
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_continue_the_prompt_without_retrieval_unless_asked(server, serve_rag):
    client = openai_client(server)
    prompt = "The capital of France is"
    plain = client.completions.create(model="adarag", prompt=prompt, max_tokens=6)
    assert plain.model_extra["adarag"]["sources"] == []
    assert plain.usage.prompt_tokens == len(serve_rag.prompts.text_ids(prompt))
    streamed = client.completions.create(model="adarag", prompt=prompt, max_tokens=6, stream=True)
    assert "".join(c.choices[0].text for c in streamed).strip() == plain.choices[0].text
    grounded = client.completions.create(
        model="adarag", prompt=LOTHAIR_QUESTION, max_tokens=6, extra_body={"rag": True}
    )
    assert "Lothair II" in [
        s["metadata"]["title"] for s in grounded.model_extra["adarag"]["sources"]
    ]


def test_earlier_messages_are_the_history_and_rag_can_be_turned_off(server):
    client = openai_client(server)
    first = ask(client, "Who was the mother of Lothair II?")
    follow_up = client.chat.completions.create(
        model="adarag",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Who was the mother of Lothair II?"},
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "Where was she born?"},
        ],
        max_tokens=MAX_TOKENS,
    )
    # retrieved with the earlier question: her passage is a source of the follow-up
    assert "Ermengarde of Tours" in source_titles(follow_up)
    plain = ask(client, LOTHAIR_QUESTION, extra_body={"rag": False})
    assert source_titles(plain) == [] and plain.usage.prompt_tokens_details.cached_tokens == 0


def test_the_rag_route_returns_answer_sources_trace_and_usage(server, serve_rag):
    body = {"question": LOTHAIR_QUESTION, "max_new_tokens": MAX_TOKENS, "top_k": 2}
    reply = httpx.post(
        f"{server.base_url}/rag/query", json=body, headers={"Authorization": f"Bearer {API_KEY}"}
    )
    assert reply.status_code == 200
    result = reply.json()
    expected = serve_rag.query(
        LOTHAIR_QUESTION, params=GenerationParams(max_new_tokens=MAX_TOKENS), top_k=2
    )
    assert result["answer"] == expected.text
    assert [s["text"] for s in result["sources"]] == [c.text for c in expected.chunks]
    assert len(result["sources"]) <= 2
    assert result["trace"]["num_chunks_used"] == len(result["sources"])
    assert result["trace"]["steps"][-1]["tiers"]
    assert result["usage"]["completion_tokens"] == expected.num_completion_tokens


def test_unrelated_questions_get_the_no_context_answer(server):
    response = ask(openai_client(server), UNRELATED_QUESTION)
    assert source_titles(response) == []
    assert response.model_extra["adarag"]["stop_reason"] == "no_context"


# --- errors


def test_a_wrong_or_missing_key_is_refused(server):
    wrong = openai.OpenAI(base_url=server.base_url, api_key="not-the-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        ask(wrong, LOTHAIR_QUESTION)
    assert caught.value.body["code"] == "invalid_api_key"
    assert httpx.get(f"{server.base_url}/models").status_code == 401
    assert server.health()["status"] == "ok"  # the health check needs no key


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("chat/completions", {"model": "m"}, "messages"),
        ("chat/completions", {"model": "m", "messages": []}, "messages"),
        (
            "chat/completions",
            {"model": "m", "messages": [{"role": "robot", "content": "hi"}]},
            "messages.0.role",
        ),
        (
            "chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"},
            "temperature",
        ),
        (
            "chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2},
            "n",
        ),
        (
            "chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0},
            "max_tokens",
        ),
        (
            "chat/completions",
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "x"},
                ],
            },
            "messages",
        ),
        ("completions", {"model": "m", "prompt": ["a", "b"]}, "prompt"),
        ("rag/query", {"question": "hi", "max_new_token": 4}, "max_new_token"),
        ("rag/query", {"question": ""}, "question"),
    ],
)
def test_a_bad_body_is_refused_naming_the_field(server, route, body, param):
    reply = httpx.post(
        f"{server.base_url}/{route}", json=body, headers={"Authorization": f"Bearer {API_KEY}"}
    )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error["message"].startswith(param) or param in error["message"]


def test_a_json_response_format_is_refused_saying_why(server):
    """Regression: response_format was accepted and ignored."""
    with pytest.raises(openai.BadRequestError) as caught:
        ask(openai_client(server), LOTHAIR_QUESTION, response_format={"type": "json_object"})
    error = caught.value.body
    assert caught.value.status_code == 400 and error["param"] == "response_format"
    assert "no constrained (JSON schema) decoding" in error["message"]
    plain = ask(openai_client(server), LOTHAIR_QUESTION, response_format={"type": "text"})
    assert plain.choices[0].message.content


def test_unknown_routes_and_methods_get_openai_errors_and_models_can_be_retrieved(server):
    """Regression: FastAPI's {"detail": ...} bodies, and no GET /v1/models/{id}."""
    client = openai_client(server)
    served = client.models.list().data[0].id
    assert client.models.retrieve(served).id == served
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-4o")
    assert caught.value.body["code"] == "model_not_found" and served in caught.value.message
    headers = {"Authorization": f"Bearer {API_KEY}"}
    missing = httpx.post(f"{server.base_url}/audio/speech", json={}, headers=headers)
    assert missing.status_code == 404 and set(missing.json()) == {"error"}
    assert missing.json()["error"]["code"] == "not_found"
    assert "/v1/chat/completions" in missing.json()["error"]["message"]
    wrong_method = httpx.get(f"{server.base_url}/chat/completions", headers=headers)
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
    error = wrong_method.json()["error"]
    assert error["code"] == "method_not_allowed" and "use POST" in error["message"]


def test_a_body_that_is_not_json_is_refused(server):
    reply = httpx.post(
        f"{server.base_url}/chat/completions",
        content=b"{not json",
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
    )
    assert reply.status_code == 400 and "not valid JSON" in reply.json()["error"]["message"]


# --- frameworks


def test_langchain_chat_openai_gets_the_servers_answers(server):
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(
        model="adarag",
        base_url=server.base_url,
        api_key=API_KEY,
        max_tokens=MAX_TOKENS,
        temperature=0,
        max_retries=0,
        stream_usage=True,
    )
    expected = ask(openai_client(server), LOTHAIR_QUESTION).choices[0].message.content
    message = model.invoke(LOTHAIR_QUESTION)
    assert message.content == expected
    assert message.usage_metadata["output_tokens"] <= MAX_TOKENS
    streamed = list(model.stream(LOTHAIR_QUESTION))
    assert "".join(c.content for c in streamed).strip() == expected
    assert (
        sum(c.usage_metadata["total_tokens"] for c in streamed if c.usage_metadata)
        == (message.usage_metadata["total_tokens"])
    )


def test_llama_index_openai_like_gets_the_servers_answers(server):
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.openai_like import OpenAILike

    client = openai_client(server)
    expected = ask(client, FILM_QUESTION).choices[0].message.content
    chat_llm = OpenAILike(
        model="adarag",
        api_base=server.base_url,
        api_key=API_KEY,
        is_chat_model=True,
        max_tokens=MAX_TOKENS,
        temperature=0,
        max_retries=0,
    )
    assert chat_llm.chat([ChatMessage(role="user", content=FILM_QUESTION)]).message.content == (
        expected
    )
    deltas = chat_llm.stream_chat([ChatMessage(role="user", content=FILM_QUESTION)])
    assert "".join(d.delta or "" for d in deltas).strip() == expected
    text_llm = OpenAILike(
        model="adarag",
        api_base=server.base_url,
        api_key=API_KEY,
        is_chat_model=False,
        max_tokens=6,
        temperature=0,
        max_retries=0,
    )
    plain = client.completions.create(model="adarag", prompt="Once upon a time", max_tokens=6)
    assert text_llm.complete("Once upon a time").text == plain.choices[0].text


# --- concurrency, the queue, timeouts and shutdown


def test_sixteen_concurrent_streams_equal_serial_answers(server):
    client = openai_client(server)
    serial = {q: ask(client, q).choices[0].message.content for q in QUESTIONS}

    async def stream_one(aclient: openai.AsyncOpenAI, question: str) -> str:
        stream = await aclient.chat.completions.create(
            model="adarag",
            messages=[{"role": "user", "content": question}],
            max_tokens=MAX_TOKENS,
            stream=True,
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def all_at_once() -> list[str]:
        async with openai.AsyncOpenAI(
            base_url=server.base_url, api_key=API_KEY, max_retries=0
        ) as aclient:
            requests = [stream_one(aclient, q) for q in QUESTIONS + QUESTIONS]
            return await asyncio.gather(*requests)

    answers = asyncio.run(all_at_once())
    assert [a.strip() for a in answers] == [serial[q] for q in QUESTIONS + QUESTIONS]
    health = server.health()
    assert health["active_requests"] == 0 and health["queued_requests"] == 0


def _open_stream(running: Served, question: str, max_tokens: int):
    """A streaming request whose first event has arrived (it holds an active slot)."""
    stream = openai_client(running).chat.completions.create(
        model="adarag",
        messages=[{"role": "user", "content": question}],
        max_tokens=max_tokens,
        stream=True,
    )
    first = next(iter(stream))
    assert first.choices[0].delta.role == "assistant"
    return stream


def _in_thread(call) -> tuple[threading.Thread, list]:
    outcome: list = []

    def target() -> None:
        try:
            outcome.append(call())
        except Exception as err:  # the outcome is the error
            outcome.append(err)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


def _wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.05)


def test_a_full_queue_answers_429_and_a_closed_stream_frees_its_slot(serve_rag):
    with running(serve_rag, max_active_requests=1, max_queued_requests=1) as small:
        holder = _open_stream(small, LOTHAIR_QUESTION, max_tokens=200)
        waiter, outcome = _in_thread(lambda: ask(openai_client(small), FILM_QUESTION))
        _wait_for(lambda: small.health()["queued_requests"] == 1)
        with pytest.raises(openai.RateLimitError) as caught:
            ask(openai_client(small), FILM_QUESTION)
        assert caught.value.body["code"] == "queue_full"
        assert caught.value.response.headers["retry-after"]
        holder.close()  # the client goes away mid-answer: its slot goes to the waiting request
        waiter.join(timeout=120)
        assert outcome and outcome[0].choices[0].message.content
        _wait_for(lambda: small.health()["active_requests"] == 0)


def test_a_request_past_its_timeout_gets_504_and_frees_its_slot(serve_rag):
    with running(serve_rag, max_active_requests=1, request_timeout_s=3.0) as slow:
        client = openai_client(slow)
        with pytest.raises(openai.APIStatusError) as caught:
            client.completions.create(model="adarag", prompt=COUNTING, max_tokens=2000)
        assert caught.value.status_code == 504
        assert caught.value.body["code"] == "request_timeout"
        _wait_for(lambda: slow.health()["active_requests"] == 0)
        # streamed: the stream ends with an error event (or a 504, if the prefill alone is late)
        with pytest.raises(openai.APIError, match=r"longer than 3 s"):
            for _ in client.completions.create(
                model="adarag", prompt=COUNTING, max_tokens=2000, stream=True
            ):
                pass
        _wait_for(lambda: slow.health()["active_requests"] == 0)


def test_shutdown_finishes_in_flight_refuses_queued_and_flushes_the_cache(serve_rag):
    with running(serve_rag, max_active_requests=1, shutdown_grace_s=60) as handle:
        # a question asked nowhere else: its KV is written back when its answer ends
        in_flight = _open_stream(handle, "Who is Nicki Minaj?", max_tokens=24)
        queued, outcome = _in_thread(lambda: ask(openai_client(handle), FILM_QUESTION))
        _wait_for(lambda: handle.health()["queued_requests"] == 1)
        handle.server.handle_exit(signal.SIGTERM, None)
        queued.join(timeout=60)
        assert isinstance(outcome[0], openai.InternalServerError)
        assert outcome[0].status_code == 503 and outcome[0].body["code"] == "shutting_down"
        rest = list(in_flight)  # the answer in flight goes on to its end
        assert rest[-1].choices[0].finish_reason in ("stop", "length")
        handle.thread.join(timeout=120)
    stats = serve_rag.cache_stats().store
    assert stats.memory_entries > 0 and stats.disk_entries >= stats.memory_entries


def test_shutdown_cancels_what_outlasts_the_grace_period(serve_rag):
    with running(serve_rag, max_active_requests=1, shutdown_grace_s=0.5) as handle:
        in_flight = openai_client(handle).completions.create(
            model="adarag", prompt=COUNTING, max_tokens=2000, stream=True
        )
        started = time.monotonic()
        handle.server.handle_exit(signal.SIGTERM, None)
        with pytest.raises((openai.APIError, httpx.HTTPError)):
            for chunk in in_flight:
                assert not (chunk.choices and chunk.choices[0].finish_reason)
        handle.thread.join(timeout=120)
        assert time.monotonic() - started < 60


# --- the command line, stopped by SIGTERM


@pytest.fixture(scope="module")
def serve_config_file(real_config, shared_rag, corpus_path, tmp_path_factory) -> Path:
    """A knowledge base of its own (the shared one is held by this process) and a fresh KV dir."""
    directory = tmp_path_factory.mktemp("serve-cli")
    config = AdaRagConfig.build(
        real_config,
        retrieval={
            "chroma_directory": str(directory / "chroma"),
            "collection": "serve",
            "top_k": 2,
        },
        cache={"store": {"directory": str(directory / "kv")}},
        augment={"enabled": False},
    )
    return config_file_with_knowledge_base(config, corpus_path, shared_rag.tokenizer, directory)


def test_the_command_serves_until_sigterm_then_flushes_and_exits_0(serve_config_file):
    kv_dir = Path(json.loads(serve_config_file.read_text())["cache"]["store"]["directory"])
    env = {**os.environ, "ADARAG_API_KEY": "cli-key"}
    command = [str(Path(sys.executable).parent / "adarag"), "--config", str(serve_config_file)]
    process = subprocess.Popen(
        [*command, "serve", "--port", "0", "--shutdown-grace", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        output = ""
        while not (found := re.search(r"Uvicorn running on (http://\S+)", output)):
            line = process.stdout.readline()
            assert line, f"the server ended before listening:\n{output}"
            output += line
        base_url = found.group(1) + "/v1"
        client = openai.OpenAI(base_url=base_url, api_key="cli-key", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
        stream = client.chat.completions.create(
            model="adarag",
            messages=[{"role": "user", "content": LOTHAIR_QUESTION}],
            max_tokens=16,
            stream=True,
        )
        chunks = iter(stream)
        next(chunks)
        before = set(kv_dir.rglob("*.safetensors"))  # the answers' KV is in memory only, so far
        process.send_signal(signal.SIGTERM)
        rest = list(chunks)
        assert rest[-1].choices[0].finish_reason in ("stop", "length")
        output += process.communicate(timeout=120)[0]
        assert process.returncode == 0, output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert set(kv_dir.rglob("*.safetensors")) > before, "the KV cache was not flushed at shutdown"
    assert "Traceback" not in output
