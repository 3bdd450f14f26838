"""The unit of cached KV: one chunk's keys and values for every layer, and the digest of its bytes.

A bottom-layer value type: the engine computes and consumes it, the cache stores it, and neither
needs the other for it. Both also sign KV bytes they hand to another process (the cache's stored
entries, the engine's hand-overs to vLLM) with :func:`update_digests`, name the key that signed
them with :func:`key_id`, and read a stored blob's metadata with :func:`safetensors_metadata`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ChunkKV:
    """KV of one prompt segment, keys after RoPE at ``start_position + i``.

    Attributes:
        k: [num_layers, num_tokens, num_kv_heads, head_dim].
        v: [num_layers, num_tokens, num_kv_heads, head_dim].
        start_position: Absolute position of the first token when the KV was computed.
    """

    k: torch.Tensor
    v: torch.Tensor
    start_position: int

    def __post_init__(self) -> None:
        assert self.k.shape == self.v.shape, f"k {self.k.shape} and v {self.v.shape} differ"
        assert self.k.dim() == 4, f"expected [layers, tokens, heads, dim], got {self.k.shape}"

    @property
    def num_tokens(self) -> int:
        """Tokens in the segment."""
        return int(self.k.shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes held by k and v."""
        return self.k.element_size() * self.k.numel() * 2

    def to(self, dtype: torch.dtype) -> ChunkKV:
        """The same entry in another dtype (no copy when it already has it)."""
        if self.k.dtype == dtype:
            return self
        return ChunkKV(self.k.to(dtype), self.v.to(dtype), self.start_position)


def update_digests(
    hashers: Sequence[Any], metadata: Mapping[str, str], tensors: Mapping[str, torch.Tensor]
) -> None:
    """Feed ``metadata`` and every tensor's name, dtype, shape and bytes to each of ``hashers``.

    The metadata goes in as JSON with sorted keys, the tensors in name order; their bytes are
    read once for every hasher (``hashlib`` or ``hmac`` objects).
    """
    described_metadata = json.dumps(dict(metadata), sort_keys=True).encode()
    for hasher in hashers:
        hasher.update(described_metadata)
    for name in sorted(tensors):
        tensor = tensors[name]
        described = f"{name}:{tensor.dtype}{tuple(tensor.shape)}".encode()
        data = tensor.contiguous().view(torch.uint8).numpy().data
        for hasher in hashers:
            hasher.update(described)
            hasher.update(data)


def key_id(key: bytes, purpose: bytes) -> str:
    """A public name of a secret signing key: tells which key signed something, reveals nothing.

    Args:
        key: The secret.
        purpose: What the key signs (stored entries, hand-overs); one key gets one id per purpose.
    """
    return hmac.new(key, b"adarag-key-id\x00" + purpose, hashlib.sha256).hexdigest()[:16]


def safetensors_metadata(data: bytes, max_header_bytes: int) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors header at the start of ``data``, tensors unread.

    Raises:
        ValueError: The header is cut short, longer than ``max_header_bytes``, not JSON, or its
            metadata is not strings.
    """
    if len(data) < 8:
        raise ValueError("shorter than a safetensors header")
    length = int.from_bytes(data[:8], "little")
    if length > min(len(data) - 8, max_header_bytes):
        raise ValueError(f"a header of {length} bytes runs past the data")
    try:
        header = json.loads(data[8 : 8 + length])
    except RecursionError:
        raise ValueError("the header nests too deeply") from None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("no string metadata in the header")
    return metadata
