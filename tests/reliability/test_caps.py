"""Byte caps hold under churn, eviction never pulls an entry from under a reader, and two
processes sharing one KV directory never damage each other's entries."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

from adarag.cache.disk import STAGING_PREFIX, SUFFIX
from tests.reliability.churn import churn, entry_for, is_intact, open_store
from tests.reliability.conftest import scale

MEMORY_CAP = 30_000  # a few entries (an entry is 1-8 KB)
DISK_CAP = 120_000
REPO = Path(__file__).resolve().parents[2]


def _bytes_on_disk(directory: Path) -> int:
    """Apparent size of every file in the directory (entries and staging files), like du -b."""
    total = 0
    for entry in os.scandir(directory):
        try:
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            continue  # renamed or removed while we looked
    return total


def _resident_bytes(store) -> int:
    """Bytes of the tensors the memory tier holds, counted from its index."""
    return sum(e.stored.nbytes for e in store._index.entries.values() if e.stored is not None)


def test_caps_hold_at_every_step_of_a_churn(tmp_path, ledger):
    directory = tmp_path / "kv"
    store = open_store(directory, MEMORY_CAP, DISK_CAP)
    num_ops = scale(2_000, 20_000)
    peak_memory = peak_disk = 0
    for step in range(num_ops // 100):
        churn(store, seed=step, num_ops=100, num_keys=400)
        stats = store.snapshot()
        assert stats.memory_bytes == _resident_bytes(store) <= MEMORY_CAP
        on_disk = _bytes_on_disk(directory)
        assert stats.disk_bytes == on_disk <= DISK_CAP
        peak_memory, peak_disk = max(peak_memory, stats.memory_bytes), max(peak_disk, on_disk)
    stats = store.snapshot()
    assert stats.memory_evictions > 100 and stats.disk_evictions > 100
    ledger.record("caps under churn (store operations)", cases=num_ops)
    ledger.extra["caps"] = {
        "operations": num_ops,
        "memory_cap": MEMORY_CAP,
        "peak_memory_bytes": peak_memory,
        "disk_cap": DISK_CAP,
        "peak_disk_bytes_du": peak_disk,
        "memory_evictions": stats.memory_evictions,
        "disk_evictions": stats.disk_evictions,
    }


def test_the_disk_cap_holds_while_writes_are_in_flight(tmp_path):
    """A sampler measures the directory (staging files included) while four threads churn."""
    directory = tmp_path / "kv"
    store = open_store(directory, memory_bytes=0, disk_bytes=DISK_CAP)  # every put goes to disk
    done = threading.Event()
    samples: list[int] = []

    def sample() -> None:
        while not done.is_set():
            samples.append(_bytes_on_disk(directory))

    sampler = threading.Thread(target=sample)
    sampler.start()
    workers = [
        threading.Thread(target=churn, args=(store, seed, scale(300, 3_000), 200))
        for seed in range(4)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    done.set()
    sampler.join()
    assert len(samples) > 10
    # Room is made before a file is staged, so the directory never holds more than the cap.
    assert max(samples) <= DISK_CAP


def test_eviction_never_takes_an_entry_from_a_reader(tmp_path, ledger):
    store = open_store(tmp_path / "kv", MEMORY_CAP, DISK_CAP)
    errors: list[str] = []
    held = []

    def reader(seed: int) -> None:
        for step in range(scale(400, 4_000)):
            key = f"key-{(seed * 7 + step) % 300}"
            kv = store.get(key)
            if kv is None:
                store.put([key], entry_for(key))
                continue
            held.append((key, kv))  # keep reading it after the churn evicted it
            if not is_intact(key, kv):
                errors.append(f"{key} read wrong")

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(6)]
    threads.append(threading.Thread(target=churn, args=(store, 99, scale(2_000, 20_000), 300)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.snapshot().memory_evictions > 0
    broken = [key for key, kv in held if not is_intact(key, kv)]
    ledger.record("eviction under concurrent readers", cases=len(held), wrong_answers=len(broken))
    assert errors == [] and broken == []


def test_two_processes_on_one_kv_directory_never_damage_entries(tmp_path, caplog, ledger):
    directory = tmp_path / "kv"
    num_ops = scale(1_500, 15_000)
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.reliability.churn",
                str(directory),
                str(seed),
                str(num_ops),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    results = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
        assert "corrupted" not in err, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(result["wrong"] == 0 for result in results)
    assert all(result["hits"] > 0 for result in results)
    assert not list(directory.glob(f"{STAGING_PREFIX}*"))
    with caplog.at_level(logging.WARNING):
        store = open_store(directory, MEMORY_CAP, 10**9)
        files = list(directory.glob(f"*{SUFFIX}"))
        intact = 0
        for header in store.disk.scan():
            stored = store.disk.read(header.entry_id)
            kv = None if stored is None else store.codec.decode(stored)
            assert kv is not None and is_intact(header.keys[0], kv)
            intact += 1
    assert "KV cache file" not in caplog.text
    assert intact == len(files) > 0
    ledger.record(
        "two processes on one KV directory (reads)",
        cases=sum(result["hits"] for result in results) + intact,
        wrong_answers=sum(result["wrong"] for result in results),
    )
