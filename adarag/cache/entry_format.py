"""The bytes of one stored chunk-KV entry, shared by the disk tier and the remote tier.

An entry is a safetensors blob: its tensors (``k`` and ``v``, or the int8 codes and scales) and
string metadata -- the format tag, the model namespace, the keys the entry answers to, its start
position, when it was stored, and a BLAKE2b checksum over all of that and the tensor bytes,
shapes and dtypes. An entry's id is the digest of its sorted keys. :func:`decode_entry` checks,
before anything is served: the header parses, the format and namespace are the reader's, the keys
hash to the id the entry was found under, the tensors have the codec's dtype and the model's
layer/head layout, and the checksum matches. Nothing is pickled.
"""

from __future__ import annotations

import hashlib
import json

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from adarag.cache.codec import InvalidEntry, KVCodec, StoredKV
from adarag.cache.keys import digest

FORMAT = "adarag-kv-2"
OUTDATED_FORMATS = frozenset({"adarag-kv-1"})  # written by earlier adarag versions
MAX_HEADER_BYTES = 1 << 20  # an entry's header (a few keys) is far smaller


class RejectedEntry(Exception):
    """Bytes that must not be served.

    Attributes:
        foreign: Another model's or format's entry (intact, but not the reader's).
        outdated: Written by an earlier adarag version.
    """

    def __init__(self, reason: str, *, foreign: bool = False, outdated: bool = False) -> None:
        super().__init__(reason)
        self.foreign = foreign
        self.outdated = outdated


def encode_entry(
    model_fingerprint: str, keys: tuple[str, ...], stored: StoredKV, created_ns: int
) -> bytes:
    """The bytes of an entry stored under ``keys`` at ``created_ns`` (nanoseconds since epoch)."""
    tensors = {name: t.contiguous() for name, t in stored.tensors.items()}
    metadata = {
        "format": FORMAT,
        "model": model_fingerprint,
        "keys": json.dumps(list(keys)),
        "start_position": str(stored.start_position),
        "created_ns": str(created_ns),
    }
    metadata["checksum"] = entry_checksum(metadata, tensors)
    return save(tensors, metadata=metadata)


def decode_entry(
    data: bytes, entry_id: str, model_fingerprint: str, codec: KVCodec
) -> tuple[tuple[str, ...], StoredKV]:
    """The keys and KV of entry bytes found under ``entry_id``, once every check passes.

    Raises:
        RejectedEntry: The bytes fail a check (see the module docstring).
    """
    try:
        metadata = header_metadata(data)
        keys = check_metadata(metadata, entry_id, model_fingerprint)
        tensors = load(data)
        stored = StoredKV(tensors, int(metadata["start_position"]))
        codec.check(stored)
    except InvalidEntry as invalid:
        raise RejectedEntry(str(invalid)) from invalid
    except (SafetensorError, ValueError, KeyError, RuntimeError) as err:
        raise RejectedEntry(f"unreadable ({err})") from err
    if metadata.get("checksum") != entry_checksum(metadata, tensors):
        raise RejectedEntry("checksum mismatch")
    return keys, stored


def check_metadata(
    metadata: dict[str, str], entry_id: str, model_fingerprint: str
) -> tuple[str, ...]:
    """The entry's keys, once its format, namespace and id are checked.

    Raises:
        RejectedEntry: The format or namespace is not the reader's, or the keys do not hash to
            ``entry_id`` (renamed, swapped or edited).
    """
    if metadata.get("format") != FORMAT:
        found = metadata.get("format")
        if found in OUTDATED_FORMATS:
            raise RejectedEntry(f"outdated format {found}", outdated=True)
        raise RejectedEntry(f"format {found!r}, not {FORMAT}", foreign=True)
    if metadata.get("model") != model_fingerprint:
        raise RejectedEntry(f"written for model {metadata.get('model')!r}", foreign=True)
    try:
        keys = json.loads(metadata["keys"])
    except (KeyError, json.JSONDecodeError) as err:
        raise RejectedEntry(f"unreadable key list ({err})") from err
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
        raise RejectedEntry("the key list is not a list of strings")
    if entry_id != digest(*sorted(keys)):
        raise RejectedEntry("its keys do not match its name (renamed, swapped or edited)")
    return tuple(keys)


def header_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors header at the start of ``data``.

    Raises:
        ValueError: The header is cut short, not JSON, or its metadata is not strings.
    """
    if len(data) < 8:
        raise ValueError("shorter than a safetensors header")
    length = int.from_bytes(data[:8], "little")
    if length > min(len(data) - 8, MAX_HEADER_BYTES):
        raise ValueError(f"header of {length} bytes runs past the data")
    header = json.loads(data[8 : 8 + length])
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("no string metadata in the header")
    return metadata


def entry_checksum(metadata: dict[str, str], tensors: dict[str, torch.Tensor]) -> str:
    """BLAKE2b of the metadata (but the checksum) and each tensor's name, dtype, shape, bytes."""
    hasher = hashlib.blake2b(digest_size=16)
    signed = {name: value for name, value in metadata.items() if name != "checksum"}
    hasher.update(json.dumps(signed, sort_keys=True).encode())
    for name in sorted(tensors):
        tensor = tensors[name]
        hasher.update(f"{name}:{tensor.dtype}{tuple(tensor.shape)}".encode())
        hasher.update(tensor.contiguous().view(torch.uint8).numpy().data)
    return hasher.hexdigest()
