"""The private-directory hand-over of signed fused KV to ``vllm serve`` workers, and the rank
split."""

from __future__ import annotations

import logging
import os
import stat
import time
import uuid

import pytest
import torch

from adarag.engine.vllm.handoff import FusedContext, HandoffBinding, prompt_digest
from adarag.engine.vllm.handoff_files import HandoffFiles, as_storage
from adarag.engine.vllm.handoff_format import HandoffSigner
from adarag.engine.vllm.ranks import kv_heads_of_rank
from adarag.errors import ConfigError

SIGNER = HandoffSigner(b"a-hand-over-key-of-32-bytes-long")
PROMPT = (11, 12, 13, 14, 15)


def _context(num_heads: int = 4, seed: int = 0) -> FusedContext:
    rng = torch.Generator().manual_seed(seed)
    k = torch.randn(3, 5, num_heads, 8, generator=rng)
    return FusedContext(k, k * 2 + 1)


def _binding(handoff_id: str | None = None, prompt=PROMPT) -> HandoffBinding:
    return HandoffBinding(handoff_id or uuid.uuid4().hex, prompt_digest(prompt), len(prompt))


def test_round_trip_is_exact_and_private(tmp_path):
    files, binding, context = HandoffFiles(tmp_path / "h", SIGNER), _binding(), _context()
    files.write(binding, context)
    assert files.check(binding) is None
    read = files.read(binding)
    assert read is not None
    assert torch.equal(read.k, context.k) and torch.equal(read.v, context.v)
    path = files.path(binding.handoff_id)
    assert [p.name for p in (tmp_path / "h").iterdir()] == [path.name]  # no temp left
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "h").stat().st_mode) == 0o700


def test_a_rank_reads_only_its_heads(tmp_path):
    files, binding, context = HandoffFiles(tmp_path, SIGNER), _binding(), _context(4)
    files.write(binding, context)
    read = files.read(binding, range(2, 4))
    assert read is not None
    assert torch.equal(read.k, context.k[:, :, 2:4]) and torch.equal(read.v, context.v[:, :, 2:4])


@pytest.mark.parametrize("bad", ["../etc/passwd", "ABC", "0" * 31, "0" * 32 + "/x", ""])
def test_handoff_ids_never_name_a_path(tmp_path, bad):
    files = HandoffFiles(tmp_path, SIGNER)
    assert files.check(_binding(bad)) is not None and files.read(_binding(bad)) is None
    with pytest.raises(ValueError, match="32 lowercase hex digits"):
        files.path(bad)


def test_missing_and_damaged_files_read_as_none_with_the_reason(tmp_path, caplog):
    files = HandoffFiles(tmp_path, SIGNER)
    caplog.set_level(logging.WARNING)
    missing = _binding()
    assert files.read(missing) is None
    assert f"no fused KV under handoff {missing.handoff_id}" in caplog.text
    assert "no fused KV waits" in files.check(missing)
    damaged = _binding()
    files.path(damaged.handoff_id).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    assert files.read(damaged) is None and "header is unreadable" in files.check(damaged)
    assert f"fused KV under handoff {damaged.handoff_id} is refused" in caplog.text


def _swap(files: HandoffFiles, one: HandoffBinding, other: HandoffBinding) -> None:
    os.replace(files.path(one.handoff_id), files.path(other.handoff_id))


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        ("swapped", "written for handoff"),
        ("other prompt", "another prompt"),
        ("other key", "signed under another key"),
        ("forged", "signature does not verify"),
        ("truncated", "unreadable"),
    ],
)
def test_a_tampered_hand_over_is_refused_naming_why(tmp_path, tamper, reason):
    files, binding = HandoffFiles(tmp_path, SIGNER), _binding()
    files.write(binding, _context())
    path = files.path(binding.handoff_id)
    if tamper == "swapped":  # another request's genuine file under this request's id
        other = _binding(prompt=(1, 2, 3, 4, 5))
        files.write(other, _context(seed=1))
        path.unlink()
        _swap(files, other, binding)
    elif tamper == "other prompt":  # this id, but the request's prompt is another one
        binding = _binding(binding.handoff_id, prompt=(11, 12, 13, 14, 99))
    elif tamper == "other key":
        HandoffFiles(tmp_path, HandoffSigner(b"another-key-of-at-least-16-bytes")).write(
            binding, _context()
        )
    elif tamper == "forged":  # the header kept, the tensors rewritten
        data = bytearray(path.read_bytes())
        data[-4:] = b"\x00\x00\x80\x7f"
        path.write_bytes(bytes(data))
    else:
        path.write_bytes(path.read_bytes()[:-100])
    assert files.read(binding) is None
    header = files.check(binding)
    if tamper in ("forged", "truncated"):  # the header alone is genuine
        assert header is None
    else:
        assert header is not None and reason in header
    with pytest.raises(Exception, match=reason):
        SIGNER.decode(path.read_bytes(), binding, None)


def test_only_stale_files_are_removed(tmp_path):
    files = HandoffFiles(tmp_path, SIGNER)
    old, new = _binding(), _binding()
    files.write(old, _context())
    files.write(new, _context())
    temporary = tmp_path / f".{files.path(old.handoff_id).name}.999.tmp"
    temporary.write_bytes(b"left by a writer killed mid-write")
    past = time.time() - 3600
    for path in (files.path(old.handoff_id), temporary):
        os.utime(path, (past, past))
    assert files.remove_stale(max_age_s=60) == 2
    assert files.check(old) is not None and files.check(new) is None
    files.remove(new.handoff_id)
    files.remove(new.handoff_id)  # removing twice is fine
    assert not any(tmp_path.iterdir())


def test_a_file_in_place_of_the_directory_is_a_config_error(tmp_path):
    (tmp_path / "taken").write_text("")
    with pytest.raises(ConfigError, match="hand-over directory .* is not a directory"):
        HandoffFiles(tmp_path / "taken", SIGNER)


def test_a_directory_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # as another user creating the documented path first would leave it
    with pytest.raises(ConfigError, match=r"may be written by other users \(mode 0777\)"):
        HandoffFiles(shared, SIGNER)


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a directory to another user needs root")
def test_a_directory_of_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(ConfigError, match="belongs to uid 65534, not to this user"):
        HandoffFiles(theirs, SIGNER)


def test_a_link_in_place_of_the_directory_is_refused(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ConfigError, match="is not a directory"):
        HandoffFiles(tmp_path / "link", SIGNER)


def test_keys_and_values_sharing_memory_are_written_too(tmp_path):
    files = HandoffFiles(tmp_path, SIGNER)
    both = torch.randn(2, 3, 5, 2, 8)  # one buffer holding K and V
    binding = _binding()
    files.write(binding, FusedContext(both[0], both[1]))
    read = files.read(binding)
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
