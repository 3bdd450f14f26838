"""On-disk chunk-KV entries: one safetensors file each, verified before it is served.

A file holds one entry's bytes (:mod:`adarag.cache.entry_format`): its tensors and string
metadata -- the format tag, the model namespace, the keys the entry answers to, its start
position and a BLAKE2b checksum over all of that and the tensor bytes, shapes and dtypes. The
file name is the digest of the entry's keys, so a file
renamed, swapped or edited is detected. Reading checks, before an entry is served: the header
parses, the format and namespace are this store's, the keys hash to the file name, the tensors
have the store's dtype and the model's layer/head layout, and the checksum matches. A damaged
file is deleted; a file of another model or format is moved to ``quarantine/`` (never re-read).

Files are written under a staging name that carries the writer's pid, synced and renamed into
place, so a crash (even ``kill -9``) never leaves a partial entry visible; staging files of
processes that are no longer running are removed when a store opens the directory. Nothing is
pickled.
"""

from __future__ import annotations

import logging
import os
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from adarag.cache.codec import KVCodec, StoredKV
from adarag.cache.entry_format import (
    MAX_HEADER_BYTES,
    RejectedEntry,
    check_metadata,
    decode_entry,
    encode_entry,
    header_metadata,
)
from adarag.cache.keys import digest
from adarag.errors import CacheError
from adarag.files import process_running

logger = logging.getLogger(__name__)

SUFFIX = ".kv.safetensors"
STAGING_PREFIX = ".tmp-"
QUARANTINE = "quarantine"


@dataclass(frozen=True)
class DiskHeader:
    """What a file's header says about its entry."""

    entry_id: str
    keys: tuple[str, ...]
    nbytes: int
    created_ns: int


class DiskTier:
    """A directory of verified KV entry files for one model namespace.

    Args:
        directory: The namespace's directory (created if missing).
        model_fingerprint: The namespace; files of another are quarantined, never served.
        codec: The storage format (and model layout) every entry must have.

    Raises:
        CacheError: The directory cannot be created or written.
    """

    def __init__(
        self,
        directory: Path,
        model_fingerprint: str,
        codec: KVCodec,
    ) -> None:
        self.directory = directory
        self.model_fingerprint = model_fingerprint
        self.codec = codec
        self.num_outdated_removed = 0
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
        _remove_orphaned_staging(directory)

    def path(self, entry_id: str) -> Path:
        """File of an entry."""
        return self.directory / f"{entry_id}{SUFFIX}"

    def scan(self) -> list[DiskHeader]:
        """Headers of every valid-looking entry, oldest first (bad files are set aside)."""
        headers = []
        self.num_outdated_removed = 0
        for path in self.directory.glob(f"*{SUFFIX}"):
            header = self._read_header(path)
            if header is not None:
                headers.append(header)
        if self.num_outdated_removed:
            logger.warning(
                "removed %d KV cache files of an older adarag version from %s; their chunks "
                "are recomputed when next used (`adarag ingest` warms them again)",
                self.num_outdated_removed,
                self.directory,
            )
        return sorted(headers, key=lambda header: header.created_ns)

    def encode(
        self, entry_id: str, keys: tuple[str, ...], stored: StoredKV, created_ns: int
    ) -> bytes:
        """The file bytes of an entry (to size it before it is written).

        ``created_ns`` is when the entry was stored: of two files claiming a key, the newer
        entry wins it on restart, whichever was written first.
        """
        assert entry_id == digest(*sorted(keys)), "an entry's id is the digest of its keys"
        return encode_entry(self.model_fingerprint, keys, stored, created_ns)

    def write(self, entry_id: str, data: bytes) -> int:
        """Write encoded entry bytes atomically (staged, synced, renamed); returns the size."""
        final = self.path(entry_id)
        staging = self.directory / f"{STAGING_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
        try:
            with staging.open("wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(staging, final)
        finally:
            staging.unlink(missing_ok=True)
        return len(data)

    def read(self, entry_id: str) -> StoredKV | None:
        """Load and verify an entry; None when it is missing or fails a check (set aside)."""
        path = self.path(entry_id)
        try:
            with _open_regular(path) as handle:
                inode = os.fstat(handle.fileno()).st_ino
                data = handle.read()
        except FileNotFoundError:
            return None  # evicted meanwhile (by another process sharing the directory)
        except (OSError, RejectedEntry) as err:
            self._set_aside(
                path, err if isinstance(err, RejectedEntry) else RejectedEntry(str(err))
            )
            return None
        try:
            return decode_entry(data, entry_id, self.model_fingerprint, self.codec)[1]
        except RejectedEntry as rejected:
            self._set_aside(path, rejected, inode)
        return None

    def remove(self, entry_id: str) -> None:
        """Delete an entry's file."""
        self.path(entry_id).unlink(missing_ok=True)

    def _read_header(self, path: Path) -> DiskHeader | None:
        try:
            with _open_regular(path) as handle:
                inode = os.fstat(handle.fileno()).st_ino
                size = os.fstat(handle.fileno()).st_size
                prefix = handle.read(8)
                prefix += handle.read(min(int.from_bytes(prefix[:8], "little"), MAX_HEADER_BYTES))
        except FileNotFoundError:
            return None
        except (OSError, RejectedEntry) as err:
            self._set_aside(
                path, err if isinstance(err, RejectedEntry) else RejectedEntry(str(err))
            )
            return None
        try:
            metadata = header_metadata(prefix)
            keys = check_metadata(metadata, path.name.removesuffix(SUFFIX), self.model_fingerprint)
            created_ns = int(metadata.get("created_ns", "0"))
            return DiskHeader(path.name.removesuffix(SUFFIX), keys, size, created_ns)
        except RejectedEntry as rejected:
            self._set_aside(path, rejected, inode)
        except ValueError as err:
            self._set_aside(path, RejectedEntry(f"unreadable header ({err})"), inode)
        return None

    def _set_aside(self, path: Path, rejected: RejectedEntry, inode: int | None = None) -> None:
        """Quarantine a foreign file (or anything but a regular file); delete a damaged one.

        ``inode`` is the file that was read: if another process has since replaced it, the new
        file is left alone.
        """
        try:
            if inode is not None and os.lstat(path).st_ino != inode:
                return
        except FileNotFoundError:
            return
        if rejected.outdated:
            self.num_outdated_removed += 1  # reported once per scan, not per file
            path.unlink(missing_ok=True)
            return
        if rejected.foreign or (path.is_dir() and not path.is_symlink()):
            target = self.directory / QUARANTINE / path.name
            logger.warning("moving KV cache file %s to %s: %s", path, target.parent, rejected)
            try:
                target.parent.mkdir(exist_ok=True)
                os.replace(path, target)
                return
            except OSError as err:
                logger.warning("cannot quarantine %s (%s); deleting it", path, err)
        else:
            logger.warning(
                "dropping corrupted KV cache file %s: %s; it will be recomputed", path, rejected
            )
        try:
            path.unlink(missing_ok=True)
        except OSError as err:  # e.g. a directory that could not be moved either
            logger.warning("cannot delete %s (%s); it is skipped", path, err)


def _open_regular(path: Path) -> BinaryIO:
    """Open a regular file for reading without following a link or blocking on a FIFO.

    Raises:
        FileNotFoundError: Nothing is there.
        RejectedEntry: A link, a directory, a FIFO or a device is there.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise RejectedEntry(f"not a readable regular file ({err.strerror})") from err
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RejectedEntry("not a regular file")
    return os.fdopen(fd, "rb")


def _remove_orphaned_staging(directory: Path) -> None:
    """Delete staging files whose writer is no longer running (a crash mid-write)."""
    for staging in directory.glob(f"{STAGING_PREFIX}*"):
        pid = staging.name.removeprefix(STAGING_PREFIX).split("-", 1)[0]
        if pid.isdigit() and process_running(int(pid)):
            continue  # another live process is writing it
        staging.unlink(missing_ok=True)
