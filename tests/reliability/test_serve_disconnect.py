"""A client that hangs up before its response starts lets go of the engine at once.

A whole (non-streamed) answer is sent only once it is complete; its client hanging up used to
leave the answer computing to its end (or to ``serve.request_timeout_s``, 300 s by default)
while the slot it held made other clients wait or get 429. Now the hang-up cancels the request:
decoding stops at the next step, the slot goes to the next request, and a request hanging up
while queued leaves the queue.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from adarag.engine import decoding
from tests.reliability.http_server import AUTH, Served, head, serving, tiny_rag

STEP_S = 0.05
MAX_TOKENS = 400  # 20 s of steps at STEP_S: far longer than a freed slot may take
FREED_WITHIN_S = 5.0


@pytest.fixture(scope="module")
def rag(tiny_checkpoints, tmp_path_factory):
    return tiny_rag(tiny_checkpoints["llama"], tmp_path_factory.mktemp("disconnect-home"))


@pytest.fixture()
def slow_steps(monkeypatch) -> list[float]:
    """Each decoding step takes STEP_S (a slow engine); the times the steps began."""
    began: list[float] = []
    sample_token = decoding.sample_token

    def slow(*args):
        began.append(time.monotonic())
        time.sleep(STEP_S)
        return sample_token(*args)

    monkeypatch.setattr(decoding, "sample_token", slow)
    return began


def long_request(route: str = "chat/completions") -> bytes:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "count to a thousand"}],
        "max_tokens": MAX_TOKENS,
        "rag": False,
    }
    if route == "completions":
        body = {"model": "m", "prompt": "1, 2, 3,", "max_tokens": MAX_TOKENS}
    data = json.dumps(body).encode()
    headers = {**AUTH, "Content-Type": "application/json", "Content-Length": str(len(data))}
    return head("POST", f"/v1/{route}", headers) + data


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until ``condition`` held; fails after ``timeout_s``."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, f"{what} did not happen in {timeout_s} s"
        time.sleep(0.02)
    return time.monotonic() - started


def open_request(served: Served, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=30)
    sock.sendall(data)
    return sock


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
def test_a_whole_answer_whose_client_hangs_up_frees_its_slot_and_stops(
    rag, slow_steps, route, ledger
):
    with serving(rag, max_active_requests=1, max_queued_requests=0) as served:
        client = open_request(served, long_request(route))
        wait_for(lambda: len(slow_steps) >= 3, 60, "decoding")
        with pytest.raises(httpx.HTTPStatusError) as busy:
            post_short(served)
        assert busy.value.response.status_code == 429  # the slot is held
        client.close()
        freed_s = wait_for(
            lambda: served.health()["active_requests"] == 0, FREED_WITHIN_S, "freeing the slot"
        )
        steps = len(slow_steps)
        time.sleep(10 * STEP_S)
        assert len(slow_steps) <= steps + 1, "decoding went on after the client left"
        assert steps < MAX_TOKENS // 2
        assert post_short(served).status_code == 200  # the slot is free for the next client
        ledger.record("HTTP: client hangs up before the response", cases=1)
        ledger.extra.setdefault("http_disconnect", {})[route] = {"slot_freed_after_s": freed_s}


def test_a_queued_request_whose_client_hangs_up_leaves_the_queue(rag, slow_steps, ledger):
    with serving(rag, max_active_requests=1, max_queued_requests=1) as served:
        holder = open_request(served, long_request())
        wait_for(lambda: len(slow_steps) >= 1, 60, "decoding")
        queued = open_request(served, long_request())
        wait_for(lambda: served.health()["queued_requests"] == 1, 10, "queueing")
        queued.close()
        wait_for(lambda: served.health()["queued_requests"] == 0, FREED_WITHIN_S, "leaving")
        # the queue has room again: a request waits there (and gets the slot) instead of 429
        outcome: list[int] = []
        waiter = threading.Thread(target=lambda: outcome.append(post_short(served).status_code))
        waiter.start()
        wait_for(lambda: served.health()["queued_requests"] == 1, 10, "queueing again")
        holder.close()
        waiter.join(timeout=60)
        assert outcome == [200]
        ledger.record("HTTP: client hangs up before the response", cases=1)


def post_short(served: Served) -> httpx.Response:
    body = {"model": "m", "prompt": "1, 2,", "max_tokens": 2}
    reply = httpx.post(f"{served.url}/v1/completions", json=body, headers=AUTH, timeout=120)
    reply.raise_for_status()
    return reply
