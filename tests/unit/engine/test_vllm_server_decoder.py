"""The front end's side of ``vllm serve`` decoding that needs no server: replica choice and the
event stream."""

from __future__ import annotations

import pytest
import torch

from adarag.engine.vllm.fused_decoder import TokenStream
from adarag.engine.vllm.handoff_files import HandoffFiles
from adarag.engine.vllm.handoff_format import HandoffSigner
from adarag.engine.vllm.server_decoder import (
    Replica,
    ServerReport,
    VLLMServerDecoder,
    _events,
)
from adarag.errors import BackendError

SIGNER = HandoffSigner(b"a-hand-over-key-of-32-bytes-long")


def _decoder(tmp_path, count: int) -> VLLMServerDecoder:
    replicas = [Replica(f"http://127.0.0.1:{8000 + i}", "m") for i in range(count)]
    handoff = HandoffFiles(tmp_path, SIGNER)
    return VLLMServerDecoder(replicas, handoff, frozenset({2}), torch.float32, 5.0)


def test_requests_go_to_the_replica_with_fewest_open_streams(tmp_path):
    decoder = _decoder(tmp_path, 3)
    picked = [decoder._pick().url[-4:] for _ in range(3)]
    assert sorted(picked) == ["8000", "8001", "8002"]  # one each while all are busy
    decoder._done(decoder.replicas[1])
    assert decoder._pick() is decoder.replicas[1]  # the only one with a free slot
    decoder.close()


def test_ties_go_round_robin(tmp_path):
    decoder = _decoder(tmp_path, 2)
    first = decoder._pick()
    decoder._done(first)
    second = decoder._pick()
    decoder._done(second)
    assert first is not second
    decoder.close()


def test_events_end_at_done_and_skip_other_lines():
    lines = iter(
        [
            ": keep-alive",
            "",
            'data: {"choices": [{"token_ids": [5]}]}',
            "data: [DONE]",
            'data: {"x": 1}',
        ]
    )
    assert list(_events(lines)) == [{"choices": [{"token_ids": [5]}]}]


def test_an_error_event_is_a_backend_error():
    lines = iter(['data: {"error": {"message": "out of KV blocks"}}'])
    with pytest.raises(BackendError, match="out of KV blocks"):
        list(_events(lines))


def test_an_unreachable_replica_is_a_backend_error_and_nothing_is_left_behind(tmp_path):
    decoder = _decoder(tmp_path, 1)
    decoder.replicas[0].url = "http://127.0.0.1:9"  # the discard port: nothing answers
    with pytest.raises(BackendError, match="http://127.0.0.1:9 failed"):
        list(decoder.generate([1, 2, 3], _params()))
    assert decoder.replicas[0].in_flight == 0
    decoder.close()


def _params(max_new_tokens: int = 4):
    from adarag.schema import GenerationParams

    return GenerationParams(max_new_tokens=max_new_tokens)


def _prefilled(first_token: int):
    """A 3-token prompt's prefill whose logits pick ``first_token``."""
    from types import SimpleNamespace

    layout = SimpleNamespace(num_tokens=3, token_ids=(7, 8, 9))
    kv = torch.arange(12, dtype=torch.float32).reshape(1, 3, 2, 2)
    logits = torch.zeros(10)
    logits[first_token] = 1.0
    return layout, SimpleNamespace(kv=SimpleNamespace(length=3, k=kv, v=kv + 1), logits=logits)


def test_the_first_token_comes_from_the_prefill_before_anything_is_handed_over(
    tmp_path, monkeypatch
):
    decoder = _decoder(tmp_path, 1)
    sent = []

    def stream(token_ids, params, extra, handoff_id):
        (request,) = extra["kv_transfer_params"].values()
        sent.append((list(token_ids), params.max_new_tokens, request, handoff_id))
        assert decoder.handoff.path(handoff_id).exists()  # written before the request
        return TokenStream((t for t in (6, 4)), ServerReport(num_cached_tokens=3))

    monkeypatch.setattr(decoder, "_stream", stream)
    tokens = decoder.decode_tokens(*_prefilled(5), _params())
    assert next(tokens) == 5 and sent == [] and not any(tmp_path.iterdir())
    assert tokens.num_cached_tokens is None  # vLLM has not seen the prompt yet
    assert list(tokens) == [6, 4]
    ((prompt, max_new_tokens, request, handoff_id),) = sent
    # the server continues the first token: the whole prompt's KV, one token fewer to generate
    assert prompt == [7, 8, 9, 5] and max_new_tokens == 3
    assert request == {"handoff_id": handoff_id, "num_context_tokens": 3}
    assert tokens.num_cached_tokens == 3
    # the gate's count: the whole prompt was handed over, once the answer went past its first token
    assert decoder.num_handed_over(_prefilled(5)[0], 3) == 3
    assert decoder.num_handed_over(_prefilled(5)[0], 1) == 0
    decoder.close()


@pytest.mark.parametrize(("first_token", "max_new_tokens", "expected"), [(2, 4, []), (5, 1, [5])])
def test_an_answer_that_ends_at_its_first_token_never_reaches_the_server(
    tmp_path, monkeypatch, first_token, max_new_tokens, expected
):
    decoder = _decoder(tmp_path, 1)  # token 2 is EOS
    monkeypatch.setattr(decoder, "_stream", lambda *args: pytest.fail("sent to the server"))
    tokens = decoder.decode_tokens(*_prefilled(first_token), _params(max_new_tokens))
    assert list(tokens) == expected and not any(tmp_path.iterdir())
    decoder.close()


def test_a_failed_hand_over_falls_back_to_the_replicas_own_prefill(tmp_path, caplog, monkeypatch):
    decoder = _decoder(tmp_path / "handoff", 1)
    (tmp_path / "handoff").rmdir()  # the directory is gone: writing the file fails
    sent = []

    def generate(token_ids, params):
        sent.append(list(token_ids))
        return TokenStream((t for t in (6,)), ServerReport())

    monkeypatch.setattr(decoder, "generate", generate)
    assert list(decoder.decode_tokens(*_prefilled(5), _params())) == [5, 6]
    assert sent == [[7, 8, 9, 5]] and "vLLM computes the prompt" in caplog.text
    decoder.close()
