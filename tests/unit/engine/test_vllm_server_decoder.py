"""The front end's side of ``vllm serve`` decoding that needs no server: replica choice and the
event stream."""

from __future__ import annotations

import pytest
import torch

from adarag.engine.vllm.handoff_files import HandoffFiles
from adarag.engine.vllm.server_decoder import Replica, VLLMServerDecoder, _events
from adarag.errors import BackendError


def _decoder(tmp_path, count: int) -> VLLMServerDecoder:
    replicas = [Replica(f"http://127.0.0.1:{8000 + i}", "m") for i in range(count)]
    return VLLMServerDecoder(replicas, HandoffFiles(tmp_path), frozenset({2}), torch.float32, 5.0)


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


def _params():
    from adarag.schema import GenerationParams

    return GenerationParams(max_new_tokens=4)


def test_a_failed_hand_over_falls_back_to_the_replicas_own_prefill(tmp_path, caplog, monkeypatch):
    from types import SimpleNamespace

    decoder = _decoder(tmp_path / "handoff", 1)
    (tmp_path / "handoff").rmdir()  # the directory is gone: writing the file fails
    sent = []
    monkeypatch.setattr(decoder, "generate", lambda token_ids, params: sent.append(token_ids))
    layout = SimpleNamespace(num_tokens=3, token_ids=(7, 8, 9))
    kv = torch.zeros(1, 3, 1, 2)
    output = SimpleNamespace(kv=SimpleNamespace(length=3, k=kv, v=kv))
    decoder.decode_tokens(layout, output, _params())
    assert sent == [(7, 8, 9)] and "vLLM computes the prompt" in caplog.text
    decoder.close()
