"""A live ``vllm serve`` replica with adarag's connector, fed hostile requests and hand-overs.

Any client that reaches a replica may send any ``kv_transfer_params``, and whoever can write the
hand-over directory or server may plant, swap or cut a hand-over. The replica must stay up,
answer every later request, and never serve KV that is not the front end's for that request's
prompt under the shared key: a refused hand-over is computed by vLLM, so the answer equals the
one with no hand-over at all. Directory hand-overs use the session's replica; the Redis cases
start one replica reading a Valkey server.
"""

from __future__ import annotations

import json
import math
import uuid

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from safetensors.torch import load, save

from adarag.engine.prefill_request import PrefillRequest
from adarag.engine.vllm.handoff import FusedContext, HandoffBinding, HandoffRequest
from adarag.engine.vllm.handoff_files import HandoffFiles
from adarag.engine.vllm.handoff_format import HandoffSigner
from adarag.engine.vllm.handoff_redis import KEY_PREFIX, HandoffRedis
from tests.reliability.conftest import scale
from tests.unit.engine.helpers import CHUNKS, QUESTION, layout_of, load_engine
from tests.vllm_replica import (
    AUTH,
    HANDOFF_KEY,
    KV_TRANSFER_PARAMS,
    front_end_config,
    running_replica,
)

pytestmark = [pytest.mark.integration, pytest.mark.vllm]
SIGNER = HandoffSigner(HANDOFF_KEY.encode())
HEX = "0123456789abcdef" * 2
NUM_CORPUS_CASES = scale(40, 500)
ANSWER_TOKENS = 8


def _listed(prompt_length: int) -> list[object]:
    """The malformed params a review found killing a replica, and their neighbours."""
    return [
        {"adarag": {"handoff_id": HEX}},  # no count: KeyError in the engine core
        {"adarag": "x"},  # TypeError
        {"adarag": {"handoff_id": HEX, "num_context_tokens": "12"}},  # ValueError
        {"adarag": {"handoff_id": HEX, "num_context_tokens": math.inf}},  # OverflowError
        {"adarag": {"handoff_id": HEX, "num_context_tokens": math.nan}},
        {"adarag": {"handoff_id": HEX, "num_context_tokens": -(2**80)}},
        {"adarag": {"handoff_id": HEX, "num_context_tokens": 2**80}},
        {"adarag": {"handoff_id": HEX, "num_context_tokens": True}},
        {"adarag": {"handoff_id": HEX, "num_context_tokens": 12.5}},
        {"adarag": {"handoff_id": HEX, "num_context_tokens": prompt_length}},  # every token
        {"adarag": {"handoff_id": HEX, "num_context_tokens": prompt_length - 1}},  # no file
        {"adarag": {"handoff_id": "../../etc/passwd", "num_context_tokens": 4}},
        {"adarag": {"handoff_id": {"$ne": 1}, "num_context_tokens": 4}},
        {"adarag": [HEX, 4]},
        {"adarag": None},
        {"adarag": {}},
        {"adarag": {"handoff_id": HEX, "num_context_tokens": [4]}},
        {"adarag": json.loads("[" * 50 + "]" * 50)},
    ]


@pytest.fixture(scope="module")
def torch_engine(real_config):
    engine = load_engine(real_config)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prompt(torch_engine):
    return layout_of(torch_engine, QUESTION, list(CHUNKS[:2]))


@pytest.fixture(scope="module")
def plain_answer(vllm_replica, prompt):
    reply = vllm_replica.complete(prompt.token_ids, max_tokens=ANSWER_TOKENS)
    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    return reply["choices"][0]["token_ids"]


def _post(replica, prompt, params) -> httpx.Response:
    body = {
        "model": replica.model,
        "prompt": list(prompt.token_ids),
        "max_tokens": 1,
        "temperature": 0.0,
        "kv_transfer_params": params,
        "cache_salt": uuid.uuid4().hex,
    }
    # JSON as a client may send it: NaN and Infinity included
    data = json.dumps(body, allow_nan=True)
    headers = {**AUTH, "Content-Type": "application/json"}
    return httpx.post(f"{replica.url}/v1/completions", content=data, headers=headers, timeout=120)


def test_malformed_kv_transfer_params_never_stop_a_replica(
    vllm_replica, prompt, plain_answer, ledger
):
    """Regression (issue 45): one request without num_context_tokens killed the engine core."""
    statuses: list[int] = []

    def send(params: object) -> None:
        reply = _post(vllm_replica, prompt, params)
        assert reply.status_code in (200, 400), reply.text[:300]  # 400: vLLM's own validation
        statuses.append(reply.status_code)
        again = vllm_replica.complete(prompt.token_ids, max_tokens=2)
        assert again["choices"][0]["token_ids"] == plain_answer[:2]

    for params in [*_listed(prompt.num_tokens), "x", 7, [HEX, 4], True]:
        send(params)
    ledger.record("vLLM replica: malformed kv_transfer_params (listed)", cases=len(statuses))

    @settings(
        max_examples=NUM_CORPUS_CASES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(params=KV_TRANSFER_PARAMS)
    def send_generated(params: object) -> None:
        send(params)

    before = len(statuses)
    send_generated()
    num_generated = len(statuses) - before
    num_reached = statuses[before:].count(200)  # passed vLLM's checks, read by the connector
    assert num_generated >= NUM_CORPUS_CASES * 0.9  # hypothesis may skip a few duplicates
    assert num_reached >= num_generated * 0.9
    assert vllm_replica.is_alive()
    ledger.record("vLLM replica: malformed kv_transfer_params (hypothesis)", cases=num_generated)
    ledger.extra["vllm_malformed_params"] = {
        "listed": before,
        "listed_answered_200": statuses[:before].count(200),
        "generated": num_generated,
        "generated_answered_200": num_reached,
        "refused_400_by_vllm_itself": statuses.count(400),
        "replica_alive_after": True,
        "normal_request_after_each": "same tokens as the first",
    }


def _genuine(torch_engine, prompt) -> tuple[HandoffBinding, FusedContext]:
    """The full prefill's KV of every prompt token but the last, bound to a fresh id."""
    output = torch_engine.prefill(PrefillRequest(prompt, max_new_tokens=ANSWER_TOKENS))
    handoff = HandoffRequest(uuid.uuid4().hex, prompt.num_tokens - 1)
    rows = slice(0, handoff.num_context_tokens)
    context = FusedContext(output.kv.k[:, rows].contiguous(), output.kv.v[:, rows].contiguous())
    return HandoffBinding.of(handoff, prompt.token_ids), context


def _forged(data: bytes) -> bytes:
    """The hand-over with its keys negated and its genuine header (signature) kept."""
    length = int.from_bytes(data[:8], "little")
    metadata = json.loads(data[8 : 8 + length])["__metadata__"]
    tensors = load(data)
    return save({"k": (-tensors["k"]).contiguous(), "v": tensors["v"]}, metadata=metadata)


def _tampered(kind: str, genuine: bytes, other: bytes) -> bytes:
    if kind == "forged":
        return _forged(genuine)
    if kind == "swapped":  # another request's genuine hand-over under this request's id
        return other
    return genuine[: len(genuine) * 2 // 3]  # truncated


def _ask(replica, prompt, binding) -> dict:
    params = HandoffRequest(binding.handoff_id, binding.num_tokens).to_params()
    return replica.complete(prompt.token_ids, max_tokens=ANSWER_TOKENS, kv_transfer_params=params)


def _check_tampering(
    replica, handoff, raw_write, torch_engine, prompt, plain_answer, ledger, where
):
    """The genuine hand-over is used; a forged, swapped or truncated one is refused.

    Args:
        handoff: The replica's hand-over, as the front end writes it.
        raw_write: Writes bytes under a handoff id, as whoever can write the store would.
    """
    binding, context = _genuine(torch_engine, prompt)
    handoff.write(binding, context)
    reply = _ask(replica, prompt, binding)
    # the genuine hand-over is used: every context token came from the connector
    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == binding.num_tokens
    assert reply["choices"][0]["token_ids"] == plain_answer
    other = SIGNER.encode(*_genuine(torch_engine, layout_of(torch_engine, "why?", [CHUNKS[2]])))
    for kind in ("forged", "swapped", "truncated"):
        target = HandoffBinding(uuid.uuid4().hex, binding.prompt_digest, binding.num_tokens)
        genuine = SIGNER.encode(target, context)  # what the front end would write for it
        raw_write(target.handoff_id, _tampered(kind, genuine, other))
        reply = _ask(replica, prompt, target)
        served = reply["choices"][0]["token_ids"]
        ledger.record(
            f"hand-over {kind} ({where})",
            detected=int(f"handoff {target.handoff_id} is refused" in replica.log.read_text()),
            wrong_answers=int(served != plain_answer),
        )
        assert served == plain_answer
        assert replica.is_alive()
        handoff.remove(target.handoff_id)
    handoff.remove(binding.handoff_id)


def test_forged_swapped_and_truncated_files_are_refused(
    vllm_replica, torch_engine, prompt, plain_answer, ledger
):
    files = HandoffFiles(vllm_replica.handoff, SIGNER)

    def raw_write(handoff_id: str, data: bytes) -> None:
        files.path(handoff_id).write_bytes(data)

    _check_tampering(
        vllm_replica, files, raw_write, torch_engine, prompt, plain_answer, ledger, "files"
    )


@pytest.fixture(scope="module")
def redis_replica(real_config, tmp_path_factory):
    """A replica reading hand-overs from a Valkey server (replicas on other machines)."""
    from tests.remote_server import running_server, url_of

    with running_server() as valkey:
        directory = tmp_path_factory.mktemp("redis_replica")
        with running_replica(real_config, directory, url_of(valkey)) as replica:
            yield replica, valkey


def test_forged_swapped_and_truncated_redis_values_are_refused(
    redis_replica, torch_engine, prompt, plain_answer, ledger
):
    from tests.remote_server import client_of

    replica, valkey = redis_replica
    store = HandoffRedis(replica.handoff, SIGNER, 60.0)

    def raw_write(handoff_id: str, data: bytes) -> None:
        client_of(valkey).set(f"{KEY_PREFIX}{handoff_id}", data)

    _check_tampering(replica, store, raw_write, torch_engine, prompt, plain_answer, ledger, "Redis")


def test_fused_kv_handed_over_through_a_valkey_server(real_config, redis_replica, prompt):
    """Replicas on other machines: a front end hands over through the server, which it empties."""
    from tests.remote_server import client_of

    replica, valkey = redis_replica
    engine = load_engine(front_end_config(real_config, replica))
    try:
        assert engine.decoder.blending_refused is None  # the gate saw the hand-over used
        decoder = engine.decoder
        alone = list(decoder.generate(prompt.token_ids, _greedy(), uuid.uuid4().hex))
        output = engine.prefill(PrefillRequest(prompt, max_new_tokens=ANSWER_TOKENS))
        stream = engine.decode_tokens(prompt, output, _greedy())
        assert list(stream) == alone
        assert stream.num_cached_tokens == prompt.num_tokens
        assert client_of(valkey).keys(f"{KEY_PREFIX}*") == []  # deleted when done
    finally:
        engine.close()


def _greedy():
    from adarag.schema import GenerationParams

    return GenerationParams(max_new_tokens=ANSWER_TOKENS)


def test_a_replica_with_another_key_computes_every_prompt(
    vllm_replica, torch_engine, prompt, plain_answer, ledger
):
    """A hand-over signed under another key is refused at the scheduler: nothing claimed."""
    binding, context = _genuine(torch_engine, prompt)
    HandoffFiles(vllm_replica.handoff, HandoffSigner(b"another-front-end's-own-key")).write(
        binding, context
    )
    reply = _ask(vllm_replica, prompt, binding)
    refused = "signed under another key" in vllm_replica.log.read_text()
    ledger.record(
        "hand-over signed under another key (files)",
        detected=int(refused and reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 0),
        wrong_answers=int(reply["choices"][0]["token_ids"] != plain_answer),
    )
    assert refused and reply["choices"][0]["token_ids"] == plain_answer
    HandoffFiles(vllm_replica.handoff, SIGNER).remove(binding.handoff_id)
