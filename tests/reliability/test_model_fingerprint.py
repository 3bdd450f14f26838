"""An edited checkpoint never shares the original's KV namespace.

The attack: negate one MLP matrix of the real model's weights in place (same size, same header)
where no sampled window falls -- the fingerprint used to hash 64 windows of 4 KiB, so the edited
model got the original's namespace and was served KV computed by another model. The fingerprint
now hashes every byte (cached by size, times and inode), so the namespaces differ, also when the
file's modification time is put back.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from adarag.engine.spec import model_fingerprint

NUM_SAMPLES, SAMPLE_BYTES = 64, 4096  # what the sampled fingerprint read


def _sampled_digest(path: Path) -> str:
    """The former fingerprint: config, header and 64 evenly spaced 4 KiB windows per file."""
    digest = hashlib.sha256((path / "config.json").read_bytes())
    for weights in sorted(path.glob("*.safetensors")):
        size = weights.stat().st_size
        digest.update(f"{weights.name}:{size}".encode())
        with weights.open("rb") as handle:
            header_len = int.from_bytes(handle.read(8), "little")
            digest.update(handle.read(min(header_len, 1 << 24)))
            for idx in range(NUM_SAMPLES):
                handle.seek(size * idx // NUM_SAMPLES)
                digest.update(handle.read(SAMPLE_BYTES))
    return digest.hexdigest()[:16]


def _unsampled_mlp_tensor(weights: Path) -> tuple[str, int, int, str]:
    """(name, start, end, dtype) of an MLP matrix that no sampled window touches."""
    size = weights.stat().st_size
    with weights.open("rb") as handle:
        header_len = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(header_len))
    windows = [
        (size * idx // NUM_SAMPLES, size * idx // NUM_SAMPLES + SAMPLE_BYTES)
        for idx in range(NUM_SAMPLES)
    ]
    for name, info in header.items():
        if name == "__metadata__" or ".mlp." not in name:
            continue
        start, end = (8 + header_len + offset for offset in info["data_offsets"])
        if all(end <= low or start >= high for low, high in windows):
            return name, start, end, info["dtype"]
    pytest.skip("every MLP matrix of this checkpoint is sampled")


def _negate_in_place(weights: Path, start: int, end: int, dtype: str) -> None:
    """Flip the sign bit of every element of ``weights[start:end]`` (little-endian floats)."""
    width = {"F32": 4, "BF16": 2, "F16": 2}[dtype]
    with weights.open("r+b") as handle:
        handle.seek(start)
        data = bytearray(handle.read(end - start))
        for idx in range(width - 1, len(data), width):
            data[idx] ^= 0x80
        handle.seek(start)
        handle.write(data)


def test_an_edited_checkpoint_gets_another_namespace(real_config, tmp_path, ledger):
    original = Path(real_config.engine.model)
    edited = tmp_path / original.name
    shutil.copytree(original, edited)
    (weights,) = edited.glob("*.safetensors")
    before = weights.stat()
    name, start, end, dtype = _unsampled_mlp_tensor(weights)
    _negate_in_place(weights, start, end, dtype)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))  # the edit hides its mtime

    cache = tmp_path / "hashes.json"
    sampled_same = _sampled_digest(edited) == _sampled_digest(original)
    distinct = model_fingerprint(edited, cache) != model_fingerprint(original, cache)
    ledger.record("edited checkpoint (one MLP matrix negated)", detected=int(distinct))
    assert sampled_same, f"{name}: the edit was not hidden from the sampled digest"
    assert distinct, f"{name} negated, yet the fingerprint is the original's"
    # the cache holds one hash per file, and the fingerprint is stable across calls
    assert len(json.loads(cache.read_text())) == 2
    assert model_fingerprint(edited, cache) == model_fingerprint(edited, cache)


def test_the_fingerprint_binds_every_weight_of_a_tiny_checkpoint(tiny_checkpoints, tmp_path):
    edited = tmp_path / "tiny"
    shutil.copytree(tiny_checkpoints["llama"], edited)
    (weights,) = edited.glob("*.safetensors")
    with weights.open("rb") as handle:
        header_len = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(header_len))
    fingerprints = {model_fingerprint(edited)}
    for name, info in sorted(header.items()):
        if name == "__metadata__":
            continue
        start, end = (8 + header_len + offset for offset in info["data_offsets"])
        _negate_in_place(weights, start, min(end, start + 64), info["dtype"])
        # two writes within one clock tick share a timestamp: set one per edit
        os.utime(weights, ns=(len(fingerprints) * 10**9,) * 2)
        fingerprints.add(model_fingerprint(edited))
        _negate_in_place(weights, start, min(end, start + 64), info["dtype"])
    assert len(fingerprints) == len(header)  # the original, and one per edited tensor
