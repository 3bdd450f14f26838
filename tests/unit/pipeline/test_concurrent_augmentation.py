"""Augmenting requests from eight threads over overlapping chunks, against the same run serially.

Each stepwise request writes its chunks back between steps, outside the engine lock, while the
other threads look the same chunks up; the tiers' state changes under its own lock, which the
test suite checks on every change (``adarag.cache.state_lock.CHECK_OWNERSHIP``). The tiers are
set so that what is cached cannot change an answer (``tests/reliability/workload.py``), so every
answer must equal its serial twin, and the counters must add up to what the traces report.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from adarag import AdaRAG, Chunk, MemoryRetriever
from adarag.cache.state_lock import StateLock
from adarag.schema import Answer, GenerationParams
from tests.reliability.workload import EXACT_STORE, EXACT_TIERS, POOL, STEPWISE, tiers_of

PARAMS = GenerationParams(max_new_tokens=4)
NUM_THREADS = 8
QUESTIONS = ("what is the capital of france?", "where does the fox run?")


def _requests() -> list[tuple[str, tuple[str, ...]]]:
    """Two requests per thread, three chunks each, every chunk shared by several requests."""
    requests = []
    for idx in range(2 * NUM_THREADS):
        chunks = tuple(POOL[(idx + shift) % len(POOL)] for shift in (0, 2, 3))
        requests.append((QUESTIONS[idx % 2], chunks))
    return requests


@pytest.fixture()
def make_rag(tiny_checkpoints, tiny_config, tmp_path):
    loaded: list[AdaRAG] = []

    def make(name: str) -> AdaRAG:
        store = {**EXACT_STORE, "directory": str(tmp_path / f"kv-{name}")}
        config = tiny_config(
            tiny_checkpoints["llama"], cache={**EXACT_TIERS, "store": store}, augment=STEPWISE
        )
        engine = loaded[0].engine if loaded else None
        retriever = MemoryRetriever([Chunk(t) for t in POOL])
        rag = AdaRAG(config, retriever=retriever, loaded_engine=engine)
        loaded.append(rag)
        return rag

    return make


def _ask(rag: AdaRAG, request: tuple[str, tuple[str, ...]]) -> Answer:
    question, chunks = request
    return rag.query(question, chunks=list(chunks), params=PARAMS)


def test_eight_threads_of_augmenting_requests_answer_as_a_serial_run(make_rag):
    requests = _requests()
    serial_rag = make_rag("serial")
    serial = [_ask(serial_rag, request) for request in requests]

    rag = make_rag("threads")
    _ = rag.cache  # built before the threads start, as a server's first request would
    start = threading.Barrier(NUM_THREADS)

    def worker(hand: int) -> list[tuple[int, Answer]]:
        start.wait()
        mine = range(hand, len(requests), NUM_THREADS)
        return [(idx, _ask(rag, requests[idx])) for idx in mine]

    with ThreadPoolExecutor(NUM_THREADS) as pool:
        results = [pair for hand in pool.map(worker, range(NUM_THREADS)) for pair in hand]
    answers = [answer for _, answer in sorted(results, key=lambda pair: pair[0])]

    # every answer equals its single-threaded twin, token for token
    assert [a.text for a in answers] == [a.text for a in serial]
    assert all(len(a.trace.steps) == 3 for a in answers)

    # the counters add up to what the traces report
    stats = rag.cache.stats
    assert Counter(stats.hits) == Counter(tiers_of(answers))
    recomputed = sum(step.num_recomputed_tokens for a in answers for step in a.trace.steps)
    assert stats.num_recomputed_tokens == recomputed
    assert stats.num_prompt_tokens == serial_rag.cache.stats.num_prompt_tokens

    # every entry is readable; a hard entry (one prefix, one KV) holds what the serial run stored
    store, serial_store = rag.cache.store, serial_rag.cache.store
    keys = set(store._index.key_to_entry)
    assert keys == set(serial_store._index.key_to_entry)
    assert all(store.get(key) is not None for key in keys)
    hard_keys = {
        key
        for question, chunks in requests
        for key in rag.cache.keys(rag.prompts.layout(question, chunks).cached_segments).hard
    }
    assert hard_keys <= keys
    for key in hard_keys:
        kv, expected = store.get(key), serial_store.get(key)
        assert kv is not None and expected is not None
        torch.testing.assert_close(kv.k, expected.k, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(kv.v, expected.v, rtol=1e-4, atol=1e-5)


def test_a_change_of_the_tiers_state_without_their_lock_fails_the_debug_check(make_rag):
    cache = make_rag("unlocked").cache
    with pytest.raises(AssertionError, match="without holding its lock"):
        cache._count_tokens(10, 2)  # what record() does with the lock held
    cache.record(10, 2)
    assert (cache.stats.num_prompt_tokens, cache.stats.num_recomputed_tokens) == (10, 2)


def test_the_state_lock_knows_its_holder_across_threads():
    lock = StateLock("a test's state")
    seen: list[bool] = []
    with lock:
        assert lock.is_held()
        other = threading.Thread(target=lambda: seen.append(lock.is_held()))
        other.start()
        other.join()
        with lock:  # re-entrant
            assert lock.is_held()
        assert lock.is_held()
    assert seen == [False]
    assert not lock.is_held()
