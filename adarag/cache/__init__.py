"""Chunk-KV caching: keys, tiers and storage (the cached value, ChunkKV, is adarag.kv's)."""
