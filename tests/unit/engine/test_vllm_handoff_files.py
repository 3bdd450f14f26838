"""The shared-directory hand-over of fused KV to ``vllm serve`` workers, and the rank split."""

from __future__ import annotations

import logging
import os
import time
import uuid

import pytest
import torch

from adarag.engine.vllm.handoff import FusedContext
from adarag.engine.vllm.handoff_files import HandoffFiles, as_storage
from adarag.engine.vllm.ranks import kv_heads_of_rank
from adarag.errors import ConfigError


def _context(num_heads: int = 4) -> FusedContext:
    generator = torch.Generator().manual_seed(0)
    k = torch.randn(3, 5, num_heads, 8, generator=generator)
    return FusedContext(k, k * 2 + 1)


def test_round_trip_is_exact(tmp_path):
    files, handoff_id, context = HandoffFiles(tmp_path), uuid.uuid4().hex, _context()
    files.write(handoff_id, context)
    assert files.exists(handoff_id)
    read = files.read(handoff_id)
    assert read is not None
    assert torch.equal(read.k, context.k) and torch.equal(read.v, context.v)
    assert [p.name for p in tmp_path.iterdir()] == [files.path(handoff_id).name]  # no temp left


def test_a_rank_reads_only_its_heads(tmp_path):
    files, handoff_id, context = HandoffFiles(tmp_path), uuid.uuid4().hex, _context(4)
    files.write(handoff_id, context)
    read = files.read(handoff_id, range(2, 4))
    assert read is not None
    assert torch.equal(read.k, context.k[:, :, 2:4]) and torch.equal(read.v, context.v[:, :, 2:4])


@pytest.mark.parametrize("bad", ["../etc/passwd", "ABC", "0" * 31, "0" * 32 + "/x", ""])
def test_handoff_ids_never_name_a_path(tmp_path, bad):
    files = HandoffFiles(tmp_path)
    assert not files.exists(bad)
    with pytest.raises(ValueError, match="32 lowercase hex digits"):
        files.path(bad)


def test_missing_and_damaged_files_read_as_none_with_the_reason(tmp_path, caplog):
    files = HandoffFiles(tmp_path)
    caplog.set_level(logging.WARNING)
    missing = uuid.uuid4().hex
    assert files.read(missing) is None
    assert f"no fused KV under handoff {missing}" in caplog.text
    damaged = uuid.uuid4().hex
    files.path(damaged).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    assert files.read(damaged) is None
    assert f"fused KV under handoff {damaged} is unreadable" in caplog.text
    files.write(missing, _context())
    data = bytearray(files.path(missing).read_bytes())
    files.path(missing).write_bytes(bytes(data[: len(data) // 2]))  # truncated
    assert files.read(missing) is None


def test_only_stale_files_are_removed(tmp_path):
    files = HandoffFiles(tmp_path)
    old, new = uuid.uuid4().hex, uuid.uuid4().hex
    files.write(old, _context())
    files.write(new, _context())
    past = time.time() - 3600
    os.utime(files.path(old), (past, past))
    assert files.remove_stale(max_age_s=60) == 1
    assert not files.exists(old) and files.exists(new)
    files.remove(new)
    files.remove(new)  # removing twice is fine
    assert not files.exists(new)


def test_a_file_in_place_of_the_directory_is_a_config_error(tmp_path):
    (tmp_path / "taken").write_text("")
    with pytest.raises(ConfigError, match="handoff directory"):
        HandoffFiles(tmp_path / "taken")


def test_keys_and_values_sharing_memory_are_written_too(tmp_path):
    files, handoff_id = HandoffFiles(tmp_path), uuid.uuid4().hex
    both = torch.randn(2, 3, 5, 2, 8)  # one buffer holding K and V
    files.write(handoff_id, FusedContext(both[0], both[1]))
    read = files.read(handoff_id)
    assert read is not None and torch.equal(read.k, both[0]) and torch.equal(read.v, both[1])


def test_storage_dtype_is_the_cache_dtype():
    stored = as_storage(_context(), torch.bfloat16)
    assert stored.k.dtype == stored.v.dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("num_kv_heads", "world_size", "expected"),
    [
        (2, 1, [range(0, 2)]),
        (2, 2, [range(0, 1), range(1, 2)]),
        (8, 4, [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]),
        # more ranks than heads: each head replicated on consecutive ranks (vLLM's split)
        (2, 4, [range(0, 1), range(0, 1), range(1, 2), range(1, 2)]),
    ],
)
def test_kv_heads_of_each_rank(num_kv_heads, world_size, expected):
    assert [kv_heads_of_rank(num_kv_heads, world_size, r) for r in range(world_size)] == expected


def test_ranks_cover_every_head_exactly_once_when_split():
    heads = [h for r in range(4) for h in kv_heads_of_rank(8, 4, r)]
    assert heads == list(range(8))


@pytest.mark.parametrize(("num_kv_heads", "world_size"), [(3, 2), (2, 3)])
def test_uneven_splits_are_refused(num_kv_heads, world_size):
    with pytest.raises(ValueError, match="KV heads"):
        kv_heads_of_rank(num_kv_heads, world_size, 0)
