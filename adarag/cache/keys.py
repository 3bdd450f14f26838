"""Cache keys: content hashes of chunks and hash chains over prompts (AdaCache section 3.1).

- chunk key: hash of the chunk's token ids, the model fingerprint and the system-prefix hash;
- hard key ``H_j = h(H_{j-1}, key(c_j))`` with ``H_0 = h(model, system prefix)``: KV of ``c_j``
  computed after exactly ``system + c_1..c_j``;
- independent key of ``c``: KV of ``c`` reusable anywhere with recomputation (computed alone after
  the system prefix at ingest, or taken from the first prompt that computed it). KV computed alone
  is also exactly the KV of the one-chunk prompt ``[c]``, so ingest stores it under that hard
  key as well;
- soft key of ``c_i``: ``h(effective prefix keys, key(c_i))`` where the effective prefix is the
  predecessor ``c_{i-1}`` plus, for chunks after it, the model's sink chunk (from its profile).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def digest(*parts: str | bytes) -> str:
    """A 32-hex-digit BLAKE2b digest of the parts (length-prefixed, so parts cannot merge)."""
    hasher = hashlib.blake2b(digest_size=16)
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        hasher.update(len(data).to_bytes(8, "little"))
        hasher.update(data)
    return hasher.hexdigest()


def token_digest(token_ids: Sequence[int]) -> str:
    """Digest of a token id sequence."""
    return digest(np.asarray(token_ids, dtype=np.int64).tobytes())


def system_key(model_fingerprint: str, system_ids: Sequence[int]) -> str:
    """``H_0``: the model and the system prefix."""
    return digest("system", model_fingerprint, token_digest(system_ids))


def chunk_key(root: str, chunk_ids: Sequence[int]) -> str:
    """Content key of a chunk under a system key (model fingerprint and system prefix)."""
    return digest("chunk", root, token_digest(chunk_ids))


def hard_key(previous: str, chunk: str) -> str:
    """``H_j = h(H_{j-1}, key(c_j))``."""
    return digest("hard", previous, chunk)


@dataclass(frozen=True)
class PromptKeys:
    """Every key of one prompt's chunks.

    Attributes:
        root: ``H_0``.
        chunks: ``key(c_i)`` per chunk.
        hard: ``H_i`` per chunk.
        soft: Soft key per chunk.
        independent: Independent key per chunk.
        alone: Hard key of the one-chunk prompt ``[c_i]`` per chunk.
    """

    root: str
    chunks: tuple[str, ...]
    hard: tuple[str, ...]
    soft: tuple[str, ...]
    independent: tuple[str, ...]
    alone: tuple[str, ...]


def prompt_keys(
    root: str, chunk_ids: Sequence[Sequence[int]], sink_chunk_idx: int | None
) -> PromptKeys:
    """Keys of every chunk of a prompt.

    Args:
        root: ``H_0`` (see :func:`system_key`).
        chunk_ids: Token ids of each chunk, in prompt order.
        sink_chunk_idx: 0-based index of the sink chunk that later chunks' effective prefix
            includes, or None when the model's profile shows no sink chunk.
    """
    chunks = tuple(chunk_key(root, ids) for ids in chunk_ids)
    hard: list[str] = []
    previous = root
    for key in chunks:
        previous = hard_key(previous, key)
        hard.append(previous)
    soft = []
    for idx, key in enumerate(chunks):
        prefix = [chunks[idx - 1] if idx > 0 else root]
        if sink_chunk_idx is not None and idx > sink_chunk_idx + 1:
            prefix.append(chunks[sink_chunk_idx])
        soft.append(digest("soft", root, *prefix, key))
    independent = tuple(digest("independent", root, key) for key in chunks)
    alone = tuple(hard_key(root, key) for key in chunks)
    return PromptKeys(root, chunks, tuple(hard), tuple(soft), independent, alone)


def fused_key(root: str, chunk: str) -> str:
    """Key of a chunk's fused KV (computed after its most similar chunks; FusionRAG)."""
    return digest("fused", root, chunk)


def fused_neighbour_key(root: str, chunk: str, neighbour: str) -> str:
    """A key a chunk's fused KV also answers to for each chunk it was computed after.

    A lookup tells from these which of a prompt's other chunks the fused entry has seen, without
    loading it (``experimental.fusion.min_neighbors_in_prompt``).
    """
    return digest("fused-after", root, chunk, neighbour)


def path_keys(root: str, chunks: Sequence[str], idx: int) -> tuple[str, ...]:
    """Alternative-path keys of chunk ``idx``: the runs ``c_j..c_idx`` for ``j < idx``.

    Longest run first (FusionRAG section 4.1's backtracking); the run of the chunk alone is the
    independent or fused entry's business, so it is not among them.
    """
    return tuple(digest("path", root, *chunks[start : idx + 1]) for start in range(idx))


def variant_key(root: str, prefix: Sequence[str], chunk: str) -> str:
    """Key of the KV of ``chunk`` computed after the chunks ``prefix`` (a Cache-Craft variant)."""
    return digest("variant", root, *prefix, "|", chunk)
