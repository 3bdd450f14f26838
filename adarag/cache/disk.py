"""On-disk chunk-KV entries: one safetensors file each, verified before it is served.

A file holds one entry's bytes (:mod:`adarag.cache.entry_format`): its tensors and string
metadata -- the format tag, the model namespace, the keys the entry answers to, its start
position and a BLAKE2b checksum over all of that and the tensor bytes, shapes and dtypes. The
file name is the digest of the entry's keys, so a file
renamed, swapped or edited is detected. Reading checks, before an entry is served: the header
parses, the format and namespace are this store's, the keys hash to the file name, the tensors
have the store's dtype and the model's layer/head layout, and the checksum matches (and, with a
signing key, the entry's HMAC). A damaged (or forged) file is deleted; a file of another model
or format is moved to ``quarantine/`` (never re-read). Only such proof deletes a file: an error
opening or reading it (too many open files, permission denied, an I/O error) is retried when it
may pass, else reported, and the read is a miss that leaves the file in place. So is an entry
signed under another key (another process's, sharing the directory with another key): it is
never served here, never deleted and never overwritten.

Files are written under a staging name that carries the writer's PID namespace and pid, synced
and renamed into place, so a crash (even ``kill -9``) never leaves a partial entry visible; a
store opening the directory removes the staging files of writers that are gone
(:mod:`adarag.cache.staging`: by pid in its own namespace, by age from another host or
container).

A directory on a read-only or full file system still serves the entries it holds: the first
failed write logs one warning, and writes stop (:attr:`DiskTier.write_problem` says why) until
:data:`WRITE_RETRY_S` has passed. Nothing is pickled.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
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
from adarag.cache.staging import (
    STAGING_PREFIX,
    remove_orphaned_staging,
    writer_id,
)
from adarag.errors import CacheError
from adarag.files import make_private_directories, unlink_quietly

logger = logging.getLogger(__name__)

SUFFIX = ".kv.safetensors"
QUARANTINE = "quarantine"
WRITE_RETRY_S = 60.0
"""After a write failed for want of space or a writable file system, seconds before the next."""
UNWRITABLE_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM})
_RETRIED_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.EINTR, errno.EAGAIN, errno.ENOMEM})
_READ_ATTEMPTS = 3


class EntryUnreadable(Exception):
    """An entry file that could not be read now (the error may pass); the file is kept."""


class EntrySignedElsewhere(EntryUnreadable):
    """An entry signed under another key than this tier's: refused here, the file is kept."""


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
        signing_key: When given, every entry written is signed with it, and an entry whose
            signature does not verify is never served: deleted when it is unsigned or claims
            this key, kept when another key signed it.

    Raises:
        CacheError: The directory cannot be created or written for a reason other than a
            read-only or full file system (then it serves what it holds, read-only).
    """

    def __init__(
        self,
        directory: Path,
        model_fingerprint: str,
        codec: KVCodec,
        signing_key: bytes | None = None,
    ) -> None:
        self.directory = directory
        self.model_fingerprint = model_fingerprint
        self.codec = codec
        self.signing_key = signing_key
        self.num_outdated_removed = 0
        self.num_signature_failures = 0  # reads refused for their signature
        self.num_read_errors = 0  # reads that failed with an OS error (the file was kept)
        self.write_problem: str | None = None  # why writes are off now, None while they are on
        self._write_retry_at = 0.0
        self._counts_lock = threading.Lock()
        try:
            make_private_directories(directory)
            probe = directory / f".write-probe-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            if err.errno not in UNWRITABLE_ERRNOS - {errno.EACCES, errno.EPERM}:
                raise CacheError(
                    f"KV cache directory {directory} is not writable ({err}); set "
                    "cache.store.directory to a writable path, or "
                    "cache.store.disk_capacity_bytes=0 to keep the cache in memory only"
                ) from err
            self._stop_writes(err)
            return
        remove_orphaned_staging(directory)

    @property
    def is_writable(self) -> bool:
        """Whether writes go to the directory now (False for a while after one failed)."""
        if self.write_problem is None:
            return True
        return time.monotonic() >= self._write_retry_at

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

    def write(self, entry_id: str, data: bytes) -> int | None:
        """Write encoded entry bytes atomically (staged, synced, renamed); returns the size.

        None when the write failed (nothing is left behind): on a read-only or full file system,
        writes then stop for :data:`WRITE_RETRY_S` (one warning); any other error is logged.
        """
        if not self.is_writable:
            return None
        final = self.path(entry_id)
        staging = self.directory / f"{STAGING_PREFIX}{writer_id()}-{uuid.uuid4().hex}"
        try:
            with staging.open("wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(staging, final)
        except OSError as err:
            if err.errno in UNWRITABLE_ERRNOS:
                self._stop_writes(err)
            else:
                logger.warning("cannot write KV cache file %s (%s); kept in memory", final, err)
            return None
        finally:
            unlink_quietly(staging)
        if self.write_problem is not None:
            logger.info("the KV cache directory %s is writable again", self.directory)
            self.write_problem = None
        return len(data)

    def read(self, entry_id: str) -> StoredKV | None:
        """Load and verify an entry; None when it is missing or fails a check (set aside).

        Raises:
            EntryUnreadable: Opening or reading the file failed with an OS error (retried when
                it may pass); the file is kept, and the entry may be read later.
            EntrySignedElsewhere: Another signing key than this tier's signed the entry; the
                file is kept.
        """
        path = self.path(entry_id)
        for attempt in range(_READ_ATTEMPTS):
            try:
                with _open_regular(path) as handle:
                    inode = os.fstat(handle.fileno()).st_ino
                    data = handle.read()
                break
            except FileNotFoundError:
                return None  # evicted meanwhile (by another process sharing the directory)
            except RejectedEntry as rejected:
                self._set_aside(path, rejected)
                return None
            except OSError as err:
                if err.errno in _RETRIED_ERRNOS and attempt + 1 < _READ_ATTEMPTS:
                    time.sleep(0.01 * 4**attempt)
                    continue
                with self._counts_lock:
                    self.num_read_errors += 1
                    first = self.num_read_errors == 1
                log = logger.warning if first else logger.debug
                log("cannot read KV cache file %s now (%s); it is kept, and recomputed", path, err)
                raise EntryUnreadable(str(err)) from err
        try:
            return decode_entry(
                data, entry_id, self.model_fingerprint, self.codec, self.signing_key
            )[1]
        except RejectedEntry as rejected:
            if rejected.other_key:
                raise self._signed_elsewhere(path, rejected) from None
            self._set_aside(path, rejected, inode)
        return None

    def _signed_elsewhere(self, path: Path, rejected: RejectedEntry) -> EntrySignedElsewhere:
        """Count and report an entry signed under another key (kept, not served)."""
        with self._counts_lock:
            self.num_signature_failures += 1
            first = self.num_signature_failures == 1
        log = logger.warning if first else logger.debug
        log("not serving KV cache file %s: %s", path, rejected)
        return EntrySignedElsewhere(str(rejected))

    def remove(self, entry_id: str) -> None:
        """Delete an entry's file (on a read-only file system, it stays)."""
        unlink_quietly(self.path(entry_id))

    def _stop_writes(self, err: OSError) -> None:
        """Stop writing for :data:`WRITE_RETRY_S` after ``err`` (warned once, not per write)."""
        was_writable = self.write_problem is None
        self.write_problem = f"{err.strerror or err} (errno {errno.errorcode.get(err.errno or 0)})"
        self._write_retry_at = time.monotonic() + WRITE_RETRY_S
        if was_writable:
            logger.warning(
                "KV cache directory %s cannot be written: %s; serving without writing chunk KV "
                "to disk (entries already there are still read), trying again in %g s",
                self.directory,
                self.write_problem,
                WRITE_RETRY_S,
            )

    def _read_header(self, path: Path) -> DiskHeader | None:
        try:
            with _open_regular(path) as handle:
                inode = os.fstat(handle.fileno()).st_ino
                size = os.fstat(handle.fileno()).st_size
                prefix = handle.read(8)
                prefix += handle.read(min(int.from_bytes(prefix[:8], "little"), MAX_HEADER_BYTES))
        except FileNotFoundError:
            return None
        except RejectedEntry as rejected:
            self._set_aside(path, rejected)
            return None
        except OSError as err:  # says nothing about the file: it stays, unindexed this time
            with self._counts_lock:
                self.num_read_errors += 1
            logger.warning("cannot read KV cache file %s (%s); skipped, not deleted", path, err)
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
            unlink_quietly(path)
            return
        if rejected.unsigned:
            with self._counts_lock:
                self.num_signature_failures += 1
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

    Any other error (too many open files, permission denied, I/O) is raised as it is: it says
    nothing about the file's content.

    Raises:
        FileNotFoundError: Nothing is there.
        RejectedEntry: A link, a directory, a FIFO or a device is there.
        OSError: The file could not be opened for another reason.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENXIO, errno.ENODEV, errno.EISDIR):
            raise RejectedEntry(f"not a readable regular file ({err.strerror})") from err
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RejectedEntry("not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
