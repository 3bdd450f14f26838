"""Concurrent requests on one AdaRAG answer exactly as the same requests asked one by one.

``AdaRAG`` serialises engine work (each prefill, each decode step) with one lock, so concurrent
requests interleave step by step; their cache lookups and write-backs run outside it, under the
tiers' and the store's own locks, and interleave too. The cache tiers are set so that what is
cached when a request runs cannot change its answer (see ``tests/reliability/workload.py``): any
difference from the serial run is a concurrency bug, not a cache effect.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path

import pytest
import torch

from adarag import AdaRAG, Chunk, MemoryRetriever
from adarag.pipeline import resources as resources_module
from adarag.schema import GenerationParams
from tests.reliability.watchdog import call_with_timeout, run_async, run_threads
from tests.reliability.workload import (
    EXACT_STORE,
    EXACT_TIERS,
    POOL,
    STEPWISE,
    Request,
    Result,
    ask,
    deal,
    designed_requests,
    seed,
    tiers_of,
    workload,
)

PARAMS = GenerationParams(max_new_tokens=6)
NUM_THREADS = 16
NUM_TASKS = 4


@pytest.fixture()
def make_rag(tiny_checkpoints, tiny_config, tmp_path: Path):
    """Pipelines over the tiny llama, each with its own store, sharing one loaded engine."""
    loaded: list[AdaRAG] = []

    def make(name: str, **overrides) -> AdaRAG:
        cache = {**EXACT_TIERS, "store": {**EXACT_STORE, "directory": str(tmp_path / f"kv-{name}")}}
        config = tiny_config(tiny_checkpoints["llama"], cache=cache, augment=STEPWISE, **overrides)
        engine = loaded[0].engine if loaded else None
        rag = AdaRAG(
            config, retriever=MemoryRetriever([Chunk(t) for t in POOL]), loaded_engine=engine
        )
        loaded.append(rag)
        return rag

    return make


def serial_results(rag: AdaRAG, requests: list[Request]) -> list[Result]:
    """The reference: the seed, then every request one by one."""
    seed(rag, PARAMS)
    return [Result.of(ask(rag, request, PARAMS)) for request in requests]


def check_accounting(rag: AdaRAG, before: Counter[str], answers) -> None:
    """The tiers' hit counts since ``before`` are exactly the lookups the answers report."""
    hits = rag.cache_stats().tiers.hits.copy()
    hits.subtract(before)
    assert +hits == Counter(tiers_of(answers))


def check_designed_tiers(requests: list[Request], answers) -> None:
    """The designed requests' last chunks hit their tiers (whatever ran before them)."""
    expected = dict(designed_requests())
    seen = 0
    for request, answer in zip(requests, answers, strict=True):
        if request in expected:
            assert answer.trace.steps[-1].tiers[-1] == expected[request], request
            assert all(t == "hard" for s in answer.trace.steps[1:] for t in s.tiers[:-1])
            seen += 1
    assert seen == len(expected)


def test_first_requests_on_a_fresh_pipeline_share_one_cache(make_rag, monkeypatch, ledger):
    """16 first requests at once open one cache and one store, and every lookup is counted.

    Opening the cache is slowed down (as a cold disk would) so that the requests all find it
    unopened: before the fix each opened its own, and the entries and counts of all but the
    last were lost.
    """
    opened: list[object] = []

    class SlowToOpen(resources_module.TieredCache):
        def __init__(self, *args, **kwargs) -> None:
            threading.Event().wait(0.05)
            super().__init__(*args, **kwargs)
            opened.append(self)

    monkeypatch.setattr(resources_module, "TieredCache", SlowToOpen)
    assert make_rag("warm-up").engine  # the model loads before the requests race
    rag = make_rag("fresh")
    requests = workload(seed_value=1, count=NUM_THREADS)
    answers = run_threads([lambda r=r: ask(rag, r, PARAMS) for r in requests])
    assert len(opened) == 1
    check_accounting(rag, Counter(), answers)
    # every write-back reached the store the pipeline reads: asked again, each chunk is a hard hit
    for request, first in zip(requests, answers, strict=True):
        again = ask(rag, request, PARAMS)
        assert again.trace.steps[-1].tiers == ("hard",) * len(first.chunks)
        assert Result.of(again) == Result.of(first)
    ledger.record("concurrent requests", cases=len(requests))


def _serial_and_seeded(make_rag, name, seed_value, count):
    """A workload, its serial answers, and a seeded pipeline with its hit counts before."""
    requests = workload(seed_value=seed_value, count=count)
    expected = serial_results(make_rag("serial"), requests)
    rag = make_rag(name)
    seed(rag, PARAMS)
    return requests, expected, rag, rag.cache_stats().tiers.hits.copy()


def _check_against_serial(rag, before, requests, answers, expected, ledger):
    """Concurrent answers equal the serial ones; the cache's accounting and tiers add up."""
    got = [Result.of(answer) for answer in answers]
    differing = sum(g != e for g, e in zip(got, expected, strict=True))
    ledger.record("concurrent requests", cases=len(requests), wrong_answers=differing)
    assert got == expected
    check_accounting(rag, before, answers)
    check_designed_tiers(requests, answers)


def test_sixteen_threads_answer_as_a_serial_run(make_rag, ledger):
    """16 threads, queries and full streams mixed, on one pipeline: the serial run's answers.

    Hard, soft and independent hits and write-backs interleave: the seed caches a prompt and
    warms chunks, the designed requests hit each tier whatever the order, and the random ones
    (several asked twice, maybe at once) share chunks and prefixes.
    """
    requests, expected, rag, before = _serial_and_seeded(make_rag, "threads", 2, NUM_THREADS * 3)
    answers: list[object] = [None] * len(requests)

    def worker(indices: list[int]) -> None:
        for idx in indices:
            answers[idx] = ask(rag, requests[idx], PARAMS, stream=idx % 2 == 1)

    run_threads([lambda h=h: worker(h) for h in deal(requests, NUM_THREADS)])
    _check_against_serial(rag, before, requests, answers, expected, ledger)
    hits = Counter(tiers_of(answers))
    assert hits["hard"] and hits["soft"] and hits["independent"]


def test_four_asyncio_tasks_answer_as_a_serial_run(make_rag, ledger):
    """4 tasks on one event loop, ``aquery`` and ``astream`` mixed: the serial run's answers."""
    requests, expected, rag, before = _serial_and_seeded(make_rag, "async", 3, NUM_TASKS * 5)
    answers: list[object] = [None] * len(requests)

    async def one(idx: int) -> None:
        request = requests[idx]
        chunks = list(request.chunks) if request.chunks is not None else None
        if idx % 2 == 0:
            answers[idx] = await rag.aquery(
                request.question, chunks=chunks, params=PARAMS, top_k=request.top_k
            )
            return
        stream = await rag.astream(
            request.question, chunks=chunks, params=PARAMS, top_k=request.top_k
        )
        text = "".join([delta async for delta in stream])
        answers[idx] = await stream.answer()
        assert answers[idx].text == text.strip()

    async def task(indices: list[int]) -> None:
        for idx in indices:
            await one(idx)

    async def main() -> None:
        await asyncio.gather(*(task(hand) for hand in deal(requests, NUM_TASKS)))

    run_async(main)
    _check_against_serial(rag, before, requests, answers, expected, ledger)


REAL_CHUNKS = (
    "Paris is the capital and largest city of France.",
    "Berlin is the capital of Germany and lies on the river Spree.",
    "Mount Everest is the highest mountain above sea level, in the Himalayas.",
    "The Nile is a major river in northeastern Africa, flowing into the Mediterranean.",
    "Water boils at 100 degrees Celsius at sea level.",
    "The Pacific is the largest and deepest of Earth's oceans.",
)
REAL_QUESTIONS = (
    "What is the capital of France?",
    "Which river does Berlin lie on?",
    "What is the highest mountain?",
    "Where does the Nile flow?",
    "At what temperature does water boil?",
    "Which ocean is the largest?",
)


@pytest.fixture()
def one_torch_thread():
    """One intra-op thread for the test: on a small shared machine torch's pool of two runs the
    real model several times slower than one (its barrier waits for a descheduled thread)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.integration
@pytest.mark.usefixtures("one_torch_thread")
def test_sixteen_threads_on_the_real_model_answer_as_a_serial_run(real_config, tmp_path, ledger):
    """SmolLM2, 16 threads, one request each: the serial run's answers.

    Every chunk is warmed first; each request pairs two chunks in an order no other request
    uses, so its tiers are fixed (its first chunk a hard hit on the warmed KV, its second an
    independent hit) and the real model's prefills are the same computation in both runs.
    """
    params = GenerationParams(max_new_tokens=8)
    pairs = [(a, b) for a in range(len(REAL_CHUNKS)) for b in range(len(REAL_CHUNKS)) if a != b]
    requests = [
        Request(REAL_QUESTIONS[a], (REAL_CHUNKS[a], REAL_CHUNKS[b]))
        for a, b in pairs[:: len(pairs) // NUM_THREADS][:NUM_THREADS]
    ]
    assert len(set(requests)) == NUM_THREADS

    def make(name: str, engine=None) -> AdaRAG:
        cache = {**EXACT_TIERS, "store": {**EXACT_STORE, "directory": str(tmp_path / name)}}
        rag = AdaRAG(real_config, loaded_engine=engine, cache=cache, augment={"enabled": False})
        rag.warm(REAL_CHUNKS)
        return rag

    def serial_run() -> tuple[AdaRAG, list[Result]]:
        serial = make("serial")
        return serial, [Result.of(ask(serial, request, params)) for request in requests]

    serial, expected = call_with_timeout(serial_run)
    rag = call_with_timeout(lambda: make("threads", serial.engine))
    answers = run_threads([lambda r=r: ask(rag, r, params) for r in requests])
    got = [Result.of(answer) for answer in answers]
    differing = sum(g != e for g, e in zip(got, expected, strict=True))
    ledger.record("concurrent requests (real model)", cases=len(requests), wrong_answers=differing)
    assert got == expected
    assert all(a.trace.steps[-1].tiers == ("hard", "independent") for a in answers)
    assert len({r.text for r in got}) > 1  # not one canned answer
