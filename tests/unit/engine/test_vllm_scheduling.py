"""The scheduler side of adarag's vLLM connector and the KV handoff, with stand-in vLLM objects."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adarag.engine.vllm.handoff import (
    FusedContext,
    HandoffBinding,
    HandoffRequest,
    KVHandoff,
    prompt_digest,
)
from adarag.engine.vllm.scheduling import ConnectorScheduler, slot_mapping
from tests.vllm_replica import KV_TRANSFER_PARAMS

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


H1, H2 = "1" * 32, "2" * 32
PROMPT = tuple(range(100, 110))


def params(num_context_tokens: int, handoff_id: str = H1) -> dict:
    return HandoffRequest(handoff_id, num_context_tokens).to_params()


def test_handoff_params_round_trip():
    request = HandoffRequest(H1, 17)
    assert HandoffRequest.from_params(request.to_params()) == request
    assert HandoffRequest.from_params(None) is None
    assert HandoffRequest.from_params({"other_connector": {}}) is None


def test_plain_request_gets_no_tokens():
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    assert scheduler.num_new_matched_tokens(None, PROMPT, 10, 0) == 0
    assert scheduler.num_new_matched_tokens({}, PROMPT, 10, 0) == 0


@pytest.mark.parametrize(("num_computed", "expected"), [(0, 9), (4, 5), (8, 1), (12, 0)])
def test_matched_tokens_are_the_context_beyond_vllm_hit(num_computed, expected):
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    assert scheduler.num_new_matched_tokens(params(9), PROMPT, 10, num_computed) == expected


def test_matching_has_no_side_effect():
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    for _ in range(3):
        scheduler.num_new_matched_tokens(params(9), PROMPT, 10, 0)
    assert scheduler.take_loads(SchedulerOutput([NewRequest("r", ([0, 1, 2],), 9)])) == []


def test_the_last_prompt_token_is_never_supplied(caplog):
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    assert scheduler.num_new_matched_tokens(params(10), PROMPT, 10, 0) == 0
    assert "at least the last one" in caplog.text


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"adarag": {"handoff_id": H1}}, "num_context_tokens is missing"),  # no count
        ({"adarag": {"handoff_id": H1, "num_context_tokens": "9"}}, "is of type str"),
        ({"adarag": {"handoff_id": H1, "num_context_tokens": float("inf")}}, "is of type float"),
        ({"adarag": {"handoff_id": H1, "num_context_tokens": 9.0}}, "is of type float"),
        ({"adarag": {"handoff_id": H1, "num_context_tokens": True}}, "is of type bool"),
        ({"adarag": {"handoff_id": H1, "num_context_tokens": 10**400}}, "outside"),
        ({"adarag": {"handoff_id": H1, "num_context_tokens": -3}}, "outside"),
        ({"adarag": {"handoff_id": "../../etc/passwd", "num_context_tokens": 9}}, "32 lowercase"),
        ({"adarag": {"handoff_id": 7, "num_context_tokens": 9}}, "32 lowercase"),
        ({"adarag": "x"}, "entry is of type str"),
        ({"adarag": [1, 2]}, "entry is of type list"),
        ([1, 2, 3], "is of type list, not an object"),
        ("adarag", "is of type str, not an object"),
    ],
)
def test_malformed_params_fall_back_to_vllm_prefill(bad, reason, caplog):
    """Regression (issue 45): one malformed request killed the replica's engine core."""
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    assert scheduler.num_new_matched_tokens(bad, PROMPT, 10, 0) == 0
    assert "malformed adarag kv_transfer_params" in caplog.text and reason in caplog.text
    scheduler.on_allocated("r", bad, PROMPT, num_external_tokens=0)
    scheduler.on_allocated("r", bad, PROMPT, num_external_tokens=9)  # vLLM never does; no load
    assert scheduler.take_loads(SchedulerOutput([NewRequest("r", ([0, 1, 2],), 9)])) == []


@given(
    params=KV_TRANSFER_PARAMS, num_prompt_tokens=st.integers(0, 64), num_computed=st.integers(0, 64)
)
@settings(max_examples=100, deadline=None)
def test_no_kv_transfer_params_make_the_scheduler_side_raise(
    params, num_prompt_tokens, num_computed
):
    """Whatever JSON a client sends, the scheduler side answers, and claims only what it may."""
    scheduler = ConnectorScheduler(BLOCK_SIZE, check=lambda binding: None)
    prompt = tuple(range(num_prompt_tokens))
    matched = scheduler.num_new_matched_tokens(params, prompt, num_prompt_tokens, num_computed)
    assert 0 <= matched < max(num_prompt_tokens, 1)
    scheduler.on_allocated("r", params, prompt, matched)
    blocks = list(range(num_prompt_tokens // BLOCK_SIZE + 1))
    loads = scheduler.take_loads(
        SchedulerOutput([NewRequest("r", (blocks,), num_computed + matched)])
    )
    assert len(loads) == (1 if matched else 0)
    scheduler.forget("r")


def test_a_refused_hand_over_falls_back_to_vllm_prefill(caplog):
    checked = []

    def check(binding):
        checked.append(binding)
        return None if binding.handoff_id == H1 else f"no fused KV waits under handoff {H2}"

    scheduler = ConnectorScheduler(BLOCK_SIZE, check=check)
    assert scheduler.num_new_matched_tokens(params(9, H1), PROMPT, 10, 0) == 9
    assert scheduler.num_new_matched_tokens(params(9, H2), PROMPT, 10, 0) == 0
    assert f"no fused KV waits under handoff {H2}" in caplog.text
    # the binding names the request's own context tokens
    assert checked[0] == HandoffBinding(H1, prompt_digest(PROMPT[:9]), 9)


def test_a_prompt_without_token_ids_is_never_fed():
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    assert scheduler.num_new_matched_tokens(params(9), None, 10, 0) == 0


def test_load_covers_the_external_tokens_after_vllm_hit():
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    scheduler.on_allocated("r", params(9), PROMPT, num_external_tokens=5)  # vLLM holds 0..3
    (load,) = scheduler.take_loads(SchedulerOutput([NewRequest("r", ([3, 7, 5],), 9)]))
    assert (load.request_id, load.handoff_id, load.start, load.end) == ("r", H1, 4, 9)
    assert load.binding.prompt_digest == prompt_digest(PROMPT[:9])
    assert load.slot_mapping == (28, 29, 30, 31, 20)


def test_loads_are_taken_once():
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    scheduler.on_allocated("r", params(3), PROMPT, num_external_tokens=3)
    output = SchedulerOutput([NewRequest("r", ([2],), 3)])
    assert len(scheduler.take_loads(output)) == 1
    assert scheduler.take_loads(output) == []


def test_no_load_without_external_tokens_or_params():
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    scheduler.on_allocated("hit", params(3), PROMPT, num_external_tokens=0)
    scheduler.on_allocated("plain", None, PROMPT, num_external_tokens=0)
    output = SchedulerOutput([NewRequest("hit", ([1],), 3), NewRequest("plain", ([2],), 0)])
    assert scheduler.take_loads(output) == []


def test_finished_request_forgets_its_load():
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    scheduler.on_allocated("r", params(3), PROMPT, num_external_tokens=3)
    scheduler.forget("r")
    assert scheduler.take_loads(SchedulerOutput([NewRequest("r", ([1],), 3)])) == []


def test_request_resumed_after_preemption_is_loaded_again():
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    scheduler.on_allocated("r", params(6), PROMPT, num_external_tokens=6)
    cached = CachedRequests(["r", "other"], {"r"}, [([9, 4],), None], [6, 30])
    (load,) = scheduler.take_loads(SchedulerOutput(scheduled_cached_reqs=cached))
    assert (load.start, load.end) == (0, 6)
    assert load.slot_mapping == (36, 37, 38, 39, 16, 17)


def test_running_request_is_not_loaded_again():
    scheduler = ConnectorScheduler(BLOCK_SIZE)
    scheduler.on_allocated("r", params(6), PROMPT, num_external_tokens=6)
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
