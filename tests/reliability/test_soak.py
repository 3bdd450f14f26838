"""A bounded soak: mixed requests from 8 threads and an event loop on one small-capped AdaRAG.

Queries, streams read to the end, streams closed after a delta or two, ``aquery``, ``astream``
cancelled mid-step, ``warm`` and :meth:`AdaRAG.with_config` variants run at once on a pipeline
whose memory tier holds a few chunks and whose disk tier a dozen, so entries are evicted, spilled
and read back while requests interleave. A watchdog fails the test on a deadlock. Every completed
answer must equal the same request's answer in a serial run (a cancelled one: be a prefix of it);
see ``tests/reliability/workload.py`` for why the cache's state cannot change an answer.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from adarag import AdaRAG, Chunk, MemoryRetriever
from adarag.cache.disk import SUFFIX
from adarag.schema import GenerationParams
from tests.reliability.conftest import scale
from tests.reliability.watchdog import call_with_timeout, run_threads
from tests.reliability.workload import (
    EXACT_STORE,
    EXACT_TIERS,
    INDEPENDENT_CHUNKS,
    POOL,
    STEPWISE,
    Request,
    deal,
    seed,
    workload,
)

PARAMS = GenerationParams(max_new_tokens=6)
NUM_THREADS = 8
NUM_TASKS = 4
MEMORY_CAP = 64 * 1024  # a few chunks' KV (tiny llama: 512 bytes a token)
DISK_CAP = 256 * 1024  # about a dozen
SYNC_KINDS = ("query", "stream", "stream_cancelled", "warm", "variant_static", "variant_terse")
ASYNC_KINDS = ("aquery", "astream", "astream_cancelled")
VARIANTS = {
    "variant_static": {"augment": {"enabled": False}},
    "variant_terse": {"prompt": {"system_prompt": "Answer in one word."}},
}


@dataclass(frozen=True)
class Job:
    """One soak request: what to do, and with which question."""

    kind: str
    request: Request
    stop_after: int = 1  # deltas read before a cancelled stream is closed

    @property
    def variant(self) -> dict | None:
        return VARIANTS.get(self.kind)

    @property
    def cancelled(self) -> bool:
        return self.kind.endswith("_cancelled")


def jobs(count: int) -> list[Job]:
    """``count`` jobs over the shared workload, about a third of them for the event loop."""
    rng = random.Random(7)
    made = []
    for request in workload(seed_value=7, count=count):
        kinds = ASYNC_KINDS if rng.random() < 0.3 else SYNC_KINDS
        made.append(Job(rng.choice(kinds), request, rng.randint(1, 2)))
    return made


def make_pipeline(tiny_checkpoints, tiny_config, directory: Path, engine=None) -> AdaRAG:
    store = {
        **EXACT_STORE,
        "directory": str(directory),
        "memory_capacity_bytes": MEMORY_CAP,
        "disk_capacity_bytes": DISK_CAP,
    }
    config = tiny_config(
        tiny_checkpoints["llama"], cache={**EXACT_TIERS, "store": store}, augment=STEPWISE
    )
    retriever = MemoryRetriever([Chunk(text) for text in POOL])
    return AdaRAG(config, retriever=retriever, loaded_engine=engine)


def full_text(rag: AdaRAG, job: Job) -> str:
    """The serial run's answer text of ``job`` (unstripped, as streamed)."""
    target = rag.with_config(**job.variant) if job.variant else rag
    request = job.request
    chunks = list(request.chunks) if request.chunks is not None else None
    stream = target.stream(request.question, chunks=chunks, params=PARAMS, top_k=request.top_k)
    return "".join(stream)


def test_soak(tiny_checkpoints, tiny_config, tmp_path: Path, ledger):
    all_jobs = jobs(scale(40, 200))
    serial = make_pipeline(tiny_checkpoints, tiny_config, tmp_path / "kv-serial")
    seed(serial, PARAMS)
    expected = [None if job.kind == "warm" else full_text(serial, job) for job in all_jobs]

    rag = make_pipeline(tiny_checkpoints, tiny_config, tmp_path / "kv-soak", serial.engine)
    seed(rag, PARAMS)
    got: list[str | None] = [None] * len(all_jobs)
    finished = [False] * len(all_jobs)
    peaks = {"memory": 0, "disk": 0}
    peaks_lock = threading.Lock()
    cancelled_streams = []
    cancelled_mid_step: list[int] = []

    def note_sizes() -> None:
        store = rag.cache_stats().store
        with peaks_lock:
            peaks["memory"] = max(peaks["memory"], store.memory_bytes)
            peaks["disk"] = max(peaks["disk"], store.disk_bytes)

    def run_sync(idx: int) -> None:
        job = all_jobs[idx]
        request = job.request
        chunks = list(request.chunks) if request.chunks is not None else None
        if job.kind == "warm":
            rag.warm([*(request.chunks or POOL[:2]), INDEPENDENT_CHUNKS[0]])
        elif job.kind in ("query", *VARIANTS):
            target = rag.with_config(**job.variant) if job.variant else rag
            answer = target.query(
                request.question, chunks=chunks, params=PARAMS, top_k=request.top_k
            )
            got[idx] = answer.text
        else:
            stream = rag.stream(request.question, chunks=chunks, params=PARAMS, top_k=request.top_k)
            if job.cancelled:
                list(itertools.islice(stream, job.stop_after))
                stream.close()
                cancelled_streams.append(stream)
                got[idx] = stream.text
            else:
                got[idx] = stream.answer().text
        finished[idx] = True
        note_sizes()

    async def run_async(idx: int) -> None:
        job = all_jobs[idx]
        request = job.request
        chunks = list(request.chunks) if request.chunks is not None else None
        if job.kind == "aquery":
            answer = await rag.aquery(
                request.question, chunks=chunks, params=PARAMS, top_k=request.top_k
            )
            got[idx] = answer.text
        else:
            stream = await rag.astream(
                request.question, chunks=chunks, params=PARAMS, top_k=request.top_k
            )
            if job.cancelled:
                for _ in range(job.stop_after - 1):
                    await anext(stream, None)
                step = asyncio.ensure_future(anext(stream, None))
                await asyncio.sleep(0)  # the step is in flight in a worker thread
                step.cancel()  # the step ends there, then the stream closes itself
                try:
                    await step
                except asyncio.CancelledError:
                    cancelled_mid_step.append(idx)
                else:
                    await stream.aclose()  # the step had ended before the cancel landed
                cancelled_streams.append(stream.stream)
                got[idx] = stream.stream.text
            else:
                got[idx] = (await stream.answer()).text
        finished[idx] = True
        await asyncio.to_thread(note_sizes)

    sync_jobs = [i for i, job in enumerate(all_jobs) if job.kind in SYNC_KINDS]
    async_jobs = [i for i, job in enumerate(all_jobs) if job.kind in ASYNC_KINDS]

    def thread_worker(indices: list[int]) -> None:
        for idx in indices:
            run_sync(idx)

    async def event_loop() -> None:
        async def task(indices: list[int]) -> None:
            for idx in indices:
                await run_async(idx)

        hands = deal(async_jobs, NUM_TASKS)
        await asyncio.gather(*(task([async_jobs[i] for i in hand]) for hand in hands))

    workers = [
        lambda hand=hand: thread_worker([sync_jobs[i] for i in hand])
        for hand in deal(sync_jobs, NUM_THREADS)
    ]
    workers.append(lambda: asyncio.run(event_loop()))
    started = time.perf_counter()
    run_threads(workers)  # raises the first error; fails the test on a deadlock
    duration = time.perf_counter() - started

    differing = 0
    for job, text, reference in zip(all_jobs, got, expected, strict=True):
        if job.kind == "warm":
            continue
        assert text is not None and reference is not None
        same = reference.startswith(text) if job.cancelled else text == reference.strip()
        differing += not same
    stats = rag.cache_stats().store
    on_disk = sum(path.stat().st_size for path in rag.kv_directory.glob(f"*{SUFFIX}"))
    answered = sum(1 for job in all_jobs if job.kind != "warm")
    ledger.extra["soak"] = {
        "queries": len(all_jobs),
        "answers_compared": answered,
        "threads": NUM_THREADS,
        "async_tasks": NUM_TASKS,
        "kinds": {kind: sum(j.kind == kind for j in all_jobs) for kind in SYNC_KINDS + ASYNC_KINDS},
        "duration_s": round(duration, 2),
        "errors": 0,
        "answers_differing_from_serial": differing,
        "streams_cancelled": len(cancelled_streams),
        "astreams_cancelled_mid_step": len(cancelled_mid_step),
        "memory_evictions": stats.memory_evictions,
        "disk_evictions": stats.disk_evictions,
        "disk_reads": stats.disk_reads,
        "memory_cap_bytes": MEMORY_CAP,
        "disk_cap_bytes": DISK_CAP,
        "peak_memory_bytes": peaks["memory"],
        "peak_disk_bytes": peaks["disk"],
        "model": "tiny-llama (random weights)",
    }
    ledger.record("concurrent requests", cases=answered, wrong_answers=differing)

    assert all(finished)
    assert differing == 0
    assert all(stream.closed for stream in cancelled_streams)
    assert len(cancelled_streams) == sum(job.cancelled for job in all_jobs) > 0
    # eviction happened during the soak, and neither tier ever went past its cap
    assert stats.memory_evictions > 0 and stats.disk_evictions > 0
    assert peaks["memory"] <= MEMORY_CAP and peaks["disk"] <= DISK_CAP
    assert stats.memory_bytes <= MEMORY_CAP and stats.disk_bytes <= DISK_CAP
    assert on_disk == stats.disk_bytes
    # and the pipeline still answers (no lock left held)
    question = all_jobs[0].request.question
    follow_up = call_with_timeout(lambda: rag.query(question, chunks=[POOL[0]], params=PARAMS))
    assert follow_up.text == serial.query(question, chunks=[POOL[0]], params=PARAMS).text
