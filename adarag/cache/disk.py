"""On-disk chunk-KV entries: one safetensors file each, with a checksummed header.

A file holds tensors ``k`` and ``v`` and string metadata: the format tag, the model fingerprint,
the keys the entry answers to, its start position and a BLAKE2b checksum of the tensor bytes.
Files are written to a temporary name and renamed into place, so a crash never leaves a
half-written entry visible. Nothing is pickled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from adarag.cache.entry import ChunkKV
from adarag.errors import CacheError

logger = logging.getLogger(__name__)

FORMAT = "adarag-kv-1"
SUFFIX = ".kv.safetensors"


@dataclass(frozen=True)
class DiskHeader:
    """What a file's header says about its entry."""

    entry_id: str
    keys: tuple[str, ...]
    nbytes: int
    written_ns: int


class DiskTier:
    """A directory of KV entry files for one model fingerprint.

    Args:
        directory: The model's namespace directory (created if missing).
        model_fingerprint: Entries from another model are ignored (a clean miss).

    Raises:
        CacheError: The directory cannot be created or written.
    """

    def __init__(self, directory: Path, model_fingerprint: str) -> None:
        self.directory = directory
        self.model_fingerprint = model_fingerprint
        try:
            directory.mkdir(parents=True, exist_ok=True)
            probe = directory / f".write-probe-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            raise CacheError(
                f"KV cache directory {directory} is not writable ({err}); set "
                "cache.store.directory to a writable path, or cache.store.disk_capacity_bytes=0 "
                "to keep the cache in memory only"
            ) from err
        for stale in directory.glob(".tmp-*"):  # left by a crash mid-write; never visible
            stale.unlink(missing_ok=True)

    def path(self, entry_id: str) -> Path:
        """File of an entry."""
        return self.directory / f"{entry_id}{SUFFIX}"

    def scan(self) -> list[DiskHeader]:
        """Headers of every readable entry of this model, oldest first (others are skipped)."""
        headers = []
        for path in self.directory.glob(f"*{SUFFIX}"):
            header = self._read_header(path)
            if header is not None:
                headers.append(header)
        return sorted(headers, key=lambda header: header.written_ns)

    def write(self, entry_id: str, keys: tuple[str, ...], kv: ChunkKV) -> int:
        """Write an entry atomically; returns its size in bytes."""
        k, v = kv.k.contiguous(), kv.v.contiguous()
        metadata = {
            "format": FORMAT,
            "model": self.model_fingerprint,
            "keys": json.dumps(list(keys)),
            "start_position": str(kv.start_position),
            "checksum": _checksum(k, v),
            "written_ns": str(time.time_ns()),
        }
        final = self.path(entry_id)
        staging = self.directory / f".tmp-{entry_id}-{uuid.uuid4().hex}"
        try:
            save_file({"k": k, "v": v}, str(staging), metadata=metadata)
            os.replace(staging, final)
        finally:
            staging.unlink(missing_ok=True)
        return final.stat().st_size

    def read(self, entry_id: str) -> ChunkKV | None:
        """Load and verify an entry; a corrupted or foreign file is dropped with a warning."""
        path = self.path(entry_id)
        try:
            with safe_open(str(path), framework="pt") as handle:
                metadata = handle.metadata() or {}
                k, v = handle.get_tensor("k"), handle.get_tensor("v")
        except FileNotFoundError:
            return None
        except (SafetensorError, OSError, ValueError) as err:
            self._drop(path, f"unreadable ({err})")
            return None
        if metadata.get("model") != self.model_fingerprint or metadata.get("format") != FORMAT:
            return None
        if metadata.get("checksum") != _checksum(k, v):
            self._drop(path, "checksum mismatch")
            return None
        return ChunkKV(k, v, int(metadata["start_position"]))

    def remove(self, entry_id: str) -> None:
        """Delete an entry's file."""
        self.path(entry_id).unlink(missing_ok=True)

    def _read_header(self, path: Path) -> DiskHeader | None:
        try:
            with safe_open(str(path), framework="pt") as handle:
                metadata = handle.metadata() or {}
        except (SafetensorError, OSError, ValueError) as err:
            self._drop(path, f"unreadable header ({err})")
            return None
        if metadata.get("model") != self.model_fingerprint or metadata.get("format") != FORMAT:
            return None
        entry_id = path.name.removesuffix(SUFFIX)
        keys = tuple(json.loads(metadata["keys"]))
        written_ns = int(metadata.get("written_ns", "0"))
        return DiskHeader(entry_id, keys, path.stat().st_size, written_ns)

    def _drop(self, path: Path, reason: str) -> None:
        logger.warning(
            "dropping corrupted KV cache file %s: %s; it will be recomputed", path, reason
        )
        path.unlink(missing_ok=True)


def _checksum(k: torch.Tensor, v: torch.Tensor) -> str:
    hasher = hashlib.blake2b(digest_size=16)
    for tensor in (k, v):
        hasher.update(tensor.contiguous().view(torch.uint8).numpy().data)
    return hasher.hexdigest()
