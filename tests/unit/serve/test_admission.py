"""Server admission (active slots, the bounded queue, deadlines, shutdown) and chat bodies."""

from __future__ import annotations

import asyncio
import threading

import pytest

from adarag.pipeline.answer_stream import NO_CONTEXT_ANSWER
from adarag.serve.errors import QueueFullError, RequestTimeoutError, ShuttingDownError
from adarag.serve.protocol import ChatCompletionRequest
from adarag.serve.scheduler import EngineSlots, EngineWorker


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=30))


def far(loop_time_s: float = 60.0) -> float:
    return asyncio.get_running_loop().time() + loop_time_s


def test_slots_are_handed_over_in_arrival_order_and_the_queue_is_bounded():
    async def scenario() -> list[int]:
        slots = EngineSlots(max_active=1, max_queued=2)
        first = await slots.acquire(far(), 60)
        order: list[int] = []

        async def wait(idx: int) -> None:
            slot = await slots.acquire(far(), 60)
            order.append(idx)
            await asyncio.sleep(0)
            slot.release()

        waiting = [asyncio.create_task(wait(idx)) for idx in range(2)]
        await asyncio.sleep(0)
        assert slots.num_active == 1 and slots.num_queued == 2
        with pytest.raises(QueueFullError):
            await slots.acquire(far(), 60)
        first.release()
        await asyncio.gather(*waiting)
        assert slots.num_active == 0 and slots.num_queued == 0
        return order

    assert run(scenario()) == [0, 1]


def test_a_request_waiting_past_its_deadline_leaves_the_queue():
    async def scenario() -> None:
        slots = EngineSlots(max_active=1, max_queued=1)
        held = await slots.acquire(far(), 60)
        with pytest.raises(RequestTimeoutError):
            await slots.acquire(far(0.05), 0.05)
        assert slots.num_queued == 0
        held.release()
        assert slots.num_active == 0  # the slot was not handed to the request that gave up

    run(scenario())


def test_closing_refuses_waiting_and_new_requests_with_503():
    async def scenario() -> None:
        slots = EngineSlots(max_active=1, max_queued=4)
        held = await slots.acquire(far(), 60)
        waiting = asyncio.create_task(slots.acquire(far(), 60))
        await asyncio.sleep(0)
        assert slots.close() == 1
        with pytest.raises(ShuttingDownError):
            await waiting
        with pytest.raises(ShuttingDownError):
            await slots.acquire(far(), 60)
        held.release()
        await asyncio.wait_for(slots.wait_idle(), 1)

    run(scenario())


def test_a_slot_is_held_until_the_engine_work_under_it_ends():
    async def scenario() -> None:
        slots = EngineSlots(max_active=1, max_queued=0)
        worker = EngineWorker(max_active=1, timeout_s=0.05)
        step_may_end = threading.Event()
        slot = await slots.acquire(far(), 60)
        with pytest.raises(RequestTimeoutError):  # the request stops waiting ...
            await worker.call(slot, far(0.05), "streaming", step_may_end.wait, 10)
        slot.release()
        assert slots.num_active == 1  # ... but the step is still running in its thread
        step_may_end.set()
        await asyncio.wait_for(slots.wait_idle(), 5)
        assert slots.num_active == 0
        worker.shutdown()

    run(scenario())


def _chat(*messages: tuple[str, str]) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="m", messages=[{"role": role, "content": text} for role, text in messages]
    )


def test_earlier_answered_messages_become_the_history():
    request = _chat(
        ("system", "Be brief."),
        ("user", "q1"),
        ("assistant", "a1"),
        ("user", "unanswered"),
        ("user", "q2"),
        ("assistant", NO_CONTEXT_ANSWER),
        ("user", "q3"),
        ("assistant", "a3"),
        ("user", "now?"),
    )
    question, history = request.conversation(history_turns=2)
    assert question == "now?"
    assert history == [("q1", "a1"), ("q3", "a3")]  # the no-context turn is not carried
    assert request.conversation(history_turns=1)[1] == [("q3", "a3")]
    assert request.conversation(history_turns=0)[1] == []


def test_text_parts_are_joined_and_the_last_message_must_be_the_users():
    request = ChatCompletionRequest(
        model="m",
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ],
    )
    assert request.conversation(2) == ("ab", [])
    with pytest.raises(ValueError, match="last message must be the user's"):
        _chat(("user", "q"), ("assistant", "a")).conversation(2)


def test_system_and_developer_messages_are_the_instruction():
    request = _chat(
        ("system", "Always answer in French."),
        ("user", "q1"),
        ("assistant", "a1"),
        ("developer", "Be brief."),
        ("user", "now?"),
    )
    assert request.instruction() == "Always answer in French.\nBe brief."
    assert request.conversation(history_turns=2) == ("now?", [("q1", "a1")])
    assert _chat(("user", "q")).instruction() == ""
    assert _chat(("system", "  "), ("user", "q")).instruction() == ""
