"""The bytes of one stored chunk-KV entry, shared by the disk tier and the remote tier.

An entry is a safetensors blob: its tensors (``k`` and ``v``, or the int8 codes and scales) and
string metadata -- the format tag, the model namespace, the keys the entry answers to, its start
position, when it was stored, and a BLAKE2b checksum over all of that and the tensor bytes,
shapes and dtypes. An entry's id is the digest of its sorted keys. :func:`decode_entry` checks,
before anything is served: the header parses, the format and namespace are the reader's, the keys
hash to the id the entry was found under, the tensors have the codec's dtype and the model's
layer/head layout, and the checksum matches. Nothing is pickled.

**Signed entries.** With a signing key (``cache.store.signing_key``), every entry also carries
an HMAC-SHA256 under that key over the same metadata and tensors, and the key's public id
(:func:`~adarag.kv.key_id`). A reader with the key rejects an entry whose signature is missing or
wrong: an entry forged with a consistent checksum is then told from a genuine one. An entry
signed under another key (its key id is not the reader's) is rejected as well, but flagged
``other_key``: it may be another process's genuine entry, so the reader keeps it. Without a key
the checksum only detects damage, so the store trusts everyone who can write to its directory or
shared server.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from adarag.cache.codec import InvalidEntry, KVCodec, StoredKV
from adarag.cache.keys import digest
from adarag.kv import key_id, safetensors_metadata, update_digests

FORMAT = "adarag-kv-2"
OUTDATED_FORMATS = frozenset({"adarag-kv-1"})  # written by earlier adarag versions
MAX_HEADER_BYTES = 1 << 20  # an entry's header (a few keys) is far smaller
_UNHASHED = frozenset({"checksum", "signature"})  # metadata the digests do not cover
_SIGNATURE_CONTEXT = b"adarag-kv-entry-signature\x00"
KEY_PURPOSE = b"stored chunk KV"
"""What a store's signing key signs (its :func:`~adarag.kv.key_id` is taken for it)."""


class RejectedEntry(Exception):
    """Bytes that must not be served.

    Attributes:
        foreign: Another model's or format's entry (intact, but not the reader's).
        outdated: Written by an earlier adarag version.
        unsigned: Its signature is missing or wrong under the reader's signing key (forged, or
            written by a store without the key).
        other_key: Signed under another key than the reader's (with ``unsigned``): perhaps
            another process's genuine entry, never served here, but kept.
    """

    def __init__(
        self,
        reason: str,
        *,
        foreign: bool = False,
        outdated: bool = False,
        unsigned: bool = False,
        other_key: bool = False,
    ) -> None:
        super().__init__(reason)
        self.foreign = foreign
        self.outdated = outdated
        self.unsigned = unsigned or other_key
        self.other_key = other_key


def encode_entry(
    model_fingerprint: str,
    keys: tuple[str, ...],
    stored: StoredKV,
    created_ns: int,
    signing_key: bytes | None = None,
) -> bytes:
    """The bytes of an entry stored under ``keys`` at ``created_ns`` (nanoseconds since epoch).

    With ``signing_key``, the entry carries an HMAC-SHA256 of its metadata and tensors, and the
    key's id.
    """
    tensors = {name: t.contiguous() for name, t in stored.tensors.items()}
    metadata = {
        "format": FORMAT,
        "model": model_fingerprint,
        "keys": json.dumps(list(keys)),
        "start_position": str(stored.start_position),
        "created_ns": str(created_ns),
    }
    if signing_key is not None:
        metadata["key_id"] = key_id(signing_key, KEY_PURPOSE)
    checksum, signature = entry_digests(metadata, tensors, signing_key)
    metadata["checksum"] = checksum
    if signature is not None:
        metadata["signature"] = signature
    return save(tensors, metadata=metadata)


def decode_entry(
    data: bytes,
    entry_id: str,
    model_fingerprint: str,
    codec: KVCodec,
    signing_key: bytes | None = None,
) -> tuple[tuple[str, ...], StoredKV]:
    """The keys and KV of entry bytes found under ``entry_id``, once every check passes.

    With ``signing_key``, the entry's signature must also verify under it.

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
    checksum, signature = entry_digests(metadata, tensors, signing_key)
    if metadata.get("checksum") != checksum:
        raise RejectedEntry("checksum mismatch")
    if signature is not None:
        assert signing_key is not None
        _check_signature(metadata, signature, key_id(signing_key, KEY_PURPOSE))
    return keys, stored


def _check_signature(metadata: dict[str, str], signature: str, own_key_id: str) -> None:
    """Refuse an entry whose signature is missing, made under another key, or wrong."""
    found = metadata.get("signature")
    if found is None:
        raise RejectedEntry("unsigned, and this store requires signed entries", unsigned=True)
    signer = metadata.get("key_id")
    if signer != own_key_id:
        raise RejectedEntry(
            f"signed under another key (key id {signer or 'not recorded'}, this store's "
            f"{own_key_id}); kept for the processes that hold that key. Give every process "
            "sharing this store the same cache.store.signing_key",
            other_key=True,
        )
    if not hmac.compare_digest(found.encode(), signature.encode()):
        raise RejectedEntry("its signature does not verify (forged or edited)", unsigned=True)


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
    return safetensors_metadata(data, MAX_HEADER_BYTES)


def entry_digests(
    metadata: dict[str, str], tensors: dict[str, torch.Tensor], signing_key: bytes | None
) -> tuple[str, str | None]:
    """The checksum and (with ``signing_key``) the HMAC-SHA256 signature of an entry.

    Both cover the metadata but the checksum and signature, and each tensor's name, dtype,
    shape and bytes; the tensor bytes are read once for both.
    """
    hashers: list[Any] = [hashlib.blake2b(digest_size=16)]
    if signing_key is not None:
        hashers.append(hmac.new(signing_key, _SIGNATURE_CONTEXT, hashlib.sha256))
    covered = {name: value for name, value in metadata.items() if name not in _UNHASHED}
    update_digests(hashers, covered, tensors)
    checksum = hashers[0].hexdigest()
    return checksum, (hashers[1].hexdigest() if signing_key is not None else None)
