"""Chunk-KV caching: keys, tiers and storage."""

from __future__ import annotations

from adarag.cache.entry import ChunkKV

__all__ = ["ChunkKV"]
