"""The scheduler side of adarag's vLLM connector and the KV handoff, with stand-in vLLM objects."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from adarag.engine.vllm.handoff import FusedContext, HandoffRequest, KVHandoff
from adarag.engine.vllm.scheduling import ConnectorScheduler, slot_mapping

BLOCK_SIZE = 4


@dataclass
class NewRequest:
    req_id: str
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int


@dataclass
class CachedRequests:
    req_ids: list[str] = field(default_factory=list)
    resumed_req_ids: set[str] = field(default_factory=set)
    new_block_ids: list[tuple[list[int], ...] | None] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequest] = field(default_factory=list)
    scheduled_cached_reqs: CachedRequests = field(default_factory=CachedRequests)


def params(num_context_tokens: int, handoff_id: str = "h1") -> dict:
    return HandoffRequest(handoff_id, num_context_tokens).to_params()


def test_handoff_params_round_trip():
    request = HandoffRequest("abc", 17)
    assert HandoffRequest.from_params(request.to_params()) == request
    assert HandoffRequest.from_params(None) is None
    assert HandoffRequest.from_params({"other_connector": {}}) is None


def test_plain_request_gets_no_tokens():
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    assert scheduler.num_new_matched_tokens(None, 10, 0) == 0
    assert scheduler.num_new_matched_tokens({}, 10, 0) == 0


@pytest.mark.parametrize(("num_computed", "expected"), [(0, 9), (4, 5), (8, 1), (12, 0)])
def test_matched_tokens_are_the_context_beyond_vllm_hit(num_computed, expected):
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    assert scheduler.num_new_matched_tokens(params(9), 10, num_computed) == expected


def test_matching_has_no_side_effect():
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    for _ in range(3):
        scheduler.num_new_matched_tokens(params(9), 10, 0)
    assert scheduler.take_loads(SchedulerOutput([NewRequest("r", ([0, 1, 2],), 9)])) == []


def test_the_last_prompt_token_is_never_supplied(caplog):
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    assert scheduler.num_new_matched_tokens(params(10), 10, 0) == 0
    assert "at least the last one" in caplog.text


@pytest.mark.parametrize(
    "bad",
    [
        {"adarag": {"handoff_id": "h1"}},
        {"adarag": {"handoff_id": "h", "num_context_tokens": "x"}},
        {"adarag": "h1"},
    ],
)
def test_malformed_params_fall_back_to_vllm_prefill(bad, caplog):
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    assert scheduler.num_new_matched_tokens(bad, 10, 0) == 0
    assert "malformed adarag kv_transfer_params" in caplog.text


def test_missing_fused_kv_falls_back_to_vllm_prefill(caplog):
    scheduler = ConnectorScheduler(BLOCK_SIZE, is_available=lambda handoff_id: handoff_id == "h1")
    assert scheduler.num_new_matched_tokens(params(9, "h1"), 10, 0) == 9
    assert scheduler.num_new_matched_tokens(params(9, "h2"), 10, 0) == 0
    assert "no fused KV waits under handoff h2" in caplog.text


def test_load_covers_the_external_tokens_after_vllm_hit():
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    scheduler.on_allocated("r", params(9), num_external_tokens=5)  # vLLM holds 0..3
    (load,) = scheduler.take_loads(SchedulerOutput([NewRequest("r", ([3, 7, 5],), 9)]))
    assert (load.request_id, load.handoff_id, load.start, load.end) == ("r", "h1", 4, 9)
    assert load.slot_mapping == (28, 29, 30, 31, 20)


def test_loads_are_taken_once():
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    scheduler.on_allocated("r", params(3), num_external_tokens=3)
    output = SchedulerOutput([NewRequest("r", ([2],), 3)])
    assert len(scheduler.take_loads(output)) == 1
    assert scheduler.take_loads(output) == []


def test_no_load_without_external_tokens_or_params():
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    scheduler.on_allocated("hit", params(3), num_external_tokens=0)
    scheduler.on_allocated("plain", None, num_external_tokens=0)
    output = SchedulerOutput([NewRequest("hit", ([1],), 3), NewRequest("plain", ([2],), 0)])
    assert scheduler.take_loads(output) == []


def test_finished_request_forgets_its_load():
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    scheduler.on_allocated("r", params(3), num_external_tokens=3)
    scheduler.forget("r")
    assert scheduler.take_loads(SchedulerOutput([NewRequest("r", ([1],), 3)])) == []


def test_request_resumed_after_preemption_is_loaded_again():
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    scheduler.on_allocated("r", params(6), num_external_tokens=6)
    cached = CachedRequests(["r", "other"], {"r"}, [([9, 4],), None], [6, 30])
    (load,) = scheduler.take_loads(SchedulerOutput(scheduled_cached_reqs=cached))
    assert (load.start, load.end) == (0, 6)
    assert load.slot_mapping == (36, 37, 38, 39, 16, 17)


def test_running_request_is_not_loaded_again():
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    scheduler.on_allocated("r", params(6), num_external_tokens=6)
    cached = CachedRequests(["r"], set(), [([9, 4],)], [6])
    assert scheduler.take_loads(SchedulerOutput(scheduled_cached_reqs=cached)) == []


def test_slot_mapping_needs_enough_blocks():
    assert slot_mapping([5], 0, 4, BLOCK_SIZE) == (20, 21, 22, 23)
    with pytest.raises(AssertionError, match="need 2 blocks"):
        slot_mapping([5], 0, 5, BLOCK_SIZE)


def test_handoff_counts_written_rows_until_dropped():
    handoff = KVHandoff()
    context = FusedContext(torch.zeros(2, 5, 1, 4), torch.zeros(2, 5, 1, 4))
    handoff.put("h", context)
    assert handoff.get("h") is context and len(handoff) == 1
    handoff.record_written("h", 3)
    handoff.record_written("h", 2)
    assert handoff.num_written("h") == 5
    handoff.drop("h")
    assert handoff.get("h") is None and handoff.num_written("h") == 0 and len(handoff) == 0
    handoff.record_written("h", 1)  # a late write of a dropped request is ignored
    assert handoff.num_written("h") == 0


def test_handoff_ids_are_never_reused():
    handoff = KVHandoff()
    context = FusedContext(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
    handoff.put("h", context)
    with pytest.raises(AssertionError, match="reused"):
        handoff.put("h", context)
