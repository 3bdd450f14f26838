"""Resource limits: an oversized request is bounded, a cancelled stream lets go of its KV.

- A request for 10,000 chunks is refused before the retriever is asked (``retrieval.max_top_k``);
  10,000 long chunks passed in tokenize and allocate only what fits the model's context.
- A stream closed early (before its first delta, after one, from another thread in the middle of
  a step) or an ``astream`` cancelled mid-step writes its prompt's KV back, frees the prefill's KV
  while the caller still holds the stream, and leaves the engine lock free.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

import pytest

from adarag import AdaRAG, Chunk, MemoryRetriever
from adarag.errors import InputError
from adarag.schema import GenerationParams
from tests.reliability.watchdog import call_with_timeout, run_async, run_threads
from tests.unit.engine.helpers import CHUNKS, QUESTION

LONG = "the quick brown fox jumps over the lazy dog near the river. " * 3
NUM_HUGE = 10_000
STREAM_PARAMS = GenerationParams(max_new_tokens=24)


class CountingRetriever(MemoryRetriever):
    """A retriever that counts how often it is asked, and for how many chunks."""

    def __init__(self, chunks) -> None:
        super().__init__(chunks)
        self.asked: list[int] = []

    def retrieve(self, query: str, top_k: int) -> list[Chunk]:
        self.asked.append(top_k)
        return super().retrieve(query, top_k)


@pytest.fixture()
def make_rag(tiny_checkpoints, tiny_config):
    def make(retriever=None, **overrides) -> AdaRAG:
        config = tiny_config(tiny_checkpoints["llama"], **overrides)
        return AdaRAG(config, retriever=retriever or MemoryRetriever([Chunk(t) for t in CHUNKS]))

    return make


def track_prefills(monkeypatch, rag: AdaRAG) -> list[weakref.ref]:
    """Weak references to every prefill output from now on, and to its KV cache and tensors."""
    refs: list[weakref.ref] = []
    runner = rag.engine.runner
    blend = runner.blend

    def tracked(batch):
        output = blend(batch)
        refs.extend(weakref.ref(o) for o in (output, output.kv, output.kv.k, output.kv.v))
        return output

    monkeypatch.setattr(runner, "blend", tracked)
    return refs


def alive(refs: list[weakref.ref]) -> int:
    gc.collect()
    return sum(ref() is not None for ref in refs)


# --- oversized requests


def test_a_huge_top_k_is_refused_before_the_retriever_is_asked(make_rag, ledger):
    retriever = CountingRetriever([Chunk(f"{idx} {LONG}") for idx in range(200)])
    rag = make_rag(retriever)
    with pytest.raises(InputError, match="top_k is 10000, above retrieval.max_top_k=64"):
        rag.query("what does the fox do?", top_k=NUM_HUGE)
    with pytest.raises(InputError, match="max_top_k"):
        rag.retrieve("what does the fox do?", top_k=NUM_HUGE)
    assert retriever.asked == []
    # the cap is the config's, and the largest allowed top_k still answers within the context
    answer = rag.query("what does the fox do?", top_k=64, params=GenerationParams(max_new_tokens=4))
    assert retriever.asked == [64]
    assert 0 < len(answer.chunks) < 64 and answer.trace.num_dropped_chunks == 64 - len(
        answer.chunks
    )
    ledger.record("oversized request", cases=2)


def test_ten_thousand_long_chunks_tokenize_and_allocate_only_what_fits(
    make_rag, monkeypatch, ledger
):
    rag = make_rag(augment={"enabled": False})
    params = GenerationParams(max_new_tokens=4)
    tokenized: list[str] = []
    chunk_ids = rag.prompts.chunk_ids

    def counting(text: str):
        tokenized.append(text)
        return chunk_ids(text)

    monkeypatch.setattr(rag.prompts, "chunk_ids", counting)
    capacities: list[int] = []
    runner = rag.engine.runner
    new_cache = runner.new_cache

    def recording(capacity: int):
        capacities.append(capacity)
        return new_cache(capacity)

    monkeypatch.setattr(runner, "new_cache", recording)
    chunks = [f"{idx} {LONG}" for idx in range(NUM_HUGE)]
    answer = rag.query("what does the fox do?", chunks=chunks, params=params)
    kept = len(answer.chunks)
    assert 0 < kept < 10 and answer.trace.num_dropped_chunks == NUM_HUGE - kept
    assert [c.text for c in answer.chunks] == chunks[:kept]  # the best-ranked ones
    # one chunk past the last that fits is tokenized (to find it does not fit), no more
    assert tokenized == chunks[: kept + 1]
    # every KV allocated fits the model's context
    assert capacities and max(capacities) <= rag.engine.max_context_tokens
    assert answer.trace.num_prompt_tokens + params.max_new_tokens <= max(capacities)
    # a huge first chunk: tokenized once, left out, nothing after it tokenized or prefilled
    tokenized.clear()
    capacities.clear()
    huge = LONG * 2_000
    answer = rag.query("what does the fox do?", chunks=[huge, *chunks], params=params)
    assert tokenized == [huge] and capacities == []
    assert answer.chunks == () and answer.trace.stop_reason == "no_context"
    ledger.record("oversized request", cases=2)


# --- cancelled streams


def _follow_up_is_served(rag: AdaRAG, chunks: list[str]) -> None:
    """Another thread gets an answer (no lock was left held), from the written-back KV."""
    answer = call_with_timeout(
        lambda: rag.query(QUESTION, chunks=chunks, params=GenerationParams(max_new_tokens=2))
    )
    assert answer.trace.steps[-1].tiers == ("hard",) * len(chunks)


@pytest.mark.parametrize("deltas_before_close", [0, 1, 3])
def test_closing_a_stream_frees_its_kv_and_writes_it_back(
    make_rag, monkeypatch, ledger, deltas_before_close
):
    rag = make_rag(augment={"enabled": False})
    rag.query("warm up", chunks=[CHUNKS[2]], params=GenerationParams(max_new_tokens=1))
    refs = track_prefills(monkeypatch, rag)
    chunks = list(CHUNKS[:2])
    stream = rag.stream(QUESTION, chunks=chunks, params=STREAM_PARAMS)
    deltas = [next(stream) for _ in range(deltas_before_close)]
    assert alive(refs) == 4  # the prefill the stream decodes from, held while it is open
    stream.close()
    assert stream.closed and alive(refs) == 0  # freed, though the caller still holds the stream
    assert list(stream) == [] and stream.text == "".join(deltas)
    stream.close()  # idempotent
    _follow_up_is_served(rag, chunks)
    ledger.record("cancelled stream")


def test_a_stream_closed_from_another_thread_mid_step_ends_cleanly(make_rag, monkeypatch, ledger):
    """A cancel handler on another thread closes a stream whose decode step is running.

    The close waits for the step (before the fix: ``ValueError: engine already executing``,
    and the stream went on holding its KV).
    """
    rag = make_rag(augment={"enabled": False})
    refs = track_prefills(monkeypatch, rag)
    chunks = list(CHUNKS[:2])
    stream = rag.stream(QUESTION, chunks=chunks, params=STREAM_PARAMS)
    first = next(stream)
    entered, release = _gate_decode(monkeypatch, rag)
    consumer_got: list[str] = []

    def consumer() -> None:
        consumer_got.append(next(stream))

    def closer() -> None:
        assert entered.wait(60), "the decode step never started"
        release_later = threading.Timer(0.5, release.set)  # after close() is waiting
        release_later.start()
        stream.close()  # blocks until the step in flight ends
        release_later.join()

    run_threads([consumer, closer], barrier=False)
    assert len(consumer_got) == 1 and stream.closed
    assert stream.text == first + consumer_got[0]
    assert list(stream) == [] and alive(refs) == 0
    _follow_up_is_served(rag, chunks)
    ledger.record("cancelled stream")


def _gate_decode(monkeypatch, rag: AdaRAG) -> tuple[threading.Event, threading.Event]:
    """Make the next decode step wait: ``entered`` is set when it starts, ``release`` lets it go."""
    entered, release = threading.Event(), threading.Event()
    runner = rag.engine.runner
    decode = runner.decode

    def gated(token_id, kv):
        entered.set()
        assert release.wait(60), "the test never released the decode step"
        return decode(token_id, kv)

    monkeypatch.setattr(runner, "decode", gated)
    return entered, release


@pytest.mark.parametrize("how", ["cancel_mid_step", "aclose"])
def test_a_cancelled_astream_frees_its_kv_and_writes_it_back(make_rag, monkeypatch, ledger, how):
    rag = make_rag(augment={"enabled": False})
    refs = track_prefills(monkeypatch, rag)
    chunks = list(CHUNKS[:2])
    holder: list[object] = []

    async def main() -> None:
        stream = await rag.astream(QUESTION, chunks=chunks, params=STREAM_PARAMS)
        holder.append(stream)
        await anext(stream)
        if how == "aclose":
            await stream.aclose()
            return
        entered, release = _gate_decode(monkeypatch, rag)
        step = asyncio.ensure_future(anext(stream))
        await asyncio.to_thread(entered.wait, 60)  # the step is in flight in a worker thread
        step.cancel()
        with pytest.raises(asyncio.CancelledError):
            await step
        release.set()  # the step ends in its thread, then the stream closes there

    run_async(main)  # returns once the event loop's worker threads are done
    stream = holder[0]
    assert stream.stream.closed and alive(refs) == 0
    _follow_up_is_served(rag, chunks)
    ledger.record("cancelled stream")


def test_a_dropped_unfinished_stream_frees_its_kv_without_waiting_for_the_engine(
    make_rag, monkeypatch, ledger
):
    """A stream dropped mid-answer frees its KV at once, even while another request's decode
    step holds the engine lock.

    Before the fix the dropped stream's engine wrote its KV back from its ``finally`` under
    the engine lock, wherever the last reference went: dropping it blocked behind any engine
    step, and deadlocked a thread that the step was waiting for.
    """
    rag = make_rag(augment={"enabled": False})
    busy = rag.stream(QUESTION, chunks=[CHUNKS[2]], params=STREAM_PARAMS)
    next(busy)
    refs = track_prefills(monkeypatch, rag)
    holder = [rag.stream(QUESTION, chunks=list(CHUNKS[:2]), params=STREAM_PARAMS)]
    next(holder[0])
    entered, release = _gate_decode(monkeypatch, rag)
    step = threading.Thread(target=next, args=(busy,), daemon=True)
    step.start()  # the busy stream's decode step now holds the engine lock
    assert entered.wait(60), "the decode step never started"
    try:
        call_with_timeout(holder.clear, timeout_s=60)  # the last reference goes
        assert alive(refs) == 0
    finally:
        release.set()
        step.join(60)
    busy.close()
    answer = call_with_timeout(
        lambda: rag.query(QUESTION, chunks=[CHUNKS[0]], params=GenerationParams(max_new_tokens=2))
    )
    assert answer.trace.steps
    ledger.record("cancelled stream")
